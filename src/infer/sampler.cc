#include "infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "backend/sample_rows.h"
#include "base/error.h"
#include "kernels/cpu/softmax.h"

namespace astrai::infer {

void SamplerState::init(const SamplingParams& p, const std::vector<int32_t>& prompt, int32_t vocab, uint64_t seed) {
  rng = SplitMix64(seed);
  generated_counts.clear();
  seen.clear();
  if (p.repetition_penalty != 1.0f) {
    seen.assign(vocab, 0);
    for (int32_t t : prompt)
      if (t >= 0 && t < vocab) seen[t] = 1;
  }
}

void SamplerState::observe(int32_t token, const SamplingParams& p) {
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) ++generated_counts[token];
  if (!seen.empty()) seen[token] = 1;
}

void validate_sampling(const SamplingParams& p, int32_t vocab) {
  ASTRAI_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f, "temperature must be >= 0, got ", p.temperature);
  ASTRAI_CHECK(p.top_k >= 0, "top_k must be >= 0 (0 = off), got ", p.top_k);
  ASTRAI_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p must be in (0, 1], got ", p.top_p);
  ASTRAI_CHECK(p.min_p >= 0.0f && p.min_p <= 1.0f, "min_p must be in [0, 1], got ", p.min_p);
  ASTRAI_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f,
               "repetition_penalty must be > 0, got ", p.repetition_penalty);
  ASTRAI_CHECK(std::isfinite(p.presence_penalty) && std::isfinite(p.frequency_penalty), "penalties must be finite");
  ASTRAI_CHECK(p.logprobs >= -1 && p.logprobs <= 20, "logprobs must be in [0, 20], got ", p.logprobs);
  ASTRAI_CHECK(p.max_tokens >= 1, "max_tokens must be >= 1, got ", p.max_tokens);
  ASTRAI_CHECK(p.n >= 1 && p.n <= 128, "n must be in [1, 128], got ", p.n);
  for (const auto& [id, bias] : p.logit_bias) {
    ASTRAI_CHECK(id >= 0 && id < vocab, "logit_bias: token id ", id, " outside the vocabulary of ", vocab);
    ASTRAI_CHECK(!std::isnan(bias), "logit_bias: NaN bias for token ", id);
  }
  for (int32_t id : p.stop_token_ids)
    ASTRAI_CHECK(id >= 0 && id < vocab, "stop_token_ids: ", id, " outside the vocabulary of ", vocab);
  for (const auto& s : p.stop_strings) ASTRAI_CHECK(!s.empty(), "stop strings must not be empty");
}

namespace {

// The constants and pieces the device's sampler (backend/sample_rows.h) computes the same way.
using backend::sampling::kDrawBlock;
using backend::sampling::kSteps;
using backend::sampling::threshold_bucket;
using backend::sampling::threshold_value;
using backend::sampling::tree8;

// Σ w[i] in double over 8 interleaved chains added in a fixed order: the same value every call,
// about 8x faster than one chain of dependent adds.
double sum8(const float* w, int64_t n) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += w[i + j];
  const int64_t rest = n - i;  // < 8
  for (int j = 0; j < 8 && j < rest; ++j) part[j] += w[i + j];
  return tree8(part);
}

// sum8 with the values below floor counted as 0.
double sum8_at_least(const float* w, int64_t n, float floor) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) part[i & 7] += w[i] >= floor ? w[i] : 0.0f;
  return tree8(part);
}

// max of w[0, n) over 8 chains (max is exact, so any order gives the same value); NaNs are
// skipped, -inf when there is nothing else.
float max8(const float* w, int64_t n) {
  float m[8];
  for (int j = 0; j < 8; ++j) m[j] = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) m[j] = w[i + j] > m[j] ? w[i + j] : m[j];
  for (; i < n; ++i) m[0] = w[i] > m[0] ? w[i] : m[0];
  float r = m[0];
  for (int j = 1; j < 8; ++j) r = m[j] > r ? m[j] : r;
  return r;
}

