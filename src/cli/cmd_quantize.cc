// `astrai quantize --model DIR --type q8_0|q4_0|q4_k|q5_k|q6_k [--embedding-type FMT] --output DIR`: writes a checkpoint whose
// weight matrices are quantized (model/quantize.h, docs/quantization.md), loadable by every inference
// command; the model's tokenizer files are copied along.
#include <cstdio>
#include <filesystem>
#include <map>

#include "base/error.h"
#include "cli/command.h"
#include "model/quantize.h"
#include "tokenizer/tokenizer.h"

namespace astrai::cli {
namespace {

struct QuantizeOptions {
  std::string model, output, type = "q8_0", embedding_type;
};

void run_quantize(const QuantizeOptions& o) {
  ASTRAI_CHECK(std::filesystem::weakly_canonical(o.model) != std::filesystem::weakly_canonical(o.output),
               "--output must not be the --model directory (its weights are read while the new ones are written)");
  const model::Checkpoint ck = model::load_checkpoint(o.model);
  std::map<std::string, std::string> tensor_formats;
  if (!o.embedding_type.empty() && o.embedding_type != o.type) {
    tensor_formats["model.embed_tokens.weight"] = o.embedding_type;
    if (!ck.config.tie_word_embeddings) tensor_formats["lm_head.weight"] = o.embedding_type;
  }
  const model::QuantizeReport r =
      model::save_quantized_checkpoint(o.output, ck.config, ck.weights, o.type, tensor_formats);
  tokenizer::copy_tokenizer_files(o.model, o.output);
  const std::string emb = tensor_formats.empty() ? "" : " (the embedding and output matrices " + o.embedding_type + ")";
  const std::string fallback =
      r.fallback == 0 ? ""
                      : " (" + std::to_string(r.fallback) + " of them to q8_0: their rows are not whole super-blocks of 256)";
  std::printf("quantized %lld matrices to %s%s%s, kept %lld tensors as f32: %.1f MiB -> %.1f MiB, written to %s\n",
              static_cast<long long>(r.quantized), o.type.c_str(), emb.c_str(), fallback.c_str(), static_cast<long long>(r.kept),
              static_cast<double>(r.bytes_in) / (1 << 20), static_cast<double>(r.bytes_out) / (1 << 20),
              o.output.c_str());
}

void setup_quantize(CLI::App& app) {
  auto opts = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "quantize", "Write a checkpoint with quantized weight matrices (q8_0: blocks of 32 int8 and an f16 scale; q4_0: of 32 "
      "4-bit quants and an f16 scale; q4_k: llama.cpp's Q4_K, super-blocks of 256 4-bit quants with 6-bit scales and mins "
      "per 32; q5_k: llama.cpp's Q5_K, the same with 5-bit quants; q6_k: llama.cpp's Q6_K, super-blocks of 256 6-bit "
      "quants with int8 scales per 16; with q4_k, q5_k and q6_k, matrices whose input width is not a multiple of 256 are written as q8_0)");
  cmd->add_option("--model", opts->model, "model directory (config.json + safetensors; f32/bf16/f16, or quantized) or GGUF file (its vocabulary is written as tokenizer.json)")->required();
  cmd->add_option("--output", opts->output, "directory of the quantized checkpoint")->required();
  cmd->add_option("--type", opts->type, "weight format: q8_0 (8.5 bits per weight), q4_0 (4.5), q4_k (4.5), q5_k (5.5), q6_k (6.5625)")
      ->check(CLI::IsMember({"q8_0", "q4_0", "q4_k", "q5_k", "q6_k"}))
      ->capture_default_str();
  cmd->add_option("--embedding-type", opts->embedding_type,
                  "format of the token embedding and the output matrix (lm_head; the same matrix when tied): "
                  "q8_0, q4_0, q4_k, q5_k, q6_k or f32; default: --type. A wider one costs little (one matrix) and removes "
                  "most of the 4-bit formats' loss on small models (docs/quantization.md, Quality)")
      ->check(CLI::IsMember({"q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "f32"}));
  cmd->callback([opts] { run_quantize(*opts); });
}

const bool kRegistered = register_command(&setup_quantize);

}  // namespace
}  // namespace astrai::cli
