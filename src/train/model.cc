#include "train/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention_backward.h"
#include "kernels/cpu/linear_backward.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rmsnorm_backward.h"
#include "kernels/cpu/swiglu_backward.h"
#include "model/transformer.h"

namespace astrai::train {

using kernels::linear_backward_f32;

namespace {

// Sizes the layer code needs, all derived from the ModelConfig.
struct Dims {
  int64_t D, I, V, H, KV, qkd, vd, rope, nope, QD, KD, VD, OD, R, row;
  explicit Dims(const model::ModelConfig& c)
      : D(c.hidden_size), I(c.intermediate_size), V(c.vocab_size), H(c.num_attention_heads),
        KV(c.num_key_value_heads), qkd(c.qk_head_dim()), vd(c.v_dim()), rope(c.rope_dim()),
        nope(c.qk_head_dim() - c.rope_dim()), QD(H * qkd), KD(KV * qkd), VD(KV * vd), OD(H * vd),
        R(c.is_mla() ? c.kv_lora_rank : 0), row(qkd + vd) {}
};

// The forward's (model/transformer.cc) choice: HF families compute RoPE angles in f32, the
// reference autoregressive_lm in f64.
bool f32_rope_angles(const model::ModelConfig& c) { return c.model_type != "autoregressive_lm"; }

// y[m, n] = x[m, k] · W[n, k]^T (+ bias): the inference forward's batch-invariant linear, so the
// training forward has its bits.
void linear_f32(const float* x, int64_t m, const float* w, int64_t n, int64_t k, const float* bias, float* y) {
  kernels::linear(x, m, kernels::WeightView{w, DType::kF32, n, k}, bias, y);
}

kernels::AttnShape attn_shape(const Dims& d) {
  return kernels::AttnShape{d.H, d.KV, d.qkd, d.vd, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.qkd)))};
}

}  // namespace

TrainModel::TrainModel(const model::ModelConfig& config, bool recompute)
    : cfg_(config), recompute_(recompute), layout_(cfg_), params_(layout_.total()), grads_(layout_.total()) {
  cfg_.validate("model config");
  p_ = bind_tensors(cfg_, layout_, params_.data());
  g_ = bind_tensors(cfg_, layout_, grads_.data());
  if (cfg_.rope_scaling.type != model::RopeScalingType::kDynamic) model::rope_inv_freq_into(cfg_, 0, inv_freq_);
}

void TrainModel::rope_tables(const TrainBatch& batch) {
  const int64_t T = batch.num_tokens(), half = cfg_.rope_dim() / 2;
  rope_cos_.resize(static_cast<size_t>(T * half));
  rope_sin_.resize(static_cast<size_t>(T * half));
  const bool dynamic = cfg_.rope_scaling.type == model::RopeScalingType::kDynamic;
  const bool f32 = f32_rope_angles(cfg_);
  int64_t covered = 0;
  for (const auto& sp : batch.docs) {
    covered += sp.len;
    if (sp.len == 0) continue;
    const int32_t* pos = batch.positions.data() + sp.begin;
    if (dynamic) {
      // As the inference forward: frequencies from the longest position of this document.
      const int32_t max_pos = *std::max_element(pos, pos + sp.len);
      model::rope_inv_freq_into(cfg_, static_cast<int64_t>(max_pos) + 1, inv_freq_);
    }
    kernels::rope_sincos(inv_freq_.data(), half, pos, sp.len, f32, rope_cos_.data() + sp.begin * half,
                         rope_sin_.data() + sp.begin * half);
  }
  ASTRAI_CHECK(covered == T, "training batch: documents cover ", covered, " of ", T, " tokens");
}

