#include "model/transformer.h"

#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "base/error.h"
#include "model/layer.h"

namespace astrai::model {

namespace {

// Hugging Face families compute the RoPE tables in f32 (and so do we, to give the same
// logits); the reference AstrAI computes them in float64 and rounds the cos/sin.
bool hf_rope_precision(const ModelConfig& c) { return c.model_type != "autoregressive_lm"; }

Tensor f32_vector(const Tensor& t) {
  if (!t.defined() || t.dtype() == DType::kF32) return t;
  return t.to(DType::kF32);
}

// YaRN's correction range: the pairs [low, high] over which each frequency moves from the
// original (pairs below low: fast rotations, kept) to the interpolated one (above high).
// Hugging Face's find_correction_range, in double as there.
struct YarnRamp {
  double low = 0, high = 1;
};

YarnRamp yarn_ramp(const RopeScaling& rs, int64_t dim, double base) {
  const double d = static_cast<double>(dim);
  const double orig = static_cast<double>(rs.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return d * std::log(orig / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
  };
  double low = correction_dim(rs.beta_fast), high = correction_dim(rs.beta_slow);
  if (rs.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  YarnRamp r{std::max(low, 0.0), std::min(high, d - 1.0)};
  if (r.low == r.high) r.high += 0.001;  // as there: no division by zero
  return r;
}

// One pair's YaRN frequency with Hugging Face's steps in T (f32 for the HF families, double for
// autoregressive_lm): p = base^(2i/dim), the ramp clamp((i - low) / (high - low), 0, 1),
// extrapolation factor e = 1 - ramp, and 1/(factor p) * (1 - e) + 1/p * e.
template <typename T>
T yarn_blend(T p, double factor, const YarnRamp& r, int64_t i) {
  const T extrapolation = T(1) / p;
  const T interpolation = T(1) / (static_cast<T>(factor) * p);
  const T lin = (static_cast<T>(i) - static_cast<T>(r.low)) / static_cast<T>(r.high - r.low);
  const T e = T(1) - std::clamp(lin, T(0), T(1));
  return interpolation * (T(1) - e) + extrapolation * e;
}

}  // namespace

float rope_attention_factor(const ModelConfig& c) {
  return c.rope_scaling.type == RopeScalingType::kYarn ? static_cast<float>(c.rope_scaling.attention_factor) : 1.0f;
}

std::vector<double> rope_inv_freq(const ModelConfig& c, int64_t seq_len) {
  std::vector<double> inv;
  rope_inv_freq_into(c, seq_len, inv);
  return inv;
}

void rope_inv_freq_into(const ModelConfig& c, int64_t seq_len, std::vector<double>& inv) {
  const int64_t dim = c.rope_dim();
  const int64_t half = dim / 2;
  const RopeScaling& rs = c.rope_scaling;
  double base = c.rope_theta;
  if (rs.type == RopeScalingType::kDynamic) {
    const double orig = static_cast<double>(rs.original_max_position_embeddings);
    const double len = std::max<double>(static_cast<double>(seq_len), orig);
    base = base * std::pow(rs.factor * len / orig - (rs.factor - 1.0),
                           static_cast<double>(dim) / static_cast<double>(dim - 2));
  }
  inv.resize(static_cast<size_t>(half));  // no allocation once sized
  const bool f32 = hf_rope_precision(c);
  const bool yarn = rs.type == RopeScalingType::kYarn;
  const YarnRamp ramp = yarn ? yarn_ramp(rs, dim, base) : YarnRamp{};
  for (int64_t i = 0; i < half; ++i) {
    double& f = inv[static_cast<size_t>(i)];
    if (f32) {
      // 1.0 / (base ** (arange(0, dim, 2).float() / dim)), every step in f32.
      const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
      const float p = static_cast<float>(std::pow(static_cast<double>(static_cast<float>(base)), static_cast<double>(e)));
      f = yarn ? yarn_blend(p, rs.factor, ramp, i) : 1.0f / p;
    } else if (yarn) {
      f = yarn_blend(std::pow(base, static_cast<double>(2 * i) / static_cast<double>(dim)), rs.factor, ramp, i);
    } else {
      f = std::pow(base, -static_cast<double>(2 * i) / static_cast<double>(dim));
    }
  }
  if (rs.type == RopeScalingType::kFreqFactors) {  // llama.cpp: theta / freq_factor
    for (int64_t i = 0; i < half; ++i) {
      auto& f = inv[static_cast<size_t>(i)];
      const double ff = rs.freq_factors[static_cast<size_t>(i)];
      f = f32 ? static_cast<double>(static_cast<float>(f) / static_cast<float>(ff)) : f / ff;
    }
  } else if (rs.type == RopeScalingType::kLinear) {
    for (auto& f : inv) f = f32 ? static_cast<float>(static_cast<float>(f) / static_cast<float>(rs.factor)) : f / rs.factor;
  } else if (rs.type == RopeScalingType::kLlama3) {
    const double old_len = static_cast<double>(rs.original_max_position_embeddings);
    const double low_wavelen = old_len / rs.low_freq_factor;
    const double high_wavelen = old_len / rs.high_freq_factor;
    for (auto& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      double v = f;
      if (wavelen > low_wavelen) {
        v = f / rs.factor;
      } else if (!(wavelen < high_wavelen)) {  // medium band: interpolate
        const double smooth = (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        v = (1.0 - smooth) * f / rs.factor + smooth * f;
      }
      f = f32 ? static_cast<double>(static_cast<float>(v)) : v;
    }
  }
}

Transformer::Transformer(ModelConfig config, ModelWeights weights, Device device)
    : config_(std::move(config)), weights_(std::move(weights)), ops_(&backend::ops_for(device)) {
  config_.validate("model config");
  // Re-check shapes and dtypes through the same path a checkpoint takes.
  TensorMap named;
  for (const auto& p : weights_.params(config_)) {
    ASTRAI_CHECK(p.tensor->defined(), "model weights: parameter \"", p.name, "\" is not set");
    ASTRAI_CHECK(p.tensor->device() == Device::kCpu, "model weights: parameter \"", p.name,
                 "\" is not in host memory (weights are loaded on the host, then copied to the device)");
    named.emplace(p.name, *p.tensor);
  }
  weights_ = ModelWeights::from_tensors(config_, named, "model weights");
  // The backend's view: matrices as stored, vectors (norms, biases) converted to f32 once, all
  // copied to the backend's memory unless it is the host's.
  view_ = map_params<backend::Weight>(config_, weights_, [&](const ParamInfo& info, Tensor& t) {
    const bool vector = info.kind == ParamKind::kNorm || info.kind == ParamKind::kBias;
    Tensor use = vector ? f32_vector(t) : t;
    if (use.raw() != t.raw()) owned_.push_back(use);
    if (ops_->device() != Device::kCpu) {
      use = backend::to_backend(*ops_, use);
      owned_.push_back(use);
    }
    return backend::weight_of(use);
  });
  for (const auto& p : weights_.params(config_))
    if (p.tensor->is_mapped()) mapped_bytes_ += p.tensor->nbytes();
  // Where the backend reads every parameter, and its type and shape (a recorded decode step
  // holds these addresses and sizes).
  weights_key_ = 0xcbf29ce484222325ull;
  auto mix = [&](uint64_t v) { weights_key_ = (weights_key_ ^ v) * 0x100000001b3ull; };
  for_each_param(config_, view_, [&](const ParamInfo&, const backend::Weight& w) {
    mix(reinterpret_cast<uintptr_t>(w.data));
    mix(static_cast<uint64_t>(w.dtype));
    mix(static_cast<uint64_t>(w.rows));
    mix(static_cast<uint64_t>(w.cols));
  });
}

Transformer Transformer::load(const std::string& dir, WeightPlacement placement, Device device,
                              const std::string& lora_dir) {
  Checkpoint ck = load_checkpoint(dir, placement);
  if (!lora_dir.empty()) merge_lora(ck.config, &ck.weights, load_lora(lora_dir), lora_dir);
  return Transformer(std::move(ck.config), std::move(ck.weights), device);
}

PagedKv Transformer::kv_geometry(int32_t page_size, DType dtype) const {
  PagedKv kv;
  kv.page_size = page_size;
  kv.dtype = dtype;
  kv.num_kv_heads = static_cast<int32_t>(config_.num_key_value_heads);
  kv.k_head_dim = static_cast<int32_t>(config_.qk_head_dim());
  kv.v_head_dim = static_cast<int32_t>(config_.v_dim());
  return kv;
}

int64_t Transformer::kv_bytes_per_token(DType dtype) const {
  return config_.num_hidden_layers * config_.num_key_value_heads * (config_.qk_head_dim() + config_.v_dim()) *
         static_cast<int64_t>(dtype_size(dtype));
}

int64_t Transformer::layer_macs_per_token() const {
  int64_t n = 0;
  for (const auto& p : weights_.params(config_))
    if (p.shape.size() == 2 && p.name != "model.embed_tokens.weight" && p.name != "lm_head.weight")
      n += shape_numel(p.shape);
  return n;
}

void Transformer::validate_batch(const Batch& b, const PagedKv* kv) const {
  const int64_t t = b.num_tokens();
  ASTRAI_CHECK(b.positions.size() == b.tokens.size(), "batch: ", b.positions.size(), " positions for ", t, " tokens");
  for (int64_t i = 0; i < t; ++i) {
    const int32_t id = b.tokens[static_cast<size_t>(i)];
    if (id < 0 || id >= config_.vocab_size)
      fail("token id ", id, " at batch row ", i, " is outside the vocabulary [0, ", config_.vocab_size, ")");
    ASTRAI_CHECK(b.positions[static_cast<size_t>(i)] >= 0, "batch: negative position at row ", i);
  }
  if (kv != nullptr) {
    ASTRAI_CHECK(kv->page_size > 0, "paged KV: page_size must be positive");
    ASTRAI_CHECK(kv->dtype == DType::kF32 || kv->dtype == DType::kBF16, "paged KV: elements must be F32 or BF16, not ",
                 dtype_name(kv->dtype));
    ASTRAI_CHECK(kv->num_kv_heads == config_.num_key_value_heads && kv->k_head_dim == config_.qk_head_dim() &&
                     kv->v_head_dim == config_.v_dim(),
                 "paged KV: geometry (kv heads ", kv->num_kv_heads, ", k ", kv->k_head_dim, ", v ", kv->v_head_dim,
                 ") does not match the model (", config_.num_key_value_heads, ", ", config_.qk_head_dim(), ", ",
                 config_.v_dim(), ")");
    ASTRAI_CHECK(static_cast<int64_t>(kv->k_pages.size()) == config_.num_hidden_layers &&
                     static_cast<int64_t>(kv->v_pages.size()) == config_.num_hidden_layers,
                 "paged KV: need one page base per layer (", config_.num_hidden_layers, ")");
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l)
      ASTRAI_CHECK(kv->k_pages[static_cast<size_t>(l)] && kv->v_pages[static_cast<size_t>(l)],
                   "paged KV: null page base for layer ", l);
  }
  int64_t next = 0;
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const SeqSpan& sp = b.seqs[s];
    ASTRAI_CHECK(sp.token_begin == next && sp.num_tokens >= 0 && next + sp.num_tokens <= t, "batch: sequence ", s,
                 " covers rows [", sp.token_begin, ", ", sp.token_begin + sp.num_tokens,
                 ") but sequences must tile the tokens in order (next row ", next, " of ", t, ")");
    next += sp.num_tokens;
    ASTRAI_CHECK(sp.context_len >= 0, "batch: sequence ", s, " has negative context_len");
    if (kv == nullptr) {
      ASTRAI_CHECK(sp.context_len == 0, "batch: sequence ", s, " has context_len ", sp.context_len,
                   " but the forward runs without a KV cache");
    } else {
      const int64_t len = static_cast<int64_t>(sp.context_len) + sp.num_tokens;
      const int64_t pages = (len + kv->page_size - 1) / kv->page_size;
      ASTRAI_CHECK(static_cast<int64_t>(sp.page_table.size()) >= pages, "batch: sequence ", s, " needs ", pages,
                   " pages for ", len, " positions but its page table has ", sp.page_table.size());
      for (int64_t p = 0; p < pages; ++p)
        ASTRAI_CHECK(sp.page_table[static_cast<size_t>(p)] >= 0, "batch: sequence ", s, " has a negative page id");
    }
  }
  ASTRAI_CHECK(next == t, "batch: sequences cover ", next, " of ", t, " tokens");
  for (size_t i = 0; i < b.logit_rows.size(); ++i)
    ASTRAI_CHECK(b.logit_rows[i] >= 0 && b.logit_rows[i] < t, "batch: logit row ", b.logit_rows[i],
                 " is outside [0, ", t, ")");
}

void Transformer::rope_tables(const Batch& b, ForwardWorkspace& ws) const {
  const int64_t half = config_.rope_dim() / 2;
  float* cos = ws.cos_.data();
  float* sin = ws.sin_.data();
  const bool f32 = hf_rope_precision(config_);
  const bool dynamic = config_.rope_scaling.type == RopeScalingType::kDynamic;
  const float scale = rope_attention_factor(config_);
  if (!dynamic) {  // one set of frequencies: every row's tables at once
    rope_inv_freq_into(config_, 0, ws.inv_freq_);
    ops_->rope_tables(ws.inv_freq_.data(), half, b.positions.data(), b.num_tokens(), f32, scale, cos, sin);
    return;
  }
  for (const SeqSpan& sp : b.seqs) {
    if (sp.num_tokens == 0) continue;
    const int32_t* pos = b.positions.data() + sp.token_begin;
    // Hugging Face rescales by the longest position of the forward call; per sequence here,
    // so a sequence's logits never depend on what else is batched.
    const int32_t max_pos = *std::max_element(pos, pos + sp.num_tokens);
    rope_inv_freq_into(config_, static_cast<int64_t>(max_pos) + 1, ws.inv_freq_);
    ops_->rope_tables(ws.inv_freq_.data(), half, pos, sp.num_tokens, f32, scale, cos + sp.token_begin * half,
                      sin + sp.token_begin * half);
  }
}

uint64_t Transformer::decode_step_key(const Batch& b, const PagedKv& kv, const ForwardWorkspace& ws,
                                      const float* logits) const {
  uint64_t key = 0xcbf29ce484222325ull;  // FNV-1a over the shapes and every address
  auto mix = [&](uint64_t v) { key = (key ^ v) * 0x100000001b3ull; };
  mix(static_cast<uint64_t>(b.num_tokens()));
  mix(b.logit_rows.size());
  mix(static_cast<uint64_t>(kv.page_size));
  mix(static_cast<uint64_t>(kv.dtype));
  for (const backend::Buffer* buf : {&ws.x_, &ws.xn_, &ws.q_, &ws.k_, &ws.v_, &ws.attn_, &ws.gate_, &ws.mlp_gate_,
                                     &ws.mlp_up_, &ws.latent_, &ws.kvb_, &ws.out_rows_, &ws.cos_, &ws.sin_})
    mix(reinterpret_cast<uintptr_t>(buf->data()));
  mix(reinterpret_cast<uintptr_t>(logits));
  mix(weights_key_);
  for (size_t l = 0; l < kv.k_pages.size(); ++l) {
    mix(reinterpret_cast<uintptr_t>(kv.k_pages[l]));
    mix(reinterpret_cast<uintptr_t>(kv.v_pages[l]));
  }
  return key;
}

void Transformer::forward(const Batch& b, const PagedKv* kv, ForwardWorkspace& ws, float* logits) const {
  ForwardClock clock(ws.profile);
  ws.kept_rows_ = 0;
  validate_batch(b, kv);
  const ModelConfig& c = config_;
  const backend::Ops& ops = *ops_;
  const int64_t t = b.num_tokens();
  if (t == 0) return;
  const int64_t h = c.hidden_size, f = c.intermediate_size;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, qkd = c.qk_head_dim(), vd = c.v_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t rows = b.logit_rows.empty() ? t : static_cast<int64_t>(b.logit_rows.size());

  ws.seqs_.clear();
  for (const SeqSpan& sp : b.seqs)
    ws.seqs_.push_back(backend::SeqRange{sp.token_begin, sp.num_tokens, kv ? sp.context_len : 0,
                                         kv ? sp.page_table.data() : nullptr});

  // Every buffer is in place before the operations start (a cached step allocates nothing).
  // Shared scratch for every layer; the residual stream x is updated in place (layer.h's aliases).
  const int64_t half = c.rope_dim() / 2;
  ws.cos_.grow(ops, static_cast<size_t>(t * half));
  ws.sin_.grow(ops, static_cast<size_t>(t * half));
  LayerActs A;
  A.x_in = A.x_mid = A.x_out = ws.x_.grow(ops, static_cast<size_t>(t * h));
  A.xn1 = A.xn2 = ws.xn_.grow(ops, static_cast<size_t>(std::max(t, rows) * h));
  A.q = A.q_raw = ws.q_.grow(ops, static_cast<size_t>(t * nh * qkd));
  A.k = A.k_raw = ws.k_.grow(ops, static_cast<size_t>(t * nkv * qkd));
  A.v = ws.v_.grow(ops, static_cast<size_t>(t * nkv * vd));
  if (c.is_mla()) {
    A.lat = A.lat_raw = ws.latent_.grow(ops, static_cast<size_t>(t * c.kv_lora_rank));
    A.kvb = ws.kvb_.grow(ops, static_cast<size_t>(t * nkv * (qkd + vd)));
  }
  A.att = A.y = ws.attn_.grow(ops, static_cast<size_t>(t * nh * vd));
  if (c.gated_attention) A.gs = ws.gate_.grow(ops, static_cast<size_t>(t * nh * vd));
  A.o_out = A.down_out = ws.out_rows_.grow(ops, static_cast<size_t>(t * h));
  A.a = A.h = ws.mlp_gate_.grow(ops, static_cast<size_t>(t * f));
  A.b = ws.mlp_up_.grow(ops, static_cast<size_t>(t * f));
  const size_t n_logits = static_cast<size_t>(rows * c.vocab_size);
  // The host's logits directly on the CPU; on a device, its own buffer, copied back after
  // unless the caller keeps them there (logits == nullptr).
  float* out = logits != nullptr && ops.device() == Device::kCpu ? logits : ws.logits_.grow(ops, n_logits);
  ws.kept_rows_ = logits == nullptr ? rows : 0;

  auto body = [&] {
    rope_tables(b, ws);
    ops.embedding(view_.embed_tokens, b.tokens.data(), t, A.x_in);
    clock.mark(ForwardOp::kEmbed);
    LayerInput in{t, ws.seqs_.data(), static_cast<int64_t>(ws.seqs_.size()), ws.cos_.data(), ws.sin_.data(), nullptr};
    backend::KvPages pages;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      if (kv != nullptr) {
        pages = backend::KvPages{kv->k_pages[static_cast<size_t>(l)], kv->v_pages[static_cast<size_t>(l)],
                                 kv->page_size, kv->dtype};
        in.kv = &pages;
      }
      layer_forward(ops, c, view_.layers[static_cast<size_t>(l)], in, A, clock);
    }
    // Only the rows whose logits are wanted go through the final norm and the LM head.
    float* sel = A.xn1;
    if (!b.logit_rows.empty()) {
      ops.gather_rows(A.x_out, h, b.logit_rows.data(), rows, sel);
      ops.rmsnorm(sel, rows, h, view_.norm.f32(), eps, sel, nullptr);
    } else {
      ops.rmsnorm(A.x_out, t, h, view_.norm.f32(), eps, sel, nullptr);
    }
    ops.linear(sel, rows, view_.lm_head, nullptr, out);
  };
  // Decode steps (one new token per sequence, through the cache) may be recorded and
  // replayed by the backend (Ops::run_cached): the key names everything the recording
  // holds fixed, the shapes and every buffer, so a step that differs in any runs afresh.
  const bool decode = kv != nullptr && std::all_of(b.seqs.begin(), b.seqs.end(),
                                                   [](const SeqSpan& sp) { return sp.num_tokens == 1; });
  if (decode) ops.run_cached(decode_step_key(b, *kv, ws, out), body);
  else body();
  if (logits != nullptr && out != logits) ops.to_host(logits, out, n_logits * sizeof(float));
  clock.mark(ForwardOp::kLmHead);
}

void Transformer::copy_logits(const ForwardWorkspace& ws, int64_t first, int64_t count, float* host) const {
  ASTRAI_CHECK(first >= 0 && count >= 0 && first + count <= ws.kept_rows_, "copy_logits: rows [", first, ", ",
               first + count, ") outside the ", ws.kept_rows_, " rows the last forward kept");
  const size_t v = static_cast<size_t>(config_.vocab_size);
  ops_->to_host(host, ws.logits_.data() + static_cast<size_t>(first) * v, static_cast<size_t>(count) * v * sizeof(float));
}

void Transformer::sample(const ForwardWorkspace& ws, const backend::SampleSpec* specs, int64_t n,
                         backend::SampleResult* out) const {
  ops_->sample(ws.logits_.data(), ws.kept_rows_, config_.vocab_size, specs, n, out);
}

}  // namespace astrai::model
