#include "model/quantize.h"

#include <filesystem>

#include "base/error.h"
#include "base/files.h"

namespace astrai::model {

QuantizeReport save_quantized_checkpoint(const std::string& dir, ModelConfig config, const ModelWeights& weights,
                                         const std::string& format) {
  const DType block = ModelConfig::weight_format_dtype(format);
  ASTRAI_CHECK(is_block_type(block), "quantize: give a weight format (supported: q8_0, q4_0, q4_k, q6_k)");
  const int64_t be = block_elems(block);
  // Q4_K and Q6_K have no fallback: a matrix whose rows are not whole super-blocks is an error (a
  // checkpoint holds one block format; docs/quantization.md), found before anything is written.
  for (const auto& p : weights.params(config)) {
    const Tensor& t = *p.tensor;
    if (be == kQKBlock && t.defined() && t.ndim() == 2 && t.dim(1) % be != 0)
      fail("quantize: ", format, " needs matrices whose rows (input width) are whole super-blocks of ", be, ": \"", p.name,
           "\" is ", shape_str(t.shape()), "; use --type q4_0 (blocks of 32) or q8_0 for this model");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("cannot create directory ", dir, ": ", ec.message());
  QuantizeReport report;
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& p : weights.params(config)) {
    const Tensor& t = *p.tensor;
    ASTRAI_CHECK(t.defined(), dir, ": parameter \"", p.name, "\" is not set");
    const bool blocks = t.ndim() == 2 && t.dim(1) % be == 0;
    const DType to = blocks ? block : DType::kF32;
    out.emplace_back(p.name, t.dtype() == to ? t : t.to(to));
    (blocks ? report.quantized : report.kept) += 1;
    report.bytes_in += t.nbytes();
    report.bytes_out += out.back().second.nbytes();
  }
  config.weight_format = format;
  write_safetensors(dir + "/model.safetensors", out, Json{{"format", "pt"}});
  write_file_atomic(dir + "/config.json", config.to_json().dump(2) + "\n");
  return report;
}

}  // namespace astrai::model