// Rotates the trailing rope_dim features of each head of x[tokens, heads, qk_head_dim].
void TrainModel::rope(float* x, int64_t tokens, int64_t heads, bool inverse) const {
  const int64_t qkd = cfg_.qk_head_dim(), rot = cfg_.rope_dim();
  kernels::rope_rotate(x, tokens, heads, qkd, qkd - rot, rot / 2, rope_cos_.data(), rope_sin_.data(), cfg_.rope_pairing,
                       inverse);
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
    const bool is_norm = s.kind == model::ParamKind::kNorm;
    const bool is_bias = s.kind == model::ParamKind::kBias;
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
  const model::ModelConfig& c = cfg_;
  const Dims d(c);
  const bool qn = c.qk_norm, gate = c.gated_attention, mla = c.is_mla();
  // Per-layer activation sizes, in the order of LayerActs.
  const std::vector<int64_t> sizes = {
      T * d.D, T * d.D, T, qn ? T * d.QD : 0, qn ? T * d.KD : 0, qn ? T * d.H : 0,
      qn ? T * d.KV : 0, T * d.QD, T * d.KD, T * d.VD, T * d.OD, T * d.H, gate ? T * d.OD : 0,
      gate ? T * d.OD : 0, T * d.D, T * d.D, T, T * d.I, T * d.I, T * d.I,
      mla ? T * d.R : 0, mla ? T : 0, mla ? T * d.R : 0};
  static_assert(sizeof(LayerActs) == 23 * sizeof(float*), "sizes must list every LayerActs field");
  auto pad = [](int64_t n) { return (n + 15) / 16 * 16; };
  int64_t per_layer = 0;
  for (size_t i = 1; i < sizes.size(); ++i) per_layer += pad(sizes[i]);
  const int64_t layers = c.num_hidden_layers;
  const int64_t stored_layers = recompute_ ? 1 : layers;
  const int64_t total = layers * pad(T * d.D) + stored_layers * per_layer + pad(T * d.D) * 2 + pad(T) + pad(T * d.V);
  acts_ = FloatBuffer(static_cast<size_t>(total));
  float* cur = acts_.data();
  auto take = [&](int64_t n) {
    float* p = n > 0 ? cur : nullptr;
    cur += pad(n);
    return p;
  };
  layer_acts_.assign(layers, LayerActs{});
  for (int64_t l = 0; l < layers; ++l) layer_acts_[l].x_in = take(T * d.D);
  for (int64_t l = 0; l < stored_layers; ++l) {
    float** fields = &layer_acts_[l].x_in;
    for (size_t i = 1; i < sizes.size(); ++i) fields[i] = take(sizes[i]);
  }
  if (recompute_) {
    for (int64_t l = 1; l < layers; ++l) {
      float* keep = layer_acts_[l].x_in;
      layer_acts_[l] = layer_acts_[0];
      layer_acts_[l].x_in = keep;
    }
  }
  x_final_ = take(T * d.D);
  xf_ = take(T * d.D);
  rstd_f_ = take(T);
  logits_ = take(T * d.V);

  const int64_t kvb = mla ? T * d.KV * d.row : 0;
  const std::vector<int64_t> dsizes = {T * d.D, std::max({T * d.D, T * d.QD}), T * d.QD, T * d.KD, T * d.VD,
                                       T * d.OD, T * d.OD, T * d.I, T * d.I, T * d.I, kvb, mla ? T * d.R : 0};
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
  kvb_ = take(dsizes[10]);  // MLA: kv_b_proj output in the forward, its gradient in the backward
  d_lat_ = take(dsizes[11]);
  capacity_ = T;
}

