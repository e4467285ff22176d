#include "model/layer.h"

#include <cmath>

namespace astrai::model {

namespace {

// Sizes a layer works with, from the config.
struct Dims {
  int64_t T, D, I, H, KV, qkd, vd, rope, half, rot_offset, R, OD;
  float eps;
  Dims(const ModelConfig& c, int64_t tokens)
      : T(tokens), D(c.hidden_size), I(c.intermediate_size), H(c.num_attention_heads), KV(c.num_key_value_heads),
        qkd(c.qk_head_dim()), vd(c.v_dim()), rope(c.rope_dim()), half(c.rope_dim() / 2),
        rot_offset(c.qk_head_dim() - c.rope_dim()), R(c.is_mla() ? c.kv_lora_rank : 0),
        OD(c.num_attention_heads * c.v_dim()), eps(static_cast<float>(c.rms_norm_eps)) {}
};

backend::AttnDims attn_dims(const Dims& d) {
  return backend::AttnDims{d.H, d.KV, d.qkd, d.vd, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.qkd)))};
}

// ---- LoRA adapters on projections (null lora or an undefined adapter: nothing to do) ----

using Adapter = ProjectionLora LayerLora::*;

// out [T, out] += dropout(x)·Aᵀ·B̃ᵀ; saves u = dropout(x)·Aᵀ.
void adapter_forward(const backend::Ops& ops, const LayerLora* l, Adapter which, const float* x, int64_t T,
                     float* out) {
  if (l == nullptr || !(l->*which).defined()) return;
  const ProjectionLora& p = l->*which;
  const float* xin = x;
  if (p.dropout > 0) {
    ops.dropout(x, T * p.a.cols, p.dropout, p.seed, l->xd);
    xin = l->xd;
  }
  ops.linear(xin, T, p.a, nullptr, p.u);
  ops.linear(p.u, T, p.b, nullptr, l->tmp);
  ops.add(out, l->tmp, T * p.b.rows, out);
}

// Given dy = dL/d(out): dB̃ += dyᵀ·u, dA += duᵀ·dropout(x) with du = dy·B̃, and
// dx += dropout(du·A) (dx already holds the base projection's share).
void adapter_backward(const backend::Ops& ops, const LayerLora* l, Adapter which, const float* dy, const float* x,
                      int64_t T, float* dx) {
  if (l == nullptr || !(l->*which).defined()) return;
  const ProjectionLora& p = l->*which;
  ops.linear_backward(dy, p.u, T, p.b, l->du, false, p.db, nullptr);
  if (p.dropout == 0) {
    ops.linear_backward(l->du, x, T, p.a, dx, true, p.da, nullptr);
    return;
  }
  const int64_t n = T * p.a.cols;
  ops.dropout(x, n, p.dropout, p.seed, l->xd);
  ops.linear_backward(l->du, l->xd, T, p.a, l->dxd, false, p.da, nullptr);
  ops.dropout(l->dxd, n, p.dropout, p.seed, l->dxd);
  ops.add(dx, l->dxd, n, dx);
}

// Rotates q [T, H, qkd] and k [T, KV, qkd] (inverse: the backward).
void rope_qk(const backend::Ops& ops, const ModelConfig& c, const Dims& d, const LayerInput& in, float* q, float* k,
             bool inverse) {
  ops.rope(q, d.T, d.H, d.qkd, d.rot_offset, d.half, in.cos, in.sin, c.rope_pairing, inverse);
  ops.rope(k, d.T, d.KV, d.qkd, d.rot_offset, d.half, in.cos, in.sin, c.rope_pairing, inverse);
}

// ---- projections to q, k, v (with MLA's latent, qk-norm and RoPE) ----

