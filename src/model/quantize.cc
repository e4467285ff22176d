#include "model/quantize.h"

#include <filesystem>

#include "base/error.h"
#include "base/files.h"

namespace astrai::model {

namespace {

// The dtype a parameter is written in: its tensor_formats entry or the checkpoint's format for a
// matrix of whole blocks (q8_0 / q4_0 matrices with ragged rows stay f32), f32 for the rest.
// An error, before anything is written, for a k-quant matrix whose rows are not whole super-blocks.
DType target_dtype(const std::string& name, const Tensor& t, const std::string& format,
                   const std::map<std::string, std::string>& tensor_formats) {
  if (t.ndim() != 2) return DType::kF32;
  const auto it = tensor_formats.find(name);
  const std::string& f = it == tensor_formats.end() ? format : it->second;
  if (f == "f32") return DType::kF32;
  const DType block = ModelConfig::weight_format_dtype(f);
  const int64_t be = block_elems(block);
  if (t.dim(1) % be == 0) return block;
  // The k-quants have no fallback: found before anything is written.
  if (be == kQKBlock)
    fail("quantize: ", f, " needs matrices whose rows (input width) are whole super-blocks of ", be, ": \"", name,
         "\" is ", shape_str(t.shape()), "; use a format of blocks of 32 (q8_0, q4_0) for it");
  return DType::kF32;
}

}  // namespace

QuantizeReport save_quantized_checkpoint(const std::string& dir, ModelConfig config, const ModelWeights& weights,
                                         const std::string& format,
                                         const std::map<std::string, std::string>& tensor_formats) {
  const DType block = ModelConfig::weight_format_dtype(format);
  ASTRAI_CHECK(is_block_type(block), "quantize: give a weight format (supported: q8_0, q4_0, q4_k, q5_k, q6_k)");
  config.tensor_formats.clear();
  std::vector<DType> targets;
  for (const auto& p : weights.params(config)) {
    const Tensor& t = *p.tensor;
    ASTRAI_CHECK(t.defined(), dir, ": parameter \"", p.name, "\" is not set");
    targets.push_back(target_dtype(p.name, t, format, tensor_formats));
    const auto it = tensor_formats.find(p.name);
    if (it != tensor_formats.end() && t.ndim() == 2) config.tensor_formats[p.name] = it->second;
  }
  for (const auto& [name, f] : tensor_formats) {
    ASTRAI_CHECK(f == "f32" || is_block_type(ModelConfig::weight_format_dtype(f)), "quantize: unknown format \"", f,
                 "\" for ", name);
    bool known = false;
    for (const auto& p : weights.params(config)) known |= p.name == name;
    // lm_head.weight of a model with tied embeddings is the embedding: nothing of its own to write.
    if (!known && !(name == "lm_head.weight" && config.tie_word_embeddings))
      fail("quantize: this model has no matrix \"", name, "\"");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("cannot create directory ", dir, ": ", ec.message());
  QuantizeReport report;
  std::vector<std::pair<std::string, Tensor>> out;
  size_t i = 0;
  for (const auto& p : weights.params(config)) {
    const Tensor& t = *p.tensor;
    const DType to = targets[i++];
    out.emplace_back(p.name, t.dtype() == to ? t : t.to(to));
    (is_block_type(to) ? report.quantized : report.kept) += 1;
    report.bytes_in += t.nbytes();
    report.bytes_out += out.back().second.nbytes();
  }
  config.weight_format = format;
  write_safetensors(dir + "/model.safetensors", out, Json{{"format", "pt"}});
  write_file_atomic(dir + "/config.json", config.to_json().dump(2) + "\n");
  return report;
}

}  // namespace astrai::model
