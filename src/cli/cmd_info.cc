// `astrai info`: this CPU and the kernels' level in use; with --model, what a checkpoint is and
// what it costs in memory.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include "base/error.h"
#include "base/json.h"
#include "cli/command.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/gemm_mode.h"
#include "model/transformer.h"

namespace astrai::cli {

namespace {

struct InfoOptions {
  std::string model;
  bool json = false;
};

// Resident set of this process in bytes (Linux), -1 if unknown.
int64_t resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      int64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return -1;
}

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", bytes, units[u]);
  return buf;
}

std::string joined(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : " ") + i;
  return s;
}

Json cpu_json() {
  const kernels::CpuInfo& cpu = kernels::cpu_info();
  Json j;
  j["model"] = cpu.model;
  j["arch"] = cpu.arch;
  j["features"] = cpu.features;
  std::vector<std::string> levels, built;
  for (kernels::Isa isa : cpu.supported) levels.emplace_back(kernels::isa_name(isa));
  for (kernels::Isa isa : kernels::compiled_isas()) built.emplace_back(kernels::isa_name(isa));
  j["levels_supported"] = levels;
  j["levels_built"] = built;
  j["level"] = std::string(kernels::isa_name(kernels::active_isa()));
  j["blas_core"] = kernels::blas_core();
  j["activations"] = kernels::activations_name(kernels::activations());
  j["vnni"] = kernels::vnni_in_use();
  j["bf16_dot"] = kernels::bf16_dot_name();
  return j;
}

void print_cpu() {
  const Json j = cpu_json();
  std::printf("cpu:          %s (%s)\n", j["model"].get<std::string>().empty() ? "unknown model" : j["model"].get<std::string>().c_str(),
              j["arch"].get<std::string>().c_str());
  std::printf("features:     %s\n", joined(j["features"].get<std::vector<std::string>>()).c_str());
  std::printf("levels:       %s (built: %s)\n", joined(j["levels_supported"].get<std::vector<std::string>>()).c_str(),
              joined(j["levels_built"].get<std::vector<std::string>>()).c_str());
  std::printf("kernels:      %s\n", j["level"].get<std::string>().c_str());
  std::printf("blas:         OpenBLAS, %s kernels\n", j["blas_core"].get<std::string>().c_str());
  std::printf("activations:  %s (what quantized weights multiply; --activations)\n",
              j["activations"].get<std::string>().c_str());
  const std::string vnni = j["vnni"];
  std::printf("vnni:         %s\n", vnni.empty() ? "not used (the CPU or level lacks it, or ASTRAI_CPU_VNNI=0)"
                                                  : (vnni + " (8-bit dot products; ASTRAI_CPU_VNNI=0 turns it off)").c_str());
  const std::string bf16 = j["bf16_dot"];
  std::printf("bf16 dot:     %s\n", bf16 == "off" ? "off (bf16 weights widened exactly; --bf16-dot)"
                                  : bf16 == "vdpbf16ps" ? "on, VDPBF16PS (bf16 weights times bf16-rounded activations)"
                                                        : "on, emulated (this CPU or level has no AVX512_BF16: slower than off)");
}

void run_info(const InfoOptions& o) {
  if (o.model.empty()) {
    if (o.json) {
      Json j;
      j["cpu"] = cpu_json();
      std::cout << j.dump(2) << "\n";
    } else {
      print_cpu();
    }
    return;
  }
  const model::Transformer m = model::Transformer::load(o.model);
  const model::ModelConfig& c = m.config();
  std::map<std::string, int64_t> dtype_params;
  for (const auto& p : m.weights().params(c)) dtype_params[std::string(dtype_name(p.tensor->dtype()))] += p.tensor->numel();
  const int64_t rss = resident_bytes();
  if (o.json) {
    Json j;
    j["config"] = c.to_json();
    j["summary"] = c.summary();
    j["parameters"] = m.num_parameters();
    j["weight_bytes"] = m.weight_bytes();
    j["mapped_bytes"] = m.mapped_bytes();
    j["dtypes"] = dtype_params;
    j["kv_bytes_per_token"] = m.kv_bytes_per_token();
    j["kv_bytes_per_token_bf16"] = m.kv_bytes_per_token(DType::kBF16);
    j["resident_bytes"] = rss;
    j["cpu"] = cpu_json();
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::printf("model:        %s\n", o.model.c_str());
  std::printf("architecture: %s\n", c.summary().c_str());
  std::printf("parameters:   %lld (%.1f M)\n", static_cast<long long>(m.num_parameters()), m.num_parameters() / 1e6);
  std::printf("dtypes:      ");
  for (const auto& [name, n] : dtype_params) std::printf(" %s %lld params", name.c_str(), static_cast<long long>(n));
  std::printf("\n");
  std::printf("weights:      %s (%s memory-mapped, shared with the page cache)\n",
              human(static_cast<double>(m.weight_bytes())).c_str(), human(static_cast<double>(m.mapped_bytes())).c_str());
  std::printf("KV cache:     %s per token with f32 elements, %s with bf16 (all layers)\n",
              human(static_cast<double>(m.kv_bytes_per_token())).c_str(),
              human(static_cast<double>(m.kv_bytes_per_token(DType::kBF16))).c_str());
  std::printf("context:      %lld positions%s\n", static_cast<long long>(c.context_length()),
              c.context_length() > c.max_position_embeddings ? " (YaRN: original context x factor)" : "");
  if (rss >= 0) std::printf("resident:     %s after loading (mapped pages are read on first use)\n", human(rss).c_str());
  print_cpu();
}

void setup_info(CLI::App& app) {
  auto opts = std::make_shared<InfoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "info", "This CPU's features and the kernels' level in use; with --model, a model's architecture, parameters and memory");
  cmd->add_option("--model", opts->model, "Model directory (config.json + safetensors) or GGUF file");
  cmd->add_flag("--json", opts->json, "Machine-readable output");
  cmd->callback([opts] { run_info(*opts); });
}

const bool kRegistered = register_command(&setup_info);

}  // namespace

}  // namespace astrai::cli
