// Losses over logits [T, V] for training. Targets < 0 are ignored (PyTorch ignore_index).
#pragma once

#include <cstdint>

namespace astrai::kernels {

// Cross-entropy with label smoothing ε, PyTorch semantics per row:
//   loss = (1 − ε)·(−log p[y]) + ε·mean_c(−log p[c]).
// Writes row_loss[t] (0 for ignored rows) and, when dlogits is non-null, the gradient of
// grad_scale · Σ_t row_loss[t]:  grad_scale·(p − (1 − ε)·onehot(y) − ε/V); ignored rows get 0.
// dlogits may alias logits. Returns Σ row_loss (double, fixed order).
double cross_entropy_forward_backward(const float* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab, float label_smoothing, float grad_scale,
                                      float* row_loss, float* dlogits);

// logp[t] = log softmax(logits[t])[targets[t]] (0 for ignored rows).
void token_logprobs(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                    float* logp);

// Gradient of Σ_t dlogp[t]·logp[t] with respect to the logits: dlogp[t]·(onehot(y) − p).
// dlogits may alias logits.
void token_logprobs_backward(const float* logits, const int32_t* targets, const float* dlogp,
                             int64_t rows, int64_t vocab, float* dlogits);

}  // namespace astrai::kernels
