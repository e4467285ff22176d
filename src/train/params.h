// Parameters as plain structs of pointers over one allocation (the llm.c layout): every
// tensor of the model, in HF names and [out, in] shapes, lives at a fixed offset of one f32
// buffer. Gradients and the optimizer moments use the same layout, so a whole-model
// operation (zeroing, all-reduce, AdamW, clipping) is one loop over one array.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"
#include "model/config.h"

namespace astrai::train {

struct ParamSpec {
  std::string name;  // HF safetensors name, e.g. "model.layers.0.self_attn.q_proj.weight"
  Shape shape;
  size_t offset = 0;   // in floats, into the buffer
  size_t numel = 0;
  bool is_matrix = false;  // 2-D projection weights (decayed by default)
  bool is_embedding = false;
};

// Names, shapes and offsets of every parameter of a model::ModelConfig, in a fixed order
// (the names and shapes of model::ModelWeights).
class ParamLayout {
 public:
  explicit ParamLayout(const model::ModelConfig& config);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  size_t total() const { return total_; }
  const ParamSpec* find(const std::string& name) const;

 private:
  size_t add(const std::string& name, Shape shape, bool matrix, bool embedding = false);
  std::vector<ParamSpec> specs_;
  std::map<std::string, size_t> index_;
  size_t total_ = 0;
  friend struct ParamOffsets;
};

// One 64-byte aligned, zero-initialised f32 array (shared so Tensor views can keep it alive).
class FloatBuffer {
 public:
  FloatBuffer() = default;
  explicit FloatBuffer(size_t n);
  float* data() const { return data_.get(); }
  size_t size() const { return size_; }
  const std::shared_ptr<float>& shared() const { return data_; }

 private:
  std::shared_ptr<float> data_;
  size_t size_ = 0;
};

// Pointers to each tensor of one layer / the model inside a buffer; null when the config
// lacks that tensor (biases, qk-norm, gate, MLA or GQA projections, untied lm_head).
struct LayerTensors {
  float* input_norm = nullptr;
  float *wq = nullptr, *bq = nullptr, *wk = nullptr, *bk = nullptr, *wv = nullptr, *bv = nullptr;
  float *q_norm = nullptr, *k_norm = nullptr, *wgate_attn = nullptr;
  float *w_kv_a = nullptr, *kv_norm = nullptr, *w_kv_b = nullptr;  // MLA
  float *wo = nullptr, *bo = nullptr;
  float* post_norm = nullptr;
  float *w_gate = nullptr, *w_up = nullptr, *w_down = nullptr;
  float *b_gate = nullptr, *b_up = nullptr, *b_down = nullptr;  // mlp_bias
};

struct ModelTensors {
  float* embed = nullptr;
  std::vector<LayerTensors> layers;
  float* final_norm = nullptr;
  float* lm_head = nullptr;  // == embed when tied
};

ModelTensors bind_tensors(const model::ModelConfig& config, const ParamLayout& layout, float* base);

// Tensor views (sharing the buffer's ownership) named as in HF safetensors, for saving
// and for building an inference Transformer over the live trained weights.
std::map<std::string, Tensor> tensor_views(const ParamLayout& layout, const FloatBuffer& buffer);

}  // namespace astrai::train
