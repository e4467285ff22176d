// The parameters of a model as plain structs of Tensors, named as Hugging Face names them.
// A tensor is either memory-mapped from a checkpoint (read-only, f32/bf16/f16) or owned host
// memory (the trainer's f32 parameters, or a checkpoint copied with WeightPlacement::kMemory);
// the forward pass reads both.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/param_schema.h"
#include "model/safetensors.h"
#include "tensor/tensor.h"

namespace astrai::model {

// The parameter slots as Tensors (model/param_schema.h); undefined tensors are parameters the
// config does not have (e.g. biases of Llama).
using LayerWeights = LayerParams<Tensor>;

struct ModelWeights : ModelParams<Tensor> {
  // One entry per parameter of `config`, in checkpoint order: Hugging Face name, expected
  // shape, and the slot that holds it. A tied lm_head is not listed (it is embed_tokens).
  struct Param {
    std::string name;
    Shape shape;
    Tensor* tensor;
  };
  std::vector<Param> params(const ModelConfig& config);
  struct ConstParam {
    std::string name;
    Shape shape;
    const Tensor* tensor;
  };
  std::vector<ConstParam> params(const ModelConfig& config) const;

  // Takes the tensors a checkpoint holds, by name. Checks every tensor is present, has
  // the expected shape and a float dtype (F32/BF16/F16); errors name `where` and the tensor.
  // autoregressive_lm also accepts the reference AstrAI names ("layers.N.attention.q_proj.weight").
  static ModelWeights from_tensors(const ModelConfig& config, const TensorMap& tensors, const std::string& where);

  // Owned, zero-filled tensors of every parameter (for the trainer, or tests to fill), all in
  // one block: huge pages once it is 4 MiB or more (tensor/tensor.h), small matrices included.
  static ModelWeights allocate(const ModelConfig& config, DType dtype = DType::kF32);
  // A copy of every parameter, same dtypes, in one owned block like allocate()'s (a tied
  // lm_head stays shared with embed_tokens).
  ModelWeights copy_to_memory(const ModelConfig& config) const;

  int64_t num_parameters(const ModelConfig& config) const;
  size_t bytes(const ModelConfig& config) const;  // storage of the parameters as held
};

// Where a loaded checkpoint's weights live.
//   kMapped: memory-mapped from the safetensors files (no copy; the pages are the page
//     cache's, 4 KiB each).
//   kMemory: copied into one owned block of 2 MiB huge pages (`--no-mmap`): a copy at load
//     and the weights' size in private memory, for faster decode, which streams every weight
//     each step (fewer TLB misses; the hardware prefetchers stop at every 4 KiB page edge).
enum class WeightPlacement { kMapped, kMemory };

// Loads DIR/config.json and its safetensors weights, or a GGUF file (model/gguf_checkpoint.h).
struct Checkpoint {
  ModelConfig config;
  ModelWeights weights;
  size_t mapped_bytes = 0;  // 0 for kMemory
};
Checkpoint load_checkpoint(const std::string& dir, WeightPlacement placement = WeightPlacement::kMapped);

// Writes DIR/config.json and DIR/model.safetensors (each atomically), converting tensors to
// `dtype` (kF32 keeps them as they are when already f32; Q8_0 ones are dequantized, and the
// config written names no quantization). Creates DIR if needed.
void save_checkpoint(const std::string& dir, const ModelConfig& config, const ModelWeights& weights,
                     DType dtype = DType::kF32);

}  // namespace astrai::model
