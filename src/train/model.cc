#include "train/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/attention_backward.h"
#include "kernels/cpu/linear_backward.h"
#include "kernels/cpu/rmsnorm_backward.h"
#include "kernels/cpu/swiglu_backward.h"

namespace astrai::train {

using kernels::linear_backward_f32;
using kernels::linear_f32;

TrainModel::TrainModel(const Arch& arch, bool recompute)
    : arch_(arch), recompute_(recompute), layout_(arch), params_(layout_.total()), grads_(layout_.total()) {
  arch_.validate();
  p_ = bind_tensors(arch_, layout_, params_.data());
  g_ = bind_tensors(arch_, layout_, grads_.data());
  inv_freq_ = kernels::rope_inv_freq(arch_.head_dim, arch_.rope_theta, arch_.rope_scaling, &rope_scale_);
}

size_t TrainModel::num_params() const {
  size_t n = 0;
  for (const auto& s : layout_.specs()) n += s.numel;
  return n;
}

void TrainModel::init_weights(uint64_t seed, float std) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, std);
  for (const auto& s : layout_.specs()) {
    float* p = params_.data() + s.offset;
    const bool is_norm = s.name.find("norm.weight") != std::string::npos;
    const bool is_bias = s.name.size() > 5 && s.name.compare(s.name.size() - 5, 5, ".bias") == 0;
    for (size_t i = 0; i < s.numel; ++i) p[i] = is_norm ? 1.0f : is_bias ? 0.0f : normal(rng);
  }
}

void TrainModel::load_weights(const std::map<std::string, Tensor>& tensors, const std::string& where) {
  for (const auto& s : layout_.specs()) {
    auto it = tensors.find(s.name);
    ASTRAI_CHECK(it != tensors.end(), where, ": missing tensor \"", s.name, "\"");
    ASTRAI_CHECK(it->second.shape() == s.shape, where, ": tensor \"", s.name, "\" has shape ",
                 shape_str(it->second.shape()), ", the config needs ", shape_str(s.shape));
    convert_to_f32(it->second.dtype(), it->second.raw(), params_.data() + s.offset, s.numel);
  }
}

void TrainModel::copy_parameters_from(const TrainModel& other) {
  ASTRAI_CHECK(other.layout_.total() == layout_.total(), "copy_parameters_from: different architectures");
  std::memcpy(params_.data(), other.params_.data(), layout_.total() * sizeof(float));
}

void TrainModel::zero_grads() { std::memset(grads_.data(), 0, grads_.size() * sizeof(float)); }

