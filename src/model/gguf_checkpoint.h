// A GGUF file (llama.cpp's format, base/gguf_file.h) as a checkpoint: the architecture from the
// metadata, the tensors renamed to the Hugging Face names the parameter schema uses, read in place
// from the mapping. Supported: general.architecture llama (also Mistral's files), qwen2 and qwen3;
// tensors F32, F16, BF16, Q8_0, Q4_0, Q4_K and Q6_K (docs/quantization.md). llama.cpp's converter permutes the
// rows of q and k (and their biases) of "llama" models for its adjacent-pair RoPE; those are
// un-permuted into memory at load, so the model computes exactly what the Hugging Face checkpoint does.
// RoPE frequency factors (rope_freqs.weight: llama3 scaling as the converter writes it) divide each
// pair's frequency, as llama.cpp does. Anything else (other architectures, tensor types, YaRN,
// partial RoPE) is an astrai::Error naming it.
#pragma once

#include <string>

#include "base/gguf_file.h"
#include "model/weights.h"

namespace astrai::model {

// The Hugging Face config.json that describes the GGUF's model (what ModelConfig::from_json reads).
Json gguf_hf_config(const GgufFile& g);

// The model of a GGUF file: config, and weights mapped in place (q/k of llama models in memory).
Checkpoint load_gguf_checkpoint(const std::string& path, WeightPlacement placement);

// The GGML type name of a type id ("Q6_K", "IQ2_XS", ...; "type N" when unknown).
std::string ggml_type_name(uint32_t type);

}  // namespace astrai::model
