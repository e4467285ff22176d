#include "kernels/cpu/cross_entropy_backward.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/level_table.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

ASTRAI_KERNELS_BEGIN

namespace {

// Σ exp(z[i] - shift) over i < n: 16 lane partial sums, then the tree.
float exp_shift_sum(const float* z, float shift, int64_t n) {
  const Vec16 s(shift);
  Vec16 acc = vzero();
  for (int64_t i = 0; i < n; i += kLanes) acc = acc + vkeep(exp_approx(vload_n(z + i, n - i) - s), n - i);
  return vsum(acc);
}

// max and log Σ exp(z − max) of one row.
void row_stats(const float* z, int64_t vocab, float* max_out, float* lse_out) {
  const float m = max_value(z, vocab);
  *max_out = m;
  *lse_out = m + std::log(exp_shift_sum(z, m, vocab));
}

}  // namespace

double cross_entropy_forward_backward(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                                      float eps, float grad_scale, float* row_loss, float* dlogits) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    const float* z = logits + t * vocab;
    const int32_t y = targets[t];
    if (y < 0) {
      row_loss[t] = 0.0f;
      if (dlogits != nullptr) std::fill(dlogits + t * vocab, dlogits + (t + 1) * vocab, 0.0f);
      continue;
    }
    float m, lse;
    row_stats(z, vocab, &m, &lse);
    float loss = (1.0f - eps) * (lse - z[y]);
    if (eps != 0.0f) loss += eps * (lse - sum(z, vocab) / static_cast<float>(vocab));
    row_loss[t] = loss;
    if (dlogits != nullptr) {
      const float uniform = eps / static_cast<float>(vocab);
      const float target_y = z[y];
      float* d = dlogits + t * vocab;
      exp_affine(z, lse, grad_scale, -grad_scale * uniform, vocab, d);
      d[y] = grad_scale * (std::exp(target_y - lse) - uniform - (1.0f - eps));
    }
  }
  double total = 0.0;
  for (int64_t t = 0; t < rows; ++t) total += row_loss[t];
  return total;
}

void token_logprobs(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab, float* logp) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    if (targets[t] < 0) {
      logp[t] = 0.0f;
      continue;
    }
    float m, lse;
    row_stats(logits + t * vocab, vocab, &m, &lse);
    logp[t] = logits[t * vocab + targets[t]] - lse;
  }
}

void token_logprobs_backward(const float* logits, const int32_t* targets, const float* dlogp, int64_t rows,
                             int64_t vocab, float* dlogits) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    const float* z = logits + t * vocab;
    float* d = dlogits + t * vocab;
    const int32_t y = targets[t];
    if (y < 0 || dlogp[t] == 0.0f) {
      std::fill(d, d + vocab, 0.0f);
      continue;
    }
    float m, lse;
    row_stats(z, vocab, &m, &lse);
    const float g = dlogp[t];
    const float zy = z[y];
    exp_affine(z, lse, -g, 0.0f, vocab, d);
    d[y] = g * (1.0f - std::exp(zy - lse));
  }
}

void fill_cross_entropy(KernelTable& t) {
  t.cross_entropy_forward_backward = &cross_entropy_forward_backward;
  t.token_logprobs = &token_logprobs;
  t.token_logprobs_backward = &token_logprobs_backward;
}

ASTRAI_KERNELS_END
