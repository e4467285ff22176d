#include "model/quantize.h"

#include <filesystem>

#include "base/error.h"
#include "base/files.h"

namespace astrai::model {

namespace {

// The format a parameter is written in: its tensor_formats entry or the checkpoint's format for a
// matrix of whole blocks, "f32" for the rest (vectors; q8_0 / q4_0 matrices with ragged rows).
// A matrix the checkpoint's k-quant does not fit (rows that are not whole super-blocks of 256)
// falls back to q8_0, as llama-quantize falls back to a 32-block type (it picks Q5_0 for Q4_K,
// Q5_1 for Q5_K, Q8_0 for Q6_K; q8_0 is the one of ours at least as accurate as each). A k-quant
// asked for by name for such a matrix is an error, found before anything is written.
std::string target_format(const std::string& name, const Tensor& t, const std::string& format,
                          const std::map<std::string, std::string>& tensor_formats) {
  if (t.ndim() != 2) return "f32";
  const auto it = tensor_formats.find(name);
  const std::string& f = it == tensor_formats.end() ? format : it->second;
  if (f == "f32") return f;
  const int64_t be = block_elems(ModelConfig::weight_format_dtype(f));
  if (t.dim(1) % be == 0) return f;
  if (be == kQKBlock && it != tensor_formats.end())
    fail("quantize: ", f, " needs matrices whose rows (input width) are whole super-blocks of ", be, ": \"", name,
         "\" is ", shape_str(t.shape()), "; use a format of blocks of 32 (q8_0, q4_0) for it");
  if (be == kQKBlock && t.dim(1) % kQBlock == 0) return "q8_0";
  return "f32";
}

}  // namespace

QuantizeReport save_quantized_checkpoint(const std::string& dir, ModelConfig config, const ModelWeights& weights,
                                         const std::string& format,
                                         const std::map<std::string, std::string>& tensor_formats) {
  const DType block = ModelConfig::weight_format_dtype(format);
  ASTRAI_CHECK(is_block_type(block), "quantize: give a weight format (supported: q8_0, q4_0, q4_k, q5_k, q6_k)");
  config.tensor_formats.clear();
  std::vector<DType> targets;
  QuantizeReport report;
  for (const auto& p : weights.params(config)) {
    const Tensor& t = *p.tensor;
    ASTRAI_CHECK(t.defined(), dir, ": parameter \"", p.name, "\" is not set");
    const std::string f = target_format(p.name, t, format, tensor_formats);
    targets.push_back(f == "f32" ? DType::kF32 : ModelConfig::weight_format_dtype(f));
    const auto it = tensor_formats.find(p.name);
    if (it != tensor_formats.end() && t.ndim() == 2) {
      config.tensor_formats[p.name] = it->second;
    } else if (t.ndim() == 2 && is_k_quant(ModelConfig::weight_format_dtype(format)) && f != format) {
      config.tensor_formats[p.name] = f;  // the fallback, recorded
      if (f == "q8_0") ++report.fallback;
    }
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
