// `astrai lora merge --model DIR --lora ADAPTER --output DIR [--dtype f32|bf16|f16]`: writes a
// checkpoint with a PEFT LoRA adapter merged into the weights (model/lora.h), loadable by every
// command and by other tools; the model's tokenizer files are copied along.
#include <cstdio>
#include <filesystem>

#include "base/error.h"
#include "cli/command.h"
#include "model/lora.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace astrai::cli {
namespace {

struct MergeOptions {
  std::string model, lora, output, dtype = "f32";
};

void run_merge(const MergeOptions& o) {
  ASTRAI_CHECK(std::filesystem::weakly_canonical(o.model) != std::filesystem::weakly_canonical(o.output),
               "--output must not be the --model directory (its weights are read while the merge is written)");
  model::Checkpoint ck = model::load_checkpoint(o.model);
  const int merged = model::merge_lora(ck.config, &ck.weights, model::load_lora(o.lora), o.lora);
  const DType dtype = o.dtype == "bf16" ? DType::kBF16 : o.dtype == "f16" ? DType::kF16 : DType::kF32;
  model::save_checkpoint(o.output, ck.config, ck.weights, dtype);
  tokenizer::copy_tokenizer_files(o.model, o.output);
  std::printf("merged %d LoRA weights of %s into %s (%s)\n", merged, o.lora.c_str(), o.output.c_str(), o.dtype.c_str());
}

void setup_lora(CLI::App& app) {
  CLI::App* lora = app.add_subcommand("lora", "LoRA adapters (PEFT layout)");
  lora->require_subcommand(1);
  auto opts = std::make_shared<MergeOptions>();
  CLI::App* merge = lora->add_subcommand("merge", "Write a checkpoint with a LoRA adapter merged into the weights");
  merge->add_option("--model", opts->model, "base model directory (config.json + safetensors)")->required();
  merge->add_option("--lora", opts->lora, "adapter directory (adapter_config.json + adapter_model.safetensors)")
      ->required();
  merge->add_option("--output", opts->output, "directory of the merged checkpoint")->required();
  merge->add_option("--dtype", opts->dtype, "weight type of the written checkpoint")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  merge->callback([opts] { run_merge(*opts); });
}

const bool kRegistered = register_command(&setup_lora);

}  // namespace
}  // namespace astrai::cli