void qkv_forward(const backend::Ops& ops, const ModelConfig& c, const Dims& d, const LayerView& w,
                 const LayerInput& in, const LayerActs& A, ForwardClock& clock, const LayerLora* lora) {
  float* q = c.qk_norm ? A.q_raw : A.q;
  float* k = c.qk_norm ? A.k_raw : A.k;
  if (c.is_mla()) {
    ops.linear(A.xn1, d.T, w.q_proj, w.q_bias.f32(), q);
    adapter_forward(ops, lora, &LayerLora::q, A.xn1, d.T, q);
    // [k_nope | k_rope | v] per kv head = rmsnorm(xn1·Wkv_a^T)·Wkv_b^T.
    ops.linear(A.xn1, d.T, w.kv_a_proj, nullptr, A.lat_raw);
    ops.rmsnorm(A.lat_raw, d.T, d.R, w.kv_norm.f32(), d.eps, A.lat, A.rstd_kv);
    ops.linear(A.lat, d.T, w.kv_b_proj, nullptr, A.kvb);
    ops.split_rows(A.kvb, d.T * d.KV, d.qkd, d.vd, k, A.v);
  } else {  // q, k and v of one x: one job where the backend can
    const backend::LinearTarget qkv[] = {
        {w.q_proj, w.q_bias.f32(), q}, {w.k_proj, w.k_bias.f32(), k}, {w.v_proj, w.v_bias.f32(), A.v}};
    ops.linear_group(A.xn1, d.T, qkv, 3);
    adapter_forward(ops, lora, &LayerLora::q, A.xn1, d.T, q);
    adapter_forward(ops, lora, &LayerLora::k, A.xn1, d.T, k);
    adapter_forward(ops, lora, &LayerLora::v, A.xn1, d.T, A.v);
  }
  clock.mark(ForwardOp::kQkvProj);
  auto qk_norm = [&] {
    ops.rmsnorm(A.q_raw, d.T * d.H, d.qkd, w.q_norm.f32(), d.eps, A.q, A.rstd_q);
    ops.rmsnorm(A.k_raw, d.T * d.KV, d.qkd, w.k_norm.f32(), d.eps, A.k, A.rstd_k);
    clock.mark(ForwardOp::kNorm);
  };
  if (c.qk_norm && c.qk_norm_after_rope) {  // rope the raw projections, then norm them
    rope_qk(ops, c, d, in, A.q_raw, A.k_raw, false);
    clock.mark(ForwardOp::kRope);
    qk_norm();
  } else {
    if (c.qk_norm) qk_norm();
    rope_qk(ops, c, d, in, A.q, A.k, false);
    clock.mark(ForwardOp::kRope);
  }
}

// Given d_q and d_k (after attention), accumulates into s.d_xn (written first when !have_dxn)
// and the projection gradients.
void qkv_backward(const backend::Ops& ops, const ModelConfig& c, const Dims& d, const LayerView& w,
                  const LayerParams<float*>& g, const LayerInput& in, const LayerActs& A, const LayerGradScratch& s,
                  bool have_dxn, const LayerLora* lora) {
  if (c.is_mla()) {
    rope_qk(ops, c, d, in, s.d_q, s.d_k, true);
    ops.linear_backward(s.d_q, A.xn1, d.T, w.q_proj, s.d_xn, have_dxn, g.q_proj, g.q_bias);
    adapter_backward(ops, lora, &LayerLora::q, s.d_q, A.xn1, d.T, s.d_xn);
    ops.join_rows(s.d_k, s.d_v, d.T * d.KV, d.qkd, d.vd, s.d_kvb);
    ops.linear_backward(s.d_kvb, A.lat, d.T, w.kv_b_proj, s.d_lat, false, g.kv_b_proj, nullptr);
    ops.rmsnorm_backward(s.d_lat, A.lat_raw, w.kv_norm.f32(), A.rstd_kv, d.T, d.R, s.d_lat, false, g.kv_norm);
    ops.linear_backward(s.d_lat, A.xn1, d.T, w.kv_a_proj, s.d_xn, true, g.kv_a_proj, nullptr);
    return;
  }
  const bool rope_first = c.qk_norm && c.qk_norm_after_rope;  // forward: rope, then norm
  if (!rope_first) rope_qk(ops, c, d, in, s.d_q, s.d_k, true);
  if (c.qk_norm) {
    ops.rmsnorm_backward(s.d_q, A.q_raw, w.q_norm.f32(), A.rstd_q, d.T * d.H, d.qkd, s.d_q, false, g.q_norm);
    ops.rmsnorm_backward(s.d_k, A.k_raw, w.k_norm.f32(), A.rstd_k, d.T * d.KV, d.qkd, s.d_k, false, g.k_norm);
  }
  if (rope_first) rope_qk(ops, c, d, in, s.d_q, s.d_k, true);
  ops.linear_backward(s.d_q, A.xn1, d.T, w.q_proj, s.d_xn, have_dxn, g.q_proj, g.q_bias);
  adapter_backward(ops, lora, &LayerLora::q, s.d_q, A.xn1, d.T, s.d_xn);
  ops.linear_backward(s.d_k, A.xn1, d.T, w.k_proj, s.d_xn, true, g.k_proj, g.k_bias);
  adapter_backward(ops, lora, &LayerLora::k, s.d_k, A.xn1, d.T, s.d_xn);
  ops.linear_backward(s.d_v, A.xn1, d.T, w.v_proj, s.d_xn, true, g.v_proj, g.v_bias);
  adapter_backward(ops, lora, &LayerLora::v, s.d_v, A.xn1, d.T, s.d_xn);
}