void TrainModel::ensure_buffers(int64_t T) {
  if (T <= capacity_) return;
  const Arch& a = arch_;
  const int64_t D = a.hidden_size, QD = a.q_dim(), KVD = a.kv_dim(), I = a.intermediate_size,
                H = a.num_heads, KV = a.num_kv_heads, V = a.vocab_size;
  // Per-layer activation sizes, in the order of LayerActs.
  const std::vector<int64_t> sizes = {
      T * D, T * D, T, a.qk_norm ? T * QD : 0, a.qk_norm ? T * KVD : 0, a.qk_norm ? T * H : 0,
      a.qk_norm ? T * KV : 0, T * QD, T * KVD, T * KVD, T * QD, T * H, a.attn_gate ? T * QD : 0,
      a.attn_gate ? T * QD : 0, T * D, T * D, T, T * I, T * I, T * I};
  auto pad = [](int64_t n) { return (n + 15) / 16 * 16; };
  int64_t per_layer = 0, rest = 0;
  for (size_t i = 1; i < sizes.size(); ++i) per_layer += pad(sizes[i]);
  const int64_t stored_layers = recompute_ ? 1 : a.num_layers;
  const int64_t total = a.num_layers * pad(T * D) + stored_layers * per_layer + pad(T * D) * 2 +
                        pad(T) + pad(T * V);
  acts_ = FloatBuffer(static_cast<size_t>(total));
  float* cur = acts_.data();
  auto take = [&](int64_t n) {
    float* p = n > 0 ? cur : nullptr;
    cur += pad(n);
    return p;
  };
  layer_acts_.assign(a.num_layers, LayerActs{});
  for (int64_t l = 0; l < a.num_layers; ++l) layer_acts_[l].x_in = take(T * D);
  for (int64_t l = 0; l < stored_layers; ++l) {
    float** fields = &layer_acts_[l].x_in;
    for (size_t i = 1; i < sizes.size(); ++i) fields[i] = take(sizes[i]);
  }
  if (recompute_) {
    for (int64_t l = 1; l < a.num_layers; ++l) {
      float* keep = layer_acts_[l].x_in;
      layer_acts_[l] = layer_acts_[0];
      layer_acts_[l].x_in = keep;
    }
  }
  x_final_ = take(T * D);
  xf_ = take(T * D);
  rstd_f_ = take(T);
  logits_ = take(T * V);
  (void)rest;

  const std::vector<int64_t> dsizes = {T * D, std::max({T * D, T * QD}), T * QD, T * KVD, T * KVD,
                                       T * QD, T * QD, T * I, T * I, T * I};
  int64_t dtotal = 0;
  for (int64_t n : dsizes) dtotal += pad(n);
  scratch_ = FloatBuffer(static_cast<size_t>(dtotal));
  cur = scratch_.data();
  d_res_ = take(dsizes[0]);
  d_xn_ = take(dsizes[1]);
  d_q_ = take(dsizes[2]);
  d_k_ = take(dsizes[3]);
  d_v_ = take(dsizes[4]);
  d_att_ = take(dsizes[5]);
  d_y_ = take(dsizes[6]);
  d_a_ = take(dsizes[7]);
  d_b_ = take(dsizes[8]);
  d_h_ = take(dsizes[9]);
  capacity_ = T;
}

void TrainModel::layer_forward(int64_t l, const TrainBatch& batch, const LayerActs& A, float* x_out) {
  const Arch& a = arch_;
  const LayerTensors& P = p_.layers[l];
  const int64_t T = batch.num_tokens(), D = a.hidden_size, QD = a.q_dim(), KVD = a.kv_dim(),
                I = a.intermediate_size, H = a.num_heads, KV = a.num_kv_heads, hd = a.head_dim;
  kernels::rmsnorm_forward_train(A.x_in, P.input_norm, T, D, a.norm_eps, A.xn1, A.rstd1);
  const int32_t* pos = batch.positions.data();
  if (a.qk_norm) {
    linear_f32(A.xn1, T, P.wq, QD, D, P.bq, A.q_raw);
    linear_f32(A.xn1, T, P.wk, KVD, D, P.bk, A.k_raw);
    if (a.qk_norm_after_rope) {
      kernels::rope_apply(A.q_raw, pos, T, H, hd, hd, a.rope_pairing, rope_, false);
      kernels::rope_apply(A.k_raw, pos, T, KV, hd, hd, a.rope_pairing, rope_, false);
    }
    kernels::rmsnorm_forward_train(A.q_raw, P.q_norm, T * H, hd, a.norm_eps, A.q, A.rstd_q);
    kernels::rmsnorm_forward_train(A.k_raw, P.k_norm, T * KV, hd, a.norm_eps, A.k, A.rstd_k);
  } else {
    linear_f32(A.xn1, T, P.wq, QD, D, P.bq, A.q);
    linear_f32(A.xn1, T, P.wk, KVD, D, P.bk, A.k);
  }
  linear_f32(A.xn1, T, P.wv, KVD, D, P.bv, A.v);
  if (!(a.qk_norm && a.qk_norm_after_rope)) {
    kernels::rope_apply(A.q, pos, T, H, hd, hd, a.rope_pairing, rope_, false);
    kernels::rope_apply(A.k, pos, T, KV, hd, hd, a.rope_pairing, rope_, false);
  }
  const kernels::AttnShape shape{H, KV, hd, hd, 1.0f / std::sqrt(static_cast<float>(hd))};
  kernels::attention_forward_train(A.q, A.k, A.v, batch.docs, shape, A.att, A.lse);
  const float* y = A.att;
  if (a.attn_gate) {
    linear_f32(A.xn1, T, P.wgate_attn, QD, D, nullptr, A.gs);
    kernels::sigmoid_forward(A.gs, T * QD, A.gs);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < T * QD; ++i) A.y[i] = A.att[i] * A.gs[i];
    y = A.y;
  }
  linear_f32(y, T, P.wo, D, QD, P.bo, A.x_mid);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < T * D; ++i) A.x_mid[i] += A.x_in[i];
  kernels::rmsnorm_forward_train(A.x_mid, P.post_norm, T, D, a.norm_eps, A.xn2, A.rstd2);
  linear_f32(A.xn2, T, P.w_gate, I, D, nullptr, A.a);
  linear_f32(A.xn2, T, P.w_up, I, D, nullptr, A.b);
  kernels::swiglu_forward_train(A.a, A.b, T * I, A.h);
  linear_f32(A.h, T, P.w_down, D, I, nullptr, x_out);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < T * D; ++i) x_out[i] += A.x_mid[i];
}

