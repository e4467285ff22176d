#include "train/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "model/transformer.h"

namespace astrai::train {

namespace {

// The forward's (model/transformer.cc) choice: HF families compute RoPE angles in f32, the
// reference autoregressive_lm in f64.
bool f32_rope_angles(const model::ModelConfig& c) { return c.model_type != "autoregressive_lm"; }

int64_t pad(int64_t n) { return (n + 15) / 16 * 16; }

// Points a layer's saved activations (all but x_in, x_out and the MLA scratch kvb) at slices
// from take(n) (null for n == 0). The o_proj output lands in x_mid and the residual is added
// onto it (layer.h allows o_out == x_mid).
template <typename Take>
void bind_layer_acts(const model::ModelConfig& c, int64_t T, model::LayerActs& A, Take&& take) {
  const int64_t D = c.hidden_size, I = c.intermediate_size, H = c.num_attention_heads, KV = c.num_key_value_heads;
  const int64_t QD = H * c.qk_head_dim(), KD = KV * c.qk_head_dim(), VD = KV * c.v_dim(), OD = H * c.v_dim();
  const int64_t R = c.is_mla() ? c.kv_lora_rank : 0;
  const bool qn = c.qk_norm, gate = c.gated_attention;
  A.xn1 = take(T * D);
  A.rstd1 = take(T);
  A.q_raw = take(qn ? T * QD : 0);
  A.k_raw = take(qn ? T * KD : 0);
  A.rstd_q = take(qn ? T * H : 0);
  A.rstd_k = take(qn ? T * KV : 0);
  A.q = take(T * QD);
  A.k = take(T * KD);
  A.v = take(T * VD);
  A.lat_raw = take(T * R);
  A.rstd_kv = take(R > 0 ? T : 0);
  A.lat = take(T * R);
  A.att = take(T * OD);
  A.lse = take(T * H);
  A.gs = take(gate ? T * OD : 0);
  A.y = take(gate ? T * OD : 0);
  A.x_mid = A.o_out = take(T * D);
  A.xn2 = take(T * D);
  A.rstd2 = take(T);
  A.a = take(T * I);
  A.b = take(T * I);
  A.h = take(T * I);
}

}  // namespace

TrainModel::TrainModel(const model::ModelConfig& config, bool recompute, bool trainable, Device device)
    : ops_(backend::ops_for(device)), cfg_(config), recompute_(recompute), trainable_(trainable), layout_(cfg_),
      grads_(trainable ? layout_.total() : 0, ops_) {
  cfg_.validate("model config");
  if (trainable_) {
    bind_params(bind_tensors(cfg_, layout_, owned_params()));
    g_ = bind_tensors(cfg_, layout_, grads_.data());
  } else {
    g_.layers.resize(static_cast<size_t>(cfg_.num_hidden_layers));  // every gradient slot null
  }
  if (cfg_.rope_scaling.type != model::RopeScalingType::kDynamic) model::rope_inv_freq_into(cfg_, 0, inv_freq_);
}

float* TrainModel::owned_params() {
  if (params_.size() == 0) params_ = FloatBuffer(layout_.total(), ops_);
  return params_.data();
}

void TrainModel::bind_params(const ModelTensors& p, const std::map<std::string, DType>& dtypes) {
  p_ = p;
  view_ = model::map_params<backend::Weight>(cfg_, p_, [&](const model::ParamInfo& info, float* w) {
    auto it = dtypes.find(info.name);
    const DType dtype = it == dtypes.end() ? DType::kF32 : it->second;
    return backend::Weight{w, dtype, info.shape[0], info.shape.size() > 1 ? info.shape[1] : 1};
  });
}

void TrainModel::prepare(const TrainBatch& batch) {
  const int64_t T = batch.num_tokens(), half = cfg_.rope_dim() / 2;
  float* cos = rope_cos_.grow(ops_, static_cast<size_t>(T * half));
  float* sin = rope_sin_.grow(ops_, static_cast<size_t>(T * half));
  const bool dynamic = cfg_.rope_scaling.type == model::RopeScalingType::kDynamic;
  const bool f32 = f32_rope_angles(cfg_);
  const float scale = model::rope_attention_factor(cfg_);
  int64_t covered = 0;
  seqs_.clear();
  for (const auto& sp : batch.docs) {
    covered += sp.len;
    seqs_.push_back(backend::SeqRange{sp.begin, sp.len, 0, nullptr});
    if (sp.len == 0) continue;
    const int32_t* pos = batch.positions.data() + sp.begin;
    if (dynamic) {
      // As the inference forward: frequencies from the longest position of this document.
      const int32_t max_pos = *std::max_element(pos, pos + sp.len);
      model::rope_inv_freq_into(cfg_, static_cast<int64_t>(max_pos) + 1, inv_freq_);
    }
    ops_.rope_tables(inv_freq_.data(), half, pos, sp.len, f32, scale, cos + sp.begin * half, sin + sp.begin * half);
  }
  ASTRAI_CHECK(covered == T, "training batch: documents cover ", covered, " of ", T, " tokens");
}

model::LayerInput TrainModel::layer_input(const TrainBatch& batch) const {
  return model::LayerInput{batch.num_tokens(), seqs_.data(), static_cast<int64_t>(seqs_.size()), rope_cos_.data(),
                           rope_sin_.data(), nullptr};
}

model::LayerActs& TrainModel::acts_of(int64_t l) {
  model::LayerActs& A = layer_acts_[static_cast<size_t>(l)];
  A.x_out = A.down_out = l + 1 < cfg_.num_hidden_layers ? layer_acts_[static_cast<size_t>(l + 1)].x_in : x_final_;
  A.kvb = kvb_;
  return A;
}

size_t TrainModel::num_params() const {
  size_t n = 0;
  for (const auto& s : layout_.specs()) n += s.numel;
  return n;
}

void TrainModel::init_weights(uint64_t seed, float std) {
  held_.clear();
  bind_params(bind_tensors(cfg_, layout_, owned_params()));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, std);
  std::vector<float> host;  // one tensor at a time, then into the device's memory
  for (const auto& s : layout_.specs()) {
    host.resize(s.numel);
    const bool is_norm = s.kind == model::ParamKind::kNorm;
    const bool is_bias = s.kind == model::ParamKind::kBias;
    for (size_t i = 0; i < s.numel; ++i) host[i] = is_norm ? 1.0f : is_bias ? 0.0f : normal(rng);
    ops_.to_device(params_.data() + s.offset, host.data(), s.numel * sizeof(float));
  }
}