// The candidates' threshold of top-k / top-p: the first of 2^-1, 2^-4, ..., 2^-100 (each 8x
// below the last), then 0, at which the weights (each in [0, 1]) at or above it hold at least
// need_mass and number at least need_count. One pass: weight w is at or above 2^-(1 + 3k)
// exactly when its binary exponent is >= -(1 + 3k), so the pass adds each weight to the bucket
// of the first threshold it reaches (eight interleaved copies of the buckets, so that runs of
// weights in one bucket do not wait on each other), and the buckets are then summed in order.
float candidates_threshold(const float* w, int64_t n, double need_mass, int64_t need_count) {
  double mass[kSteps + 1][8] = {};  // [bucket][chain]; bucket kSteps: only the threshold 0
  int64_t count[kSteps + 1][8] = {};
  for (int64_t i = 0; i < n; ++i) {
    const int b = threshold_bucket(w[i]);
    mass[b][i & 7] += w[i];
    count[b][i & 7] += 1;
  }
  double cum_mass = 0;
  int64_t cum_count = 0;
  for (int k = 0; k < kSteps; ++k) {
    cum_mass += tree8(mass[k]);
    for (int c = 0; c < 8; ++c) cum_count += count[k][c];
    if (cum_mass >= need_mass && cum_count >= need_count) return threshold_value(k);
  }
  return 0.0f;
}

// The index i with prefix(i) <= target < prefix(i + 1) over the weights w (the last one when
// target reaches the total): block sums (sum8) first, then one block scanned element by element.
int32_t draw(const float* w, int64_t n, double target) {
  double cum = 0;
  int64_t b = 0;
  for (; b + kDrawBlock < n; b += kDrawBlock) {
    const double s = sum8(w + b, kDrawBlock);
    if (target < cum + s) break;
    cum += s;
  }
  const int64_t end = std::min(n, b + kDrawBlock);
  for (int64_t i = b; i < end; ++i) {
    cum += w[i];
    if (target < cum) return static_cast<int32_t>(i);
  }
  // target within rounding of the total: the last token that has any weight.
  int64_t last = end - 1;
  while (last > 0 && !(w[last] > 0.0f)) --last;
  return static_cast<int32_t>(last);
}

// The n best (value desc, id asc) of logits into ids, best first, NaNs never (fewer than n when
// the rest are NaN); one pass: an element enters only when it beats the current n-th (ids are
// scanned in increasing order, so on equal values the one already held stays ahead).
void top_ids(const float* logits, int32_t vocab, int32_t n, std::vector<int32_t>* ids) {
  ids->clear();
  if (n <= 0) return;
  for (int32_t i = 0; i < vocab; ++i) {
    const float v = logits[i];
    if (std::isnan(v)) continue;
    if (static_cast<int32_t>(ids->size()) == n && !(v > logits[ids->back()])) continue;
    if (static_cast<int32_t>(ids->size()) < n) ids->push_back(i);
    else ids->back() = i;
    for (size_t j = ids->size() - 1; j > 0 && logits[(*ids)[j - 1]] < v; --j) std::swap((*ids)[j - 1], (*ids)[j]);
  }
}

// exp of each (logits[i] - shift) * scale into out (kernels::exp_values: the kernels' own exp,
// the same bits on every CPU level). Arguments below -87, where that exp stops at ~1e-38 (and
// -inf: a token banned by logit_bias), give exactly 0.
void shifted_exp(const float* logits, int32_t vocab, float shift, float scale, float* out) {
  for (int32_t i = 0; i < vocab; ++i) out[i] = (logits[i] - shift) * scale;
  kernels::exp_values(out, vocab, out);
  for (int32_t i = 0; i < vocab; ++i)
    if (!((logits[i] - shift) * scale >= -87.0f)) out[i] = 0.0f;
}

}  // namespace

float Sampler::log_sum_exp(const float* logits, int32_t vocab) {
  thread_local std::vector<float> e;  // grown once per thread
  const float mx = max8(logits, vocab);
  e.resize(static_cast<size_t>(vocab));
  shifted_exp(logits, vocab, mx, 1.0f, e.data());
  return mx + static_cast<float>(std::log(sum8(e.data(), vocab)));
}

TokenLogprob Sampler::logprob_of(const float* logits, int32_t vocab, int32_t token, int32_t top_n,
                                 std::vector<int32_t>* scratch) {
  return logprob_with(logits, vocab, token, top_n, log_sum_exp(logits, vocab), scratch);
}

TokenLogprob Sampler::logprob_with(const float* logits, int32_t vocab, int32_t token, int32_t top_n, float lse,
                                   std::vector<int32_t>* scratch) {
  TokenLogprob out;
  out.id = token;
  out.logprob = logits[token] - lse;
  top_ids(logits, vocab, std::min(top_n, vocab), scratch);
  for (int32_t id : *scratch) out.top.emplace_back(id, logits[id] - lse);
  return out;
}

