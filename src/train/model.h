// The training model: owned f32 master parameters and gradients (one allocation each, see
// params.h), a forward that saves the activations the backward needs, and the backward. The
// layers are model/layer.h's, the same code the inference forward runs (so the training
// forward has its bits), over the backend's operations; this class owns the buffers, the
// embedding, the final norm and the LM head, and RoPE tables per packed document (dynamic NTK
// scaling rescales per document, as the inference forward does per sequence).
// With `recompute`, only each layer's input is kept and the rest is recomputed in the
// backward (one layer's activations live at a time).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "model/config.h"
#include "model/layer.h"
#include "train/params.h"
#include "train/train_batch.h"

namespace astrai::train {

class TrainModel {
 public:
  // trainable = false: a frozen model (reference policies) with no gradient buffer; forward
  // only.
  explicit TrainModel(const model::ModelConfig& config, bool recompute = false, bool trainable = true);
  TrainModel(const TrainModel&) = delete;
  TrainModel& operator=(const TrainModel&) = delete;

  const model::ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  FloatBuffer& params() { return params_; }
  const FloatBuffer& params() const { return params_; }
  FloatBuffer& grads() { return grads_; }
  const FloatBuffer& grads() const { return grads_; }
  size_t num_params() const;  // distinct parameters (tied lm_head counted once)

  // GPT-2 style init: matrices and embeddings ~ N(0, std) from a seeded generator, norm
  // weights 1, biases 0. Deterministic for a seed.
  void init_weights(uint64_t seed, float std = 0.02f);
  // Copies named tensors (any dtype, HF names) into the parameters; every parameter must be
  // present with its exact shape.
  void load_weights(const std::map<std::string, Tensor>& tensors, const std::string& where);
  // A frozen copy (for DPO/GRPO reference policies): same config, parameters copied, no grads used.
  void copy_parameters_from(const TrainModel& other);

  // Runs the forward and returns logits [num_tokens, vocab], valid until the next forward.
  float* forward(const TrainBatch& batch);
  // Accumulates d(loss)/d(params) into grads() given dlogits (may be the logits buffer).
  void backward(const TrainBatch& batch, float* dlogits);
  void zero_grads();

 private:
  void ensure_buffers(int64_t tokens);
  // RoPE tables and attention sequences of a batch.
  void prepare(const TrainBatch& batch);
  model::LayerInput layer_input(const TrainBatch& batch) const;
  // Points layer l's output at the next layer's input (or x_final_).
  model::LayerActs& acts_of(int64_t l);

  // The parameters, gradients and activations are host buffers (FloatBuffer).
  const backend::Ops& ops_ = backend::ops_for(Device::kCpu);
  model::ModelConfig cfg_;
  bool recompute_;
  bool trainable_;
  ParamLayout layout_;
  FloatBuffer params_, grads_;
  ModelTensors p_, g_;
  model::ModelParams<backend::Weight> view_;  // p_ as the backend reads it
  std::vector<double> inv_freq_;  // static scaling: computed once; dynamic: per document
  std::vector<float> rope_cos_, rope_sin_;  // per token [tokens, rope_dim / 2]
  std::vector<backend::SeqRange> seqs_;     // the batch's documents
  model::ForwardProfile profile_;           // off: the layers' clock marks cost nothing

  int64_t capacity_ = 0;  // tokens the activation buffers hold
  FloatBuffer acts_, scratch_;
  std::vector<model::LayerActs> layer_acts_;
  float *x_final_ = nullptr, *xf_ = nullptr, *rstd_f_ = nullptr, *logits_ = nullptr;
  float *kvb_ = nullptr;  // MLA: kv_b_proj output in the forward, its gradient in the backward
  float* d_res_ = nullptr;
  model::LayerGradScratch grad_scratch_;
};

}  // namespace astrai::train