// ---- attention, the output gate and o_proj ----

void attention_forward(const backend::Ops& ops, const ModelConfig& c, const Dims& d, const LayerView& w,
                       const LayerInput& in, const LayerActs& A, ForwardClock& clock, const LayerLora* lora) {
  qkv_forward(ops, c, d, w, in, A, clock, lora);
  if (in.kv != nullptr) {
    ops.kv_write(A.k, A.v, in.seqs, in.num_seqs, *in.kv, d.KV, d.qkd, d.vd);
    clock.mark(ForwardOp::kKvWrite);
  }
  ops.attention(A.q, A.k, A.v, in.kv, in.seqs, in.num_seqs, attn_dims(d), A.att, A.lse);
  clock.mark(ForwardOp::kAttention);
  const float* y = A.att;
  if (c.gated_attention) {
    ops.linear(A.xn1, d.T, w.gate, nullptr, A.gs);
    ops.sigmoid(A.gs, d.T * d.OD, A.gs);
    ops.mul(A.att, A.gs, d.T * d.OD, A.y);
    y = A.y;
  }
  ops.linear(y, d.T, w.o_proj, w.o_bias.f32(), A.o_out);
  adapter_forward(ops, lora, &LayerLora::o, y, d.T, A.o_out);
  clock.mark(ForwardOp::kOutProj);
}

// dres: d(x_mid) in; the attention half's share of d(x_in) goes to s.d_xn (through xn1).
void attention_backward(const backend::Ops& ops, const ModelConfig& c, const Dims& d, const LayerView& w,
                        const LayerParams<float*>& g, const LayerInput& in, const LayerActs& A,
                        const LayerGradScratch& s, const float* dres, const LayerLora* lora) {
  const float* y = c.gated_attention ? A.y : A.att;
  ops.linear_backward(dres, y, d.T, w.o_proj, s.d_y, false, g.o_proj, g.o_bias);
  adapter_backward(ops, lora, &LayerLora::o, dres, y, d.T, s.d_y);
  bool have_dxn = false;
  if (c.gated_attention) {
    ops.gate_backward(s.d_y, A.att, A.gs, d.T * d.OD, s.d_att, s.d_y);
    ops.linear_backward(s.d_y, A.xn1, d.T, w.gate, s.d_xn, false, g.gate, nullptr);
    have_dxn = true;
  } else {
    ops.copy(s.d_y, d.T * d.OD, s.d_att);
  }
  ops.attention_backward(s.d_att, A.q, A.k, A.v, A.att, A.lse, in.seqs, in.num_seqs, attn_dims(d), s.d_q, s.d_k,
                         s.d_v);
  qkv_backward(ops, c, d, w, g, in, A, s, have_dxn, lora);
}

// ---- the MLP half: x_mid = x_in + o_out, norm, SwiGLU, down, residual ----