float* TrainModel::forward(const TrainBatch& batch) {
  const Arch& a = arch_;
  const int64_t T = batch.num_tokens(), D = a.hidden_size, V = a.vocab_size;
  ASTRAI_CHECK(T > 0, "training batch is empty");
  ensure_buffers(T);
  rope_.build(inv_freq_, rope_scale_, batch.max_position());
  float* x0 = layer_acts_[0].x_in;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(x0 + t * D, p_.embed + static_cast<int64_t>(batch.tokens[t]) * D, D * sizeof(float));
  for (int64_t l = 0; l < a.num_layers; ++l) {
    float* x_out = l + 1 < a.num_layers ? layer_acts_[l + 1].x_in : x_final_;
    layer_forward(l, batch, layer_acts_[l], x_out);
  }
  kernels::rmsnorm_forward_train(x_final_, p_.final_norm, T, D, a.norm_eps, xf_, rstd_f_);
  linear_f32(xf_, T, p_.lm_head, V, D, nullptr, logits_);
  return logits_;
}

void TrainModel::layer_backward(int64_t l, const TrainBatch& batch, const LayerActs& A, float* dres) {
  const Arch& a = arch_;
  const LayerTensors& P = p_.layers[l];
  const LayerTensors& G = g_.layers[l];
  const int64_t T = batch.num_tokens(), D = a.hidden_size, QD = a.q_dim(), KVD = a.kv_dim(),
                I = a.intermediate_size, H = a.num_heads, KV = a.num_kv_heads, hd = a.head_dim;
  // MLP: dres is d(x_out); x_out = x_mid + down(h).
  linear_backward_f32(dres, A.h, T, P.w_down, D, I, d_h_, false, G.w_down, nullptr);
  kernels::swiglu_backward(d_h_, A.a, A.b, T * I, d_a_, d_b_);
  linear_backward_f32(d_a_, A.xn2, T, P.w_gate, I, D, d_xn_, false, G.w_gate, nullptr);
  linear_backward_f32(d_b_, A.xn2, T, P.w_up, I, D, d_xn_, true, G.w_up, nullptr);
  kernels::rmsnorm_backward(d_xn_, A.x_mid, P.post_norm, A.rstd2, T, D, dres, true, G.post_norm);
  // Attention: dres is now d(x_mid); x_mid = x_in + o_proj(y).
  const float* y = a.attn_gate ? A.y : A.att;
  linear_backward_f32(dres, y, T, P.wo, D, QD, d_y_, false, G.wo, G.bo);
  bool have_dxn = false;
  if (a.attn_gate) {
    // y = att ∘ g, g = sigmoid(z): d att = dy ∘ g; dz = dy ∘ att ∘ g(1 − g).
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < T * QD; ++i) {
      const float g = A.gs[i];
      d_att_[i] = d_y_[i] * g;
      d_y_[i] = d_y_[i] * A.att[i] * g * (1.0f - g);
    }
    linear_backward_f32(d_y_, A.xn1, T, P.wgate_attn, QD, D, d_xn_, false, G.wgate_attn, nullptr);
    have_dxn = true;
  } else {
    std::memcpy(d_att_, d_y_, sizeof(float) * T * QD);
  }
  const kernels::AttnShape shape{H, KV, hd, hd, 1.0f / std::sqrt(static_cast<float>(hd))};
  kernels::attention_backward(d_att_, A.q, A.k, A.v, A.att, A.lse, batch.docs, shape, d_q_, d_k_, d_v_);
  const int32_t* pos = batch.positions.data();
  const bool rope_first = a.qk_norm && a.qk_norm_after_rope;  // forward: rope, then norm
  if (!rope_first) {
    kernels::rope_apply(d_q_, pos, T, H, hd, hd, a.rope_pairing, rope_, true);
    kernels::rope_apply(d_k_, pos, T, KV, hd, hd, a.rope_pairing, rope_, true);
  }
  if (a.qk_norm) {
    kernels::rmsnorm_backward(d_q_, A.q_raw, P.q_norm, A.rstd_q, T * H, hd, d_q_, false, G.q_norm);
    kernels::rmsnorm_backward(d_k_, A.k_raw, P.k_norm, A.rstd_k, T * KV, hd, d_k_, false, G.k_norm);
  }
  if (rope_first) {
    kernels::rope_apply(d_q_, pos, T, H, hd, hd, a.rope_pairing, rope_, true);
    kernels::rope_apply(d_k_, pos, T, KV, hd, hd, a.rope_pairing, rope_, true);
  }
  linear_backward_f32(d_q_, A.xn1, T, P.wq, QD, D, d_xn_, have_dxn, G.wq, G.bq);
  linear_backward_f32(d_k_, A.xn1, T, P.wk, KVD, D, d_xn_, true, G.wk, G.bk);
  linear_backward_f32(d_v_, A.xn1, T, P.wv, KVD, D, d_xn_, true, G.wv, G.bv);
  kernels::rmsnorm_backward(d_xn_, A.x_in, P.input_norm, A.rstd1, T, D, dres, true, G.input_norm);
}