SampleOutput Sampler::sample(float* logits, int32_t vocab, const SamplingParams& p, SamplerState& st) {
  SampleOutput out;
  // Logprobs report the model's distribution, before any request-side processing.
  // The chosen token's logprob is raw[token] - lse, the expression of the top entries, so a
  // token listed in both has the same value in both.
  float lse = 0.0f;
  if (p.logprobs >= 0) {
    lse = log_sum_exp(logits, vocab);
    out.logprob = logprob_with(logits, vocab, 0, p.logprobs, lse, &idx_);
    raw_.assign(logits, logits + vocab);
  }

  for (const auto& [id, bias] : p.logit_bias) logits[id] += bias;
  if (!st.seen.empty()) {
    const float rp = p.repetition_penalty;
    for (int32_t i = 0; i < vocab; ++i)
      if (st.seen[i]) logits[i] = logits[i] > 0 ? logits[i] / rp : logits[i] * rp;
  }
  for (const auto& [id, count] : st.generated_counts)
    logits[id] -= p.frequency_penalty * count + (count > 0 ? p.presence_penalty : 0.0f);

  int32_t token = 0;
  if (p.temperature == 0.0f) {
    // Greedy; ties go to the lowest id so the result never depends on scan order.
    const float best = max8(logits, vocab);
    while (token < vocab - 1 && !(logits[token] == best)) ++token;
  } else {
    const float inv_t = 1.0f / p.temperature;
    const float mx = max8(logits, vocab);
    probs_.resize(vocab);
    shifted_exp(logits, vocab, mx, inv_t, probs_.data());  // the best -> 1
    const bool need_sort = p.top_k > 0 || p.top_p < 1.0f;
    // min-p: drop tokens below min_p times the best (the best has probability weight 1).
    const float floor_w = p.min_p > 0.0f ? p.min_p : 0.0f;
    if (!need_sort && floor_w == 0.0f) {
      // Every token is a candidate: one draw over all the weights.
      token = draw(probs_.data(), vocab, st.rng.uniform() * sum8(probs_.data(), vocab));
    } else {
      idx_.clear();
      if (need_sort) {
        // Only tokens with weight >= a threshold can be in the top-k / nucleus; lower the
        // threshold geometrically until the kept set is big enough, then sort just that set.
        const double total = p.top_p < 1.0f ? sum8(probs_.data(), vocab) : 0.0;  // top-p's alone
        const double need_mass = p.top_p * total;
        const int32_t need_count = p.top_k > 0 ? std::min(p.top_k, vocab) : 1;
        const float thr = candidates_threshold(probs_.data(), vocab, need_mass, need_count);
        for (int32_t i = 0; i < vocab; ++i)
          if (probs_[i] >= thr && probs_[i] >= floor_w) idx_.push_back(i);
        std::sort(idx_.begin(), idx_.end(), [&](int32_t a, int32_t b) {
          return probs_[a] != probs_[b] ? probs_[a] > probs_[b] : a < b;
        });
        if (p.top_k > 0 && int32_t(idx_.size()) > p.top_k) idx_.resize(p.top_k);
        if (p.top_p < 1.0f) {
          // Nucleus within what survived top-k / min-p (renormalised, as in HF's warper order):
          // the first k's mass with top-k, else every weight's at or above min-p (not only the
          // candidates': the threshold leaves out weights that still count in the total).
          double kept = floor_w > 0.0f ? sum8_at_least(probs_.data(), vocab, floor_w) : total;
          if (p.top_k > 0) {
            kept = 0;
            for (int32_t i : idx_) kept += probs_[i];
          }
          double cum = 0;
          size_t keep = 0;
          while (keep < idx_.size()) {
            cum += probs_[idx_[keep++]];
            if (cum >= p.top_p * kept) break;
          }
          idx_.resize(std::max<size_t>(keep, 1));
        }
      } else {
        for (int32_t i = 0; i < vocab; ++i)
          if (probs_[i] >= floor_w) idx_.push_back(i);
      }
      // Empty only when no logit is finite (min-p then keeps nothing): token 0. The draw is
      // taken either way (once per token on every path).
      const double uniform = st.rng.uniform();
      if (!idx_.empty()) {
        double mass = 0;
        for (int32_t i : idx_) mass += probs_[i];
        const double u = uniform * mass;
        double cum = 0;
        token = idx_.back();
        for (int32_t i : idx_) {
          cum += probs_[i];
          if (u < cum) {
            token = i;
            break;
          }
        }
      }
    }
  }
  out.token = token;
  if (p.logprobs >= 0) {
    out.logprob.id = token;
    out.logprob.logprob = raw_[token] - lse;
  }
  st.observe(token, p);
  return out;
}

}  // namespace astrai::infer