namespace {

const Tensor& checked_tensor(const std::map<std::string, Tensor>& tensors, const ParamSpec& s,
                             const std::string& where) {
  auto it = tensors.find(s.name);
  ASTRAI_CHECK(it != tensors.end(), where, ": missing tensor \"", s.name, "\"");
  ASTRAI_CHECK(it->second.shape() == s.shape, where, ": tensor \"", s.name, "\" has shape ",
               shape_str(it->second.shape()), ", the config needs ", shape_str(s.shape));
  return it->second;
}

}  // namespace

void TrainModel::load_weights(const std::map<std::string, Tensor>& tensors, const std::string& where) {
  float* base = owned_params();
  std::vector<float> host;  // one tensor at a time, then into the device's memory
  for (const auto& s : layout_.specs()) {
    const Tensor& t = checked_tensor(tensors, s, where);
    ASTRAI_CHECK(t.device() == Device::kCpu, where, ": tensor \"", s.name, "\" is not in host memory");
    host.resize(s.numel);
    convert_to_f32(t.dtype(), t.raw(), host.data(), s.numel);
    ops_.to_device(base + s.offset, host.data(), s.numel * sizeof(float));
  }
  held_.clear();
  bind_params(bind_tensors(cfg_, layout_, base));
}

void TrainModel::copy_parameters_from(const TrainModel& other) {
  ASTRAI_CHECK(other.layout_.total() == layout_.total(), "copy_parameters_from: different architectures");
  load_weights(other.weights(), "copy_parameters_from");
}