void TrainModel::layer_forward(int64_t l, const TrainBatch& batch, const LayerActs& A, float* x_out) {
  const model::ModelConfig& c = cfg_;
  const Dims d(c);
  const LayerTensors& P = p_.layers[l];
  const int64_t T = batch.num_tokens(), D = d.D, I = d.I, H = d.H, KV = d.KV, hd = d.qkd;
  const float eps = static_cast<float>(c.rms_norm_eps);
  kernels::rmsnorm_forward_train(A.x_in, P.input_layernorm, T, D, eps, A.xn1, A.rstd1);
  if (c.is_mla()) {
    // q = h·Wq^T; latent = rmsnorm(h·Wkv_a^T); [k_nope | k_rope | v] per kv head = latent·Wkv_b^T.
    linear_f32(A.xn1, T, P.q_proj, d.QD, D, nullptr, A.q);
    linear_f32(A.xn1, T, P.kv_a_proj, d.R, D, nullptr, A.lat_raw);
    kernels::rmsnorm_forward_train(A.lat_raw, P.kv_norm, T, d.R, eps, A.lat, A.rstd_kv);
    linear_f32(A.lat, T, P.kv_b_proj, KV * d.row, d.R, nullptr, kvb_);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < T * KV; ++i) {
      std::memcpy(A.k + i * d.qkd, kvb_ + i * d.row, sizeof(float) * d.qkd);
      std::memcpy(A.v + i * d.vd, kvb_ + i * d.row + d.qkd, sizeof(float) * d.vd);
    }
    rope(A.q, T, H, false);
    rope(A.k, T, KV, false);
  } else {
    if (c.qk_norm) {
      linear_f32(A.xn1, T, P.q_proj, d.QD, D, P.q_bias, A.q_raw);
      linear_f32(A.xn1, T, P.k_proj, d.KD, D, P.k_bias, A.k_raw);
      if (c.qk_norm_after_rope) {
        rope(A.q_raw, T, H, false);
        rope(A.k_raw, T, KV, false);
      }
      kernels::rmsnorm_forward_train(A.q_raw, P.q_norm, T * H, hd, eps, A.q, A.rstd_q);
      kernels::rmsnorm_forward_train(A.k_raw, P.k_norm, T * KV, hd, eps, A.k, A.rstd_k);
    } else {
      linear_f32(A.xn1, T, P.q_proj, d.QD, D, P.q_bias, A.q);
      linear_f32(A.xn1, T, P.k_proj, d.KD, D, P.k_bias, A.k);
    }
    linear_f32(A.xn1, T, P.v_proj, d.VD, D, P.v_bias, A.v);
    if (!(c.qk_norm && c.qk_norm_after_rope)) {
      rope(A.q, T, H, false);
      rope(A.k, T, KV, false);
    }
  }
  kernels::attention_forward_train(A.q, A.k, A.v, batch.docs, attn_shape(d), A.att, A.lse);
  const float* y = A.att;
  const int64_t OD = d.OD;
  if (c.gated_attention) {
    linear_f32(A.xn1, T, P.gate, OD, D, nullptr, A.gs);
    kernels::sigmoid_forward(A.gs, T * OD, A.gs);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < T * OD; ++i) A.y[i] = A.att[i] * A.gs[i];
    y = A.y;
  }
  linear_f32(y, T, P.o_proj, D, OD, P.o_bias, A.x_mid);
  kernels::add_inplace(A.x_mid, A.x_in, T * D);
  kernels::rmsnorm_forward_train(A.x_mid, P.post_attention_layernorm, T, D, eps, A.xn2, A.rstd2);
  linear_f32(A.xn2, T, P.gate_proj, I, D, P.gate_proj_bias, A.a);
  linear_f32(A.xn2, T, P.up_proj, I, D, P.up_proj_bias, A.b);
  kernels::swiglu(A.a, A.b, T * I, A.h);
  linear_f32(A.h, T, P.down_proj, D, I, P.down_proj_bias, x_out);
  kernels::add_inplace(x_out, A.x_mid, T * D);
}

float* TrainModel::forward(const TrainBatch& batch) {
  const int64_t T = batch.num_tokens(), D = cfg_.hidden_size, V = cfg_.vocab_size, layers = cfg_.num_hidden_layers;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  ASTRAI_CHECK(T > 0, "training batch is empty");
  ensure_buffers(T);
  rope_tables(batch);
  float* x0 = layer_acts_[0].x_in;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(x0 + t * D, p_.embed_tokens + static_cast<int64_t>(batch.tokens[t]) * D, D * sizeof(float));
  for (int64_t l = 0; l < layers; ++l) {
    float* x_out = l + 1 < layers ? layer_acts_[l + 1].x_in : x_final_;
    layer_forward(l, batch, layer_acts_[l], x_out);
  }
  kernels::rmsnorm_forward_train(x_final_, p_.norm, T, D, eps, xf_, rstd_f_);
  linear_f32(xf_, T, p_.lm_head, V, D, nullptr, logits_);
  return logits_;
}

