// The `astrai` binary: dispatches to the subcommands that registered themselves.
#include <cstdio>
#include <exception>
#include <string>

#include "base/error.h"
#include "cli/command.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/gemm_mode.h"

namespace astrai::cli {

namespace {
std::vector<CommandSetup>& registry() {
  static std::vector<CommandSetup> commands;
  return commands;
}
}  // namespace

bool register_command(CommandSetup setup) {
  registry().push_back(setup);
  return true;
}

const std::vector<CommandSetup>& registered_commands() { return registry(); }

}  // namespace astrai::cli

int main(int argc, char** argv) {
  astrai::kernels::reexec_for_blas_core(argv);
  CLI::App app{"astrai: train and serve decoder-only language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "astrai 0.1.0");
  // Accepted before or after the subcommand's name (fallthrough); applied before it runs.
  std::string cpu_isa;
  app.add_option("--cpu-isa", cpu_isa,
                 "CPU kernels' instruction-set level: auto (the best this CPU runs), generic, v3 (AVX2+FMA), v4 "
                 "(AVX-512) or neon; default: ASTRAI_CPU_ISA, else auto. Every level gives the same results.")
      ->check(CLI::IsMember({"auto", "generic", "v3", "v4", "neon"}));
  std::string activations;
  app.add_option("--activations", activations,
                 "What quantized weights (Q8_0, Q4_0, Q4_K, Q6_K) multiply: f32 (the activations as they are, each "
                 "weight widened exactly) or q8 (the activations rounded to 8 bits per block, integer dot products, "
                 "as llama.cpp does; faster on x86-64); default: ASTRAI_ACTIVATIONS, else q8 on x86-64 and f32 on AArch64. "
                 "Other weights are unaffected.")
      ->check(CLI::IsMember({"f32", "q8"}));
  bool bf16_dot = false;
  app.add_flag("--bf16-dot", bf16_dot,
               "CPU inference: bf16 weights multiply the activations rounded to bf16, two exact products per f32 lane "
               "(AVX512_BF16's VDPBF16PS, as llama.cpp computes; about twice the prefill product rate on CPUs with it, "
               "emulated and slower elsewhere); default: ASTRAI_BF16_DOT=1, else off (bf16 weights widened exactly, "
               "the f32 activations as they are). Same bits on every level either way. Training ignores it.");
  app.fallthrough();
  app.parse_complete_callback([&cpu_isa, &activations, &bf16_dot] {
    if (bf16_dot) astrai::kernels::set_bf16_dot(true);  // first: select_isa's log names the mode
    if (!cpu_isa.empty()) astrai::kernels::select_isa(cpu_isa);
    if (!activations.empty()) astrai::kernels::set_activations(astrai::kernels::parse_activations(activations.c_str()));
    // Read the environment's modes now, so a bad ASTRAI_ACTIVATIONS / ASTRAI_BF16_DOT stops the
    // command before it loads a model or starts serving, not at its first forward.
    (void)astrai::kernels::activations();
    (void)astrai::kernels::bf16_dot();
  });
  for (auto setup : astrai::cli::registered_commands()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const astrai::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
