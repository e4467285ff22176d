// Causal self-attention for training over a packed batch of documents: each span attends to
// itself only (never across documents). GQA: query head h reads kv head h / (H / KV).
// The forward saves the log-sum-exp of each (token, head) row; the backward recomputes the
// probabilities from it (flash-attention style) so no [L, L] matrix is ever stored.
// Layouts: q [T, H, dqk], k [T, KV, dqk], v [T, KV, dv], out [T, H, dv], lse [T, H].
#pragma once

#include <cstdint>
#include <vector>

namespace astrai::kernels {

struct AttnSpan {
  int32_t begin = 0;  // first token of the document in the packed batch
  int32_t len = 0;
};

struct AttnShape {
  int64_t heads = 0, kv_heads = 0, qk_dim = 0, v_dim = 0;
  float scale = 1.0f;  // applied to q·k
};

void attention_forward_train(const float* q, const float* k, const float* v,
                             const std::vector<AttnSpan>& spans, const AttnShape& s, float* out,
                             float* lse);

// dq, dk, dv are overwritten.
void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                        const float* out, const float* lse, const std::vector<AttnSpan>& spans,
                        const AttnShape& s, float* dq, float* dk, float* dv);

}  // namespace astrai::kernels
