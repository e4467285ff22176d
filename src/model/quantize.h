// Quantized checkpoints (`astrai quantize`, docs/quantization.md): every weight matrix whose
// rows are whole blocks (32 elements for Q8_0 and Q4_0, 256 for Q4_K, Q5_K and Q6_K) is stored as
// blocks, every vector (norms, biases) as f32; a matrix with ragged rows is kept as f32 for q8_0
// and q4_0, and written as q8_0 for q4_k, q5_k and q6_k (f32 if its rows are not whole blocks of
// 32 either; an error where a k-quant was asked for that matrix by name). config.json names the
// format (and each matrix in another one), so every command loads it.
#pragma once

#include <map>
#include <string>

#include "model/weights.h"

namespace astrai::model {

struct QuantizeReport {
  int64_t quantized = 0;   // matrices stored in the format
  int64_t kept = 0;        // tensors kept as f32 (vectors, ragged matrices)
  int64_t fallback = 0;    // of `quantized`: matrices the k-quant does not fit (rows not whole super-blocks), in q8_0
  size_t bytes_in = 0;     // the weights as they were held
  size_t bytes_out = 0;    // the weights as written
};

// Writes DIR/config.json (with "quantization_config") and DIR/model.safetensors (each
// atomically) holding `weights` in `format` ("q8_0", "q4_0", "q4_k", "q5_k" or "q6_k"). The source may be f32, bf16,
// f16, or already in the format (copied unchanged; another block type is dequantized first).
// tensor_formats: matrices stored in another format (a block format or "f32"), by parameter
// name (model.embed_tokens.weight, lm_head.weight, ...); recorded in config.json.
QuantizeReport save_quantized_checkpoint(const std::string& dir, ModelConfig config, const ModelWeights& weights,
                                         const std::string& format,
                                         const std::map<std::string, std::string>& tensor_formats = {});

}  // namespace astrai::model