void TrainModel::layer_backward(int64_t l, const TrainBatch& batch, const LayerActs& A, float* dres) {
  const model::ModelConfig& c = cfg_;
  const Dims d(c);
  const LayerTensors& P = p_.layers[l];
  const LayerTensors& G = g_.layers[l];
  const int64_t T = batch.num_tokens(), D = d.D, I = d.I, H = d.H, KV = d.KV, hd = d.qkd, OD = d.OD;
  // MLP: dres is d(x_out); x_out = x_mid + down(h).
  linear_backward_f32(dres, A.h, T, P.down_proj, D, I, d_h_, false, G.down_proj, G.down_proj_bias);
  kernels::swiglu_backward(d_h_, A.a, A.b, T * I, d_a_, d_b_);
  linear_backward_f32(d_a_, A.xn2, T, P.gate_proj, I, D, d_xn_, false, G.gate_proj, G.gate_proj_bias);
  linear_backward_f32(d_b_, A.xn2, T, P.up_proj, I, D, d_xn_, true, G.up_proj, G.up_proj_bias);
  kernels::rmsnorm_backward(d_xn_, A.x_mid, P.post_attention_layernorm, A.rstd2, T, D, dres, true, G.post_attention_layernorm);
  // Attention: dres is now d(x_mid); x_mid = x_in + o_proj(y).
  const float* y = c.gated_attention ? A.y : A.att;
  linear_backward_f32(dres, y, T, P.o_proj, D, OD, d_y_, false, G.o_proj, G.o_bias);
  bool have_dxn = false;
  if (c.gated_attention) {
    // y = att ∘ g, g = sigmoid(z): d att = dy ∘ g; dz = dy ∘ att ∘ g(1 − g).
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < T * OD; ++i) {
      const float g = A.gs[i];
      d_att_[i] = d_y_[i] * g;
      d_y_[i] = d_y_[i] * A.att[i] * g * (1.0f - g);
    }
    linear_backward_f32(d_y_, A.xn1, T, P.gate, OD, D, d_xn_, false, G.gate, nullptr);
    have_dxn = true;
  } else {
    std::memcpy(d_att_, d_y_, sizeof(float) * T * OD);
  }
  kernels::attention_backward(d_att_, A.q, A.k, A.v, A.att, A.lse, batch.docs, attn_shape(d), d_q_, d_k_, d_v_);
  if (c.is_mla()) {
    rope(d_q_, T, H, true);
    rope(d_k_, T, KV, true);
    linear_backward_f32(d_q_, A.xn1, T, P.q_proj, d.QD, D, d_xn_, have_dxn, G.q_proj, nullptr);
    // d[k | v] back into the kv_b_proj output rows, then kv_b_proj, kv_norm, kv_a_proj.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < T * KV; ++i) {
      std::memcpy(kvb_ + i * d.row, d_k_ + i * d.qkd, sizeof(float) * d.qkd);
      std::memcpy(kvb_ + i * d.row + d.qkd, d_v_ + i * d.vd, sizeof(float) * d.vd);
    }
    linear_backward_f32(kvb_, A.lat, T, P.kv_b_proj, KV * d.row, d.R, d_lat_, false, G.kv_b_proj, nullptr);
    kernels::rmsnorm_backward(d_lat_, A.lat_raw, P.kv_norm, A.rstd_kv, T, d.R, d_lat_, false, G.kv_norm);
    linear_backward_f32(d_lat_, A.xn1, T, P.kv_a_proj, d.R, D, d_xn_, true, G.kv_a_proj, nullptr);
  } else {
    const bool rope_first = c.qk_norm && c.qk_norm_after_rope;  // forward: rope, then norm
    if (!rope_first) {
      rope(d_q_, T, H, true);
      rope(d_k_, T, KV, true);
    }
    if (c.qk_norm) {
      kernels::rmsnorm_backward(d_q_, A.q_raw, P.q_norm, A.rstd_q, T * H, hd, d_q_, false, G.q_norm);
      kernels::rmsnorm_backward(d_k_, A.k_raw, P.k_norm, A.rstd_k, T * KV, hd, d_k_, false, G.k_norm);
    }
    if (rope_first) {
      rope(d_q_, T, H, true);
      rope(d_k_, T, KV, true);
    }
    linear_backward_f32(d_q_, A.xn1, T, P.q_proj, d.QD, D, d_xn_, have_dxn, G.q_proj, G.q_bias);
    linear_backward_f32(d_k_, A.xn1, T, P.k_proj, d.KD, D, d_xn_, true, G.k_proj, G.k_bias);
    linear_backward_f32(d_v_, A.xn1, T, P.v_proj, d.VD, D, d_xn_, true, G.v_proj, G.v_bias);
  }
  kernels::rmsnorm_backward(d_xn_, A.x_in, P.input_layernorm, A.rstd1, T, D, dres, true, G.input_layernorm);
}

void TrainModel::backward(const TrainBatch& batch, float* dlogits) {
  const int64_t T = batch.num_tokens(), D = cfg_.hidden_size, V = cfg_.vocab_size, layers = cfg_.num_hidden_layers;
  ASTRAI_CHECK(T <= capacity_, "backward without a matching forward");
  linear_backward_f32(dlogits, xf_, T, p_.lm_head, V, D, d_xn_, false, g_.lm_head, nullptr);
  kernels::rmsnorm_backward(d_xn_, x_final_, p_.norm, rstd_f_, T, D, d_res_, false, g_.norm);
  for (int64_t l = layers - 1; l >= 0; --l) {
    if (recompute_) {
      float* x_out = l + 1 < layers ? layer_acts_[l + 1].x_in : x_final_;
      layer_forward(l, batch, layer_acts_[l], x_out);
    }
    layer_backward(l, batch, layer_acts_[l], d_res_);
  }
  // Embedding: scatter-add rows. Parallel over feature columns so each column's sum runs
  // in token order on one thread (deterministic, no atomics).
  float* gE = g_.embed_tokens;
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
