// One decoder layer, defined once for inference and training: the sequence of operations
// (pre-norm, Hugging Face Llama/Qwen semantics) and, next to each block's forward, its
// backward. Every choice a family makes (MLA, qk-norm before or after RoPE, the attention
// output gate, biases, RoPE pairing) is decided here from the ModelConfig, and every
// operation goes through a backend::Ops, so the same code runs on any device.
//
//   xn1 = rmsnorm(x_in)
//   q, k, v = xn1·W^T (+b)           MLA: q = xn1·Wq^T; [k | v] per kv head = rmsnorm(xn1·Wkv_a^T)·Wkv_b^T
//   [qk-norm] rope(q, k) [qk-norm]    (the trailing qk_rope_head_dim of each head for MLA)
//   att = attention(q, k, v)          over the paged cache when there is one
//   y = att [∘ sigmoid(xn1·Wg^T)]
//   x_mid = x_in + y·Wo^T (+bo);  xn2 = rmsnorm(x_mid)
//   x_out = x_mid + (silu(xn2·Wgate^T (+b)) ∘ (xn2·Wup^T (+b)))·Wdown^T (+b)
//
// Inference points the activation slots at shared scratch (several alias: the residual stream
// is updated in place and nothing is saved); training gives each layer its own buffers and
// the rstd/lse slots the backward reads. The forward runs the same operations either way, so
// training's forward has inference's bits.
#pragma once

#include <cstdint>

#include "backend/ops.h"
#include "model/config.h"
#include "model/forward_profile.h"
#include "model/param_schema.h"

namespace astrai::model {

// A layer's parameters as the backend reads them (vectors in f32).
using LayerView = LayerParams<backend::Weight>;

// What a layer's attention needs from the batch: its sequences, RoPE tables [T, rope_dim / 2],
// and this layer's cache pages (null without a cache).
struct LayerInput {
  int64_t tokens = 0;
  const backend::SeqRange* seqs = nullptr;
  int64_t num_seqs = 0;
  const float* cos = nullptr;
  const float* sin = nullptr;
  const backend::KvPages* kv = nullptr;
};

// Where the forward reads and writes. Slots for parameters the config lacks are unused; the
// save slots (rstd*, lse) may be null when no backward follows. Allowed aliases (inference):
// x_mid == x_out == x_in; xn2 == xn1; q_raw == q and k_raw == k when rstd_q/rstd_k are null;
// lat_raw == lat when rstd_kv is null; y == att and gs any scratch; h == a.
struct LayerActs {
  float* x_in = nullptr;                             // [T, hidden]
  float *xn1 = nullptr, *rstd1 = nullptr;            // [T, hidden], [T]
  float *q_raw = nullptr, *k_raw = nullptr;          // qk-norm inputs
  float *rstd_q = nullptr, *rstd_k = nullptr;        // [T·heads], [T·kv_heads]
  float *q = nullptr, *k = nullptr, *v = nullptr;    // [T, heads, qk], [T, kv, qk], [T, kv, v]
  float *lat_raw = nullptr, *rstd_kv = nullptr, *lat = nullptr, *kvb = nullptr;  // MLA
  float *att = nullptr, *lse = nullptr;              // [T, heads, v], [T, heads]
  float *gs = nullptr, *y = nullptr;                 // gate sigmoid and gated output
  float* o_out = nullptr;                            // o_proj output [T, hidden]
  float *x_mid = nullptr, *xn2 = nullptr, *rstd2 = nullptr;
  float *a = nullptr, *b = nullptr, *h = nullptr;    // gate_proj, up_proj, swiglu [T, inter]
  float* down_out = nullptr;                         // down_proj output [T, hidden]
  float* x_out = nullptr;                            // [T, hidden]
};

// Scratch of the backward, sized for T tokens: d_xn [T, max(hidden, heads·qk)], d_q, d_k,
// d_v, d_att and d_y per their activations, d_a, d_b, d_h [T, inter]; MLA: d_kvb, d_lat.
struct LayerGradScratch {
  float *d_xn = nullptr, *d_q = nullptr, *d_k = nullptr, *d_v = nullptr, *d_att = nullptr, *d_y = nullptr;
  float *d_a = nullptr, *d_b = nullptr, *d_h = nullptr, *d_kvb = nullptr, *d_lat = nullptr;
};

// A LoRA adapter on one projection (training, train/lora.h): out += dropout(x)·Aᵀ·B̃ᵀ, where
// B̃ = s·B is kept pre-scaled by the owner. u = dropout(x)·Aᵀ [T, r] is saved for the
// backward, which adds dL/dA into da and dL/dB̃ into db and the adapter's share of dL/dx.
// The dropout mask is backend/dropout_mask.h's of `seed`, so the backward redraws it.
struct ProjectionLora {
  backend::Weight a, b;  // [r, in], [out, r] (f32)
  float* u = nullptr;    // [T, r]
  float *da = nullptr, *db = nullptr;
  float dropout = 0.0f;
  uint64_t seed = 0;
  bool defined() const { return a.defined(); }
};

// The adapters of one layer (undefined where a projection has none) and the scratch they
// share: xd, dxd [T, widest input], tmp [T, widest output], du [T, r].
struct LayerLora {
  ProjectionLora q, k, v, o, gate_proj, up_proj, down_proj;
  float *xd = nullptr, *dxd = nullptr, *tmp = nullptr, *du = nullptr;
};

// lora (may be null): adapters added to the projections' outputs.
void layer_forward(const backend::Ops& ops, const ModelConfig& c, const LayerView& w, const LayerInput& in,
                   const LayerActs& A, ForwardClock& clock, const LayerLora* lora = nullptr);

// Given dres = d(loss)/d(x_out), accumulates the layer's parameter gradients into g (null
// slots: frozen, skipped) and the adapters' into theirs, and leaves d(loss)/d(x_in) in dres.
// Reads what layer_forward saved in A (every save slot set) and in the adapters.
void layer_backward(const backend::Ops& ops, const ModelConfig& c, const LayerView& w, const LayerParams<float*>& g,
                    const LayerInput& in, const LayerActs& A, const LayerGradScratch& s, float* dres,
                    const LayerLora* lora = nullptr);

}  // namespace astrai::model