void TrainModel::view_weights(const std::map<std::string, Tensor>& tensors, const std::string& where) {
  ASTRAI_CHECK(!trainable_, "view_weights: the model is trainable (it owns its parameters)");
  ASTRAI_CHECK(device() == Device::kCpu, "view_weights: a model on ", device_name(device()),
               " copies its weights (load_weights)");
  std::map<std::string, Tensor> held;
  std::map<std::string, DType> dtypes;  // of the matrices read in place as bf16/f16
  ModelTensors p;
  size_t i = 0;  // the layout lists the parameters in the schema's order
  model::for_each_param(cfg_, p, [&](const model::ParamInfo&, float*& slot) {
    const ParamSpec& s = layout_.specs()[i++];
    const Tensor& t = checked_tensor(tensors, s, where);
    const bool aligned = reinterpret_cast<uintptr_t>(t.raw()) % dtype_size(t.dtype()) == 0;
    // Matrices in f32, bf16 or f16 are read where they lie (the linear and embedding kernels
    // take each); vectors (norms, biases) are read as f32, so those are converted.
    const bool matrix = s.shape.size() == 2;
    const bool in_place = aligned && (t.dtype() == DType::kF32 ||
                                      (matrix && (t.dtype() == DType::kBF16 || t.dtype() == DType::kF16)));
    if (in_place) {
      slot = static_cast<float*>(t.raw());  // typed by `dtypes` for the backend
      held.emplace(s.name, t);
      if (t.dtype() != DType::kF32) dtypes.emplace(s.name, t.dtype());
    } else {  // a small buffer of its own (the rest of the model is not allocated)
      FloatBuffer converted(s.numel);
      convert_to_f32(t.dtype(), t.raw(), converted.data(), s.numel);
      slot = converted.data();
      held.emplace(s.name, buffer_view(converted, 0, s.shape));
    }
  });
  if (cfg_.tie_word_embeddings) p.lm_head = p.embed_tokens;  // map_params gives it the embedding's dtype
  held_ = std::move(held);
  bind_params(p, dtypes);
}

std::map<std::string, Tensor> TrainModel::weights() const {
  return held_.empty() ? tensor_views(layout_, on_host(params_)) : held_;
}

void TrainModel::set_adapters(std::vector<model::LayerLora> adapters, int64_t rank) {
  ASTRAI_CHECK(adapters.empty() || static_cast<int64_t>(adapters.size()) == cfg_.num_hidden_layers,
               "set_adapters: one entry per layer");
  ASTRAI_CHECK(adapters.empty() || device() == Device::kCpu, "LoRA adapters train on the CPU only, not on ",
               device_name(device()));
  lora_ = std::move(adapters);
  lora_rank_ = rank;
  lora_dropout_.clear();
  for (const auto& L : lora_)
    for (auto which : kLoraProjections) lora_dropout_.push_back((L.*which).dropout);
  capacity_ = 0;  // the adapters' activations are sized with the rest
}

const model::LayerLora* TrainModel::lora_of(int64_t l) {
  if (lora_.empty()) return nullptr;
  model::LayerLora& L = lora_[static_cast<size_t>(l)];
  for (size_t k = 0; k < kLoraProjections.size(); ++k) {
    model::ProjectionLora& p = L.*kLoraProjections[k];
    p.dropout = training_ ? lora_dropout_[static_cast<size_t>(l) * kLoraProjections.size() + k] : 0.0f;
    p.seed = lora_dropout_seed(dropout_seed_, l, static_cast<int64_t>(k));
  }
  return &L;
}

