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

#include "backend/ops.h"
#include "tensor/tensor.h"
#include "model/config.h"
#include "model/param_schema.h"

namespace astrai::train {

struct ParamSpec {
  std::string name;  // HF safetensors name, e.g. "model.layers.0.self_attn.q_proj.weight"
  Shape shape;
  model::ParamKind kind = model::ParamKind::kMatrix;  // kMatrix: projections (decayed by default)
  size_t offset = 0;   // in floats, into the buffer
  size_t numel = 0;
};

// Offsets of every parameter of a model::ModelConfig in one flat buffer, in the schema's order
// (model/param_schema.h: the names, shapes and kinds of model::ModelWeights).
class ParamLayout {
 public:
  explicit ParamLayout(const model::ModelConfig& config);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  size_t total() const { return total_; }

 private:
  std::vector<ParamSpec> specs_;
  size_t total_ = 0;
  friend struct ParamOffsets;
};

// One 64-byte aligned, zero-initialised f32 array in a backend's memory (host memory by
// default), shared so Tensor views can keep it alive.
class FloatBuffer {
 public:
  FloatBuffer() = default;
  explicit FloatBuffer(size_t n, const backend::Ops& ops = backend::cpu_ops());
  float* data() const { return data_.get(); }
  size_t size() const { return size_; }
  Device device() const { return ops_->device(); }
  const backend::Ops& ops() const { return *ops_; }
  const std::shared_ptr<float>& shared() const { return data_; }

 private:
  std::shared_ptr<float> data_;
  size_t size_ = 0;
  const backend::Ops* ops_ = &backend::cpu_ops();
};

// The buffer itself when it is in host memory, else a host copy of it.
FloatBuffer on_host(const FloatBuffer& buffer);

// Pointers to each parameter inside a buffer (model/param_schema.h's slots, as float*); null
// where the config lacks that parameter; lm_head == embed_tokens when tied.
using LayerTensors = model::LayerParams<float*>;
using ModelTensors = model::ModelParams<float*>;

ModelTensors bind_tensors(const model::ModelConfig& config, const ParamLayout& layout, float* base);

// Tensor views (sharing the buffer's ownership) named as in HF safetensors, for saving
// and for building an inference Transformer over the live trained weights.
std::map<std::string, Tensor> tensor_views(const ParamLayout& layout, const FloatBuffer& buffer);
// One f32 tensor of `shape` at `offset` floats into the buffer (keeps it alive); without them,
// the whole buffer as one 1-D tensor.
Tensor buffer_view(const FloatBuffer& buffer, size_t offset, const Shape& shape);
Tensor buffer_view(const FloatBuffer& buffer);

}  // namespace astrai::train
