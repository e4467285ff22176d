// The training model: owned f32 master parameters and gradients (one allocation each, see
// params.h), a forward that saves the activations the backward needs, and the backward of
// every layer. Layers (pre-norm decoder, HF Llama/Qwen semantics):
//   x = embed[tokens]
//   per layer: h = rmsnorm(x); q,k,v = h·W^T (+b); [qk-norm]; rope(q,k); a = attn(q,k,v)
//              (MLA: q = h·Wq^T; [k_nope|k_rope|v] per kv head = rmsnorm(h·Wkv_a^T)·Wkv_b^T;
//              RoPE on the trailing qk_rope_head_dim of q and k)
//              [a ∘= sigmoid(h·Wg^T)]; x += a·Wo^T (+bo)
//              h = rmsnorm(x); x += (silu(h·Wgate^T (+b)) ∘ (h·Wup^T (+b)))·Wdown^T (+b)
//   logits = rmsnorm(x)·Wlm^T (Wlm = embed when tied)
// The configuration is model::ModelConfig itself (the forward's), and RoPE tables come from
// model::rope_inv_freq_into per packed document (dynamic NTK scaling rescales per document,
// as the inference forward does per sequence).
// With `recompute`, only each layer's input is kept and the rest is recomputed in the
// backward (one layer's activations live at a time).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"
#include "train/params.h"
#include "train/train_batch.h"

namespace astrai::train {

class TrainModel {
 public:
  explicit TrainModel(const model::ModelConfig& config, bool recompute = false);
  TrainModel(const TrainModel&) = delete;
  TrainModel& operator=(const TrainModel&) = delete;

  const model::ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  FloatBuffer& params() { return params_; }
  const FloatBuffer& params() const { return params_; }
  FloatBuffer& grads() { return grads_; }
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
  struct LayerActs {
    float *x_in, *xn1, *rstd1, *q_raw, *k_raw, *rstd_q, *rstd_k, *q, *k, *v, *att, *lse, *gs, *y,
        *x_mid, *xn2, *rstd2, *a, *b, *h,
        *lat_raw, *rstd_kv, *lat;  // MLA: kv_a_proj output, its rstd, after kv_norm
  };
  void ensure_buffers(int64_t tokens);
  void layer_forward(int64_t l, const TrainBatch& batch, const LayerActs& A, float* x_out);
  void layer_backward(int64_t l, const TrainBatch& batch, const LayerActs& A, float* dres);
  void rope_tables(const TrainBatch& batch);
  void rope(float* x, int64_t tokens, int64_t heads, bool inverse) const;

  model::ModelConfig cfg_;
  bool recompute_;
  ParamLayout layout_;
  FloatBuffer params_, grads_;
  ModelTensors p_, g_;
  std::vector<double> inv_freq_;  // static scaling: computed once; dynamic: per document
  std::vector<float> rope_cos_, rope_sin_;  // per token [tokens, rope_dim / 2]

  int64_t capacity_ = 0;  // tokens the activation buffers hold
  FloatBuffer acts_, scratch_;
  std::vector<LayerActs> layer_acts_;
  float *x_final_ = nullptr, *xf_ = nullptr, *rstd_f_ = nullptr, *logits_ = nullptr;
  // Backward scratch.
  float *d_res_ = nullptr, *d_xn_ = nullptr, *d_q_ = nullptr, *d_k_ = nullptr, *d_v_ = nullptr,
        *d_att_ = nullptr, *d_y_ = nullptr, *d_a_ = nullptr, *d_b_ = nullptr, *d_h_ = nullptr,
        *kvb_ = nullptr, *d_lat_ = nullptr;
};

}  // namespace astrai::train
