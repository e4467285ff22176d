// Flags and loading shared by `astrai generate`, `chat` and `bench` (the inference commands).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "base/files.h"
#include "base/gguf_file.h"
#include "base/parallel.h"
#include "infer/engine.h"
#include "model/transformer.h"
#include "tokenizer/tokenizer.h"

namespace astrai::cli {

// --kv-dtype, into EngineOptions::kv_dtype (shared by generate, chat, serve and bench).
inline CLI::Option* add_kv_dtype_option(CLI::App* cmd, std::string* kv_dtype) {
  return cmd
      ->add_option("--kv-dtype", *kv_dtype,
                   "KV cache elements: auto (bf16 for a bf16 checkpoint, else f32), f32, or bf16 (half the memory; "
                   "K/V rounded to bf16)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
}

// --no-mmap (shared by generate, chat, serve and bench): copy the checkpoint into memory.
inline CLI::Option* add_no_mmap_flag(CLI::App* cmd, bool* no_mmap) {
  return cmd->add_flag("--no-mmap", *no_mmap,
                       "Copy the weights into memory (2 MiB huge pages) instead of memory-mapping the checkpoint: "
                       "faster batched decode, but a copy at load and the weights' size in private memory");
}

// --device (shared by generate, chat and serve): where the model runs.
inline CLI::Option* add_device_option(CLI::App* cmd, std::string* device) {
  return cmd
      ->add_option("--device", *device,
                   "Where the model runs: cpu, or cuda (the first NVIDIA GPU; needs a build with the CUDA backend, "
                   "libastrai_cuda.so beside the binary)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

// --sample-on (shared by generate, chat, serve and bench): where tokens are drawn.
inline CLI::Option* add_sample_on_option(CLI::App* cmd, std::string* sample_on) {
  return cmd
      ->add_option("--sample-on", *sample_on,
                   "Where tokens are drawn: host, device (next to the logits: only tokens and logprobs leave it; "
                   "with --device cuda not yet run on a GPU) or auto (the host for now); the same tokens either way. "
                   "Rows with logit bias, penalties or prompt logprobs are always sampled on the host")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "host", "device"}));
}

// --lora DIR (generate, chat, bench, serve, score): a PEFT LoRA adapter merged at load.
inline CLI::Option* add_lora_option(CLI::App* cmd, std::string* dir) {
  return cmd->add_option("--lora", *dir,
                         "LoRA adapter directory (PEFT layout: adapter_config.json + adapter_model.safetensors), "
                         "merged into the weights at load");
}

inline Device parse_device(const std::string& name) { return name == "cuda" ? Device::kCuda : Device::kCpu; }

inline model::WeightPlacement weight_placement(bool no_mmap) {
  return no_mmap ? model::WeightPlacement::kMemory : model::WeightPlacement::kMapped;
}

struct EngineFlags {
  int max_running = 64;
  int max_step_tokens = 2048;
  int page_size = 16;
  double kv_cache_mb = 1024;
  std::string kv_dtype = "auto";
  bool no_prefix_cache = false;
  int max_context = 0;
  int threads = 0;
  bool no_mmap = false;
  std::string device = "cpu";
  std::string sample_on = "auto";
  std::string lora;

  void add(CLI::App* cmd) {
    cmd->add_option("--max-running", max_running, "Cap on requests decoding together");
    cmd->add_option("--max-step-tokens", max_step_tokens, "Token budget of one step (chunked prefill)");
    cmd->add_option("--page-size", page_size, "KV cache page size in tokens");
    cmd->add_option("--kv-cache-mb", kv_cache_mb, "KV cache budget in MiB");
    add_kv_dtype_option(cmd, &kv_dtype);
    cmd->add_flag("--no-prefix-cache", no_prefix_cache, "Disable the shared prefix cache");
    cmd->add_option("--max-context", max_context, "Context length (default: the model's)");
    cmd->add_option("--threads", threads, "Threads (default: all cores)");
    add_no_mmap_flag(cmd, &no_mmap);
    add_device_option(cmd, &device);
    add_sample_on_option(cmd, &sample_on);
    add_lora_option(cmd, &lora);
  }
  infer::EngineOptions options() const {
    infer::EngineOptions o;
    o.max_running = max_running;
    o.max_step_tokens = max_step_tokens;
    o.page_size = page_size;
    o.kv_cache_bytes = static_cast<int64_t>(kv_cache_mb * 1024 * 1024);
    o.kv_dtype = kv_dtype;
    o.prefix_cache = !no_prefix_cache;
    o.max_context = max_context;
    o.sample_on = sample_on;
    return o;
  }
};

// Whether --model names a tokenizer too: a directory with tokenizer.json, or a GGUF file (its metadata).
inline bool model_has_tokenizer(const std::string& model) {
  return file_exists(model + "/tokenizer.json") || is_gguf_file(model);
}

// Loads DIR's model (a checkpoint directory or a GGUF file) and, when model_has_tokenizer(DIR), its
// tokenizer (else null: token ids only).
inline std::unique_ptr<infer::Engine> load_engine(const std::string& dir, const EngineFlags& flags) {
  if (flags.threads > 0) set_num_threads(flags.threads);
  auto model =
      std::make_shared<const model::Transformer>(model::Transformer::load(dir, weight_placement(flags.no_mmap),
                                                                          parse_device(flags.device), flags.lora));
  std::shared_ptr<const tokenizer::Tokenizer> tok;
  if (model_has_tokenizer(dir))
    tok = std::make_shared<const tokenizer::Tokenizer>(tokenizer::Tokenizer::load(dir));
  return std::make_unique<infer::Engine>(model, tok, flags.options());
}

}  // namespace astrai::cli