void mlp_forward(const backend::Ops& ops, const Dims& d, const LayerView& w, const LayerActs& A, ForwardClock& clock,
                 const LayerLora* lora) {
  ops.add_rmsnorm(A.x_in, A.o_out, d.T, d.D, w.post_attention_layernorm.f32(), d.eps, A.x_mid, A.xn2, A.rstd2);
  clock.mark(ForwardOp::kNorm);
  const backend::LinearTarget gate_up[] = {{w.gate_proj, w.gate_proj_bias.f32(), A.a},
                                           {w.up_proj, w.up_proj_bias.f32(), A.b}};
  ops.linear_group(A.xn2, d.T, gate_up, 2);
  adapter_forward(ops, lora, &LayerLora::gate_proj, A.xn2, d.T, A.a);
  adapter_forward(ops, lora, &LayerLora::up_proj, A.xn2, d.T, A.b);
  clock.mark(ForwardOp::kMlpIn);
  ops.swiglu(A.a, A.b, d.T * d.I, A.h);
  clock.mark(ForwardOp::kSwiglu);
  ops.linear(A.h, d.T, w.down_proj, w.down_proj_bias.f32(), A.down_out);
  adapter_forward(ops, lora, &LayerLora::down_proj, A.h, d.T, A.down_out);
  clock.mark(ForwardOp::kMlpDown);
  ops.add(A.x_mid, A.down_out, d.T * d.D, A.x_out);
  clock.mark(ForwardOp::kResidual);
}

// dres: d(x_out) in, d(x_mid) out.
void mlp_backward(const backend::Ops& ops, const Dims& d, const LayerView& w, const LayerParams<float*>& g,
                  const LayerActs& A, const LayerGradScratch& s, float* dres, const LayerLora* lora) {
  ops.linear_backward(dres, A.h, d.T, w.down_proj, s.d_h, false, g.down_proj, g.down_proj_bias);
  adapter_backward(ops, lora, &LayerLora::down_proj, dres, A.h, d.T, s.d_h);
  ops.swiglu_backward(s.d_h, A.a, A.b, d.T * d.I, s.d_a, s.d_b);
  ops.linear_backward(s.d_a, A.xn2, d.T, w.gate_proj, s.d_xn, false, g.gate_proj, g.gate_proj_bias);
  adapter_backward(ops, lora, &LayerLora::gate_proj, s.d_a, A.xn2, d.T, s.d_xn);
  ops.linear_backward(s.d_b, A.xn2, d.T, w.up_proj, s.d_xn, true, g.up_proj, g.up_proj_bias);
  adapter_backward(ops, lora, &LayerLora::up_proj, s.d_b, A.xn2, d.T, s.d_xn);
  ops.rmsnorm_backward(s.d_xn, A.x_mid, w.post_attention_layernorm.f32(), A.rstd2, d.T, d.D, dres, true,
                       g.post_attention_layernorm);
}

}  // namespace

void layer_forward(const backend::Ops& ops, const ModelConfig& c, const LayerView& w, const LayerInput& in,
                   const LayerActs& A, ForwardClock& clock, const LayerLora* lora) {
  const Dims d(c, in.tokens);
  ops.rmsnorm(A.x_in, d.T, d.D, w.input_layernorm.f32(), d.eps, A.xn1, A.rstd1);
  clock.mark(ForwardOp::kNorm);
  attention_forward(ops, c, d, w, in, A, clock, lora);
  mlp_forward(ops, d, w, A, clock, lora);
}

void layer_backward(const backend::Ops& ops, const ModelConfig& c, const LayerView& w, const LayerParams<float*>& g,
                    const LayerInput& in, const LayerActs& A, const LayerGradScratch& s, float* dres,
                    const LayerLora* lora) {
  const Dims d(c, in.tokens);
  mlp_backward(ops, d, w, g, A, s, dres, lora);
  attention_backward(ops, c, d, w, g, in, A, s, dres, lora);
  ops.rmsnorm_backward(s.d_xn, A.x_in, w.input_layernorm.f32(), A.rstd1, d.T, d.D, dres, true, g.input_layernorm);
}

}  // namespace astrai::model