void TrainModel::zero_grads() {
  if (grads_.size() > 0) ops_.zero(grads_.data(), grads_.size());
}

void TrainModel::ensure_buffers(int64_t T) {
  if (T <= capacity_) return;
  const model::ModelConfig& c = cfg_;
  const int64_t D = c.hidden_size, V = c.vocab_size, layers = c.num_hidden_layers;
  const int64_t QD = c.num_attention_heads * c.qk_head_dim(), KD = c.num_key_value_heads * c.qk_head_dim();
  const int64_t VD = c.num_key_value_heads * c.v_dim(), OD = c.num_attention_heads * c.v_dim();
  const int64_t I = c.intermediate_size, R = c.is_mla() ? c.kv_lora_rank : 0;
  const int64_t kvb = R > 0 ? T * c.num_key_value_heads * (c.qk_head_dim() + c.v_dim()) : 0;
  const int64_t stored_layers = recompute_ ? 1 : layers;
  int64_t per_layer = 0;
  model::LayerActs sizing;
  bind_layer_acts(c, T, sizing, [&](int64_t n) -> float* {
    per_layer += pad(n);
    return nullptr;
  });
  const int64_t total = layers * pad(T * D) + stored_layers * per_layer + pad(T * D) * 2 + pad(T) + pad(T * V);
  acts_ = FloatBuffer(static_cast<size_t>(total), ops_);
  float* cur = acts_.data();
  auto take = [&](int64_t n) {
    float* p = n > 0 ? cur : nullptr;
    cur += pad(n);
    return p;
  };
  layer_acts_.assign(static_cast<size_t>(layers), model::LayerActs{});
  for (auto& A : layer_acts_) A.x_in = take(T * D);
  for (int64_t l = 0; l < layers; ++l) {
    model::LayerActs& A = layer_acts_[static_cast<size_t>(l)];
    if (l < stored_layers) {
      bind_layer_acts(c, T, A, take);
    } else {  // recompute: every layer shares layer 0's activations, only x_in is its own
      float* keep = A.x_in;
      A = layer_acts_[0];
      A.x_in = keep;
    }
  }
  x_final_ = take(T * D);
  xf_ = take(T * D);
  rstd_f_ = take(T);
  logits_ = take(T * V);

  const std::vector<int64_t> dsizes = {T * D, std::max(T * D, T * QD), T * QD, T * KD, T * VD,
                                       T * OD, T * OD, T * I, T * I, T * I, kvb, T * R};
  int64_t dtotal = 0;
  for (int64_t n : dsizes) dtotal += pad(n);
  scratch_ = FloatBuffer(static_cast<size_t>(dtotal), ops_);
  cur = scratch_.data();
  model::LayerGradScratch& s = grad_scratch_;
  d_res_ = take(dsizes[0]);
  s.d_xn = take(dsizes[1]);
  s.d_q = take(dsizes[2]);
  s.d_k = take(dsizes[3]);
  s.d_v = take(dsizes[4]);
  s.d_att = take(dsizes[5]);
  s.d_y = take(dsizes[6]);
  s.d_a = take(dsizes[7]);
  s.d_b = take(dsizes[8]);
  s.d_h = take(dsizes[9]);
  kvb_ = s.d_kvb = take(dsizes[10]);  // the forward's kv_b_proj output is dead by the backward's use
  s.d_lat = take(dsizes[11]);
  if (!lora_.empty()) bind_lora_acts(T);
  capacity_ = T;
}