void TrainModel::backward(const TrainBatch& batch, float* dlogits) {
  const Arch& a = arch_;
  const int64_t T = batch.num_tokens(), D = a.hidden_size, V = a.vocab_size;
  ASTRAI_CHECK(T <= capacity_, "backward without a matching forward");
  linear_backward_f32(dlogits, xf_, T, p_.lm_head, V, D, d_xn_, false, g_.lm_head, nullptr);
  kernels::rmsnorm_backward(d_xn_, x_final_, p_.final_norm, rstd_f_, T, D, d_res_, false, g_.final_norm);
  for (int64_t l = a.num_layers - 1; l >= 0; --l) {
    if (recompute_) {
      float* x_out = l + 1 < a.num_layers ? layer_acts_[l + 1].x_in : x_final_;
      layer_forward(l, batch, layer_acts_[l], x_out);
    }
    layer_backward(l, batch, layer_acts_[l], d_res_);
  }
  // Embedding: scatter-add rows. Parallel over feature columns so each column's sum runs
  // in token order on one thread (deterministic, no atomics).
  float* gE = g_.embed;
  const int64_t chunk = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < D; c0 += chunk) {
    const int64_t c1 = std::min(D, c0 + chunk);
    for (int64_t t = 0; t < T; ++t) {
      float* dst = gE + static_cast<int64_t>(batch.tokens[t]) * D;
      const float* src = d_res_ + t * D;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace astrai::train