void TrainModel::bind_lora_acts(int64_t T) {
  int64_t adapters = 0, max_in = 0, max_out = 0;
  for (const auto& L : lora_)
    for (auto which : kLoraProjections)
      if ((L.*which).defined()) {
        ++adapters;
        max_in = std::max(max_in, (L.*which).a.cols);
        max_out = std::max(max_out, (L.*which).b.rows);
      }
  const int64_t r = lora_rank_;
  lora_acts_ = FloatBuffer(static_cast<size_t>((adapters + 1) * pad(T * r) + 2 * pad(T * max_in) + pad(T * max_out)));
  float* cur = lora_acts_.data();
  auto take = [&](int64_t n) {
    float* p = cur;
    cur += pad(n);
    return p;
  };
  float *xd = take(T * max_in), *dxd = take(T * max_in), *tmp = take(T * max_out), *du = take(T * r);
  for (auto& L : lora_) {
    L.xd = xd;
    L.dxd = dxd;
    L.tmp = tmp;
    L.du = du;
    for (auto which : kLoraProjections)
      if ((L.*which).defined()) (L.*which).u = take(T * r);
  }
}

float* TrainModel::forward(const TrainBatch& batch) {
  const int64_t T = batch.num_tokens(), D = cfg_.hidden_size, layers = cfg_.num_hidden_layers;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  ASTRAI_CHECK(T > 0, "training batch is empty");
  ASTRAI_CHECK(p_.embed_tokens != nullptr, "the model has no weights (init, load or view them first)");
  ensure_buffers(T);
  prepare(batch);
  model::ForwardClock clock(profile_);
  ops_.embedding(view_.embed_tokens, batch.tokens.data(), T, layer_acts_[0].x_in);
  const model::LayerInput in = layer_input(batch);
  for (int64_t l = 0; l < layers; ++l)
    model::layer_forward(ops_, cfg_, view_.layers[static_cast<size_t>(l)], in, acts_of(l), clock, lora_of(l));
  ops_.rmsnorm(x_final_, T, D, view_.norm.f32(), eps, xf_, rstd_f_);
  ops_.linear(xf_, T, view_.lm_head, nullptr, logits_);
  return logits_;
}

void TrainModel::backward(const TrainBatch& batch, float* dlogits) {
  ASTRAI_CHECK(trainable_ || !lora_.empty(), "backward on a frozen model without adapters");
  const int64_t T = batch.num_tokens(), D = cfg_.hidden_size, layers = cfg_.num_hidden_layers;
  ASTRAI_CHECK(T <= capacity_, "backward without a matching forward");
  model::ForwardClock clock(profile_);
  const model::LayerInput in = layer_input(batch);
  ops_.linear_backward(dlogits, xf_, T, view_.lm_head, grad_scratch_.d_xn, false, g_.lm_head, nullptr);
  ops_.rmsnorm_backward(grad_scratch_.d_xn, x_final_, view_.norm.f32(), rstd_f_, T, D, d_res_, false, g_.norm);
  if (grad_hook_) grad_hook_(layers);
  for (int64_t l = layers - 1; l >= 0; --l) {
    const model::LayerView& w = view_.layers[static_cast<size_t>(l)];
    model::LayerActs& A = acts_of(l);
    const model::LayerLora* lora = lora_of(l);
    if (recompute_) model::layer_forward(ops_, cfg_, w, in, A, clock, lora);
    model::layer_backward(ops_, cfg_, w, g_.layers[static_cast<size_t>(l)], in, A, grad_scratch_, d_res_, lora);
    if (grad_hook_) grad_hook_(l);
  }
  if (g_.embed_tokens != nullptr) ops_.embedding_backward(d_res_, batch.tokens.data(), T, D, g_.embed_tokens);
  if (grad_hook_) grad_hook_(-1);
}

std::unique_ptr<TrainModel> make_reference(const TrainModel& policy) {
  // Forward only: recomputation mode keeps just each layer's input, the least memory.
  auto ref = std::make_unique<TrainModel>(policy.config(), /*recompute=*/true, /*trainable=*/false, policy.device());
  if (policy.trainable()) ref->copy_parameters_from(policy);
  else ref->view_weights(policy.weights(), "the LoRA base");
  return ref;
}

}  // namespace astrai::train
