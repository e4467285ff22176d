#include "infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/error.h"

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

float Sampler::log_sum_exp(const float* logits, int32_t vocab) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < vocab; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  return mx + static_cast<float>(std::log(sum));
}

TokenLogprob Sampler::logprob_of(const float* logits, int32_t vocab, int32_t token, int32_t top_n,
                                 std::vector<int32_t>* scratch) {
  const float lse = log_sum_exp(logits, vocab);
  TokenLogprob out;
  out.id = token;
  out.logprob = logits[token] - lse;
  if (top_n > 0) {
    const int32_t n = std::min(top_n, vocab);
    scratch->resize(vocab);
    for (int32_t i = 0; i < vocab; ++i) (*scratch)[i] = i;
    std::partial_sort(scratch->begin(), scratch->begin() + n, scratch->end(), [&](int32_t a, int32_t b) {
      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    });
    for (int32_t i = 0; i < n; ++i) out.top.emplace_back((*scratch)[i], logits[(*scratch)[i]] - lse);
  }
  return out;
}

SampleOutput Sampler::sample(float* logits, int32_t vocab, const SamplingParams& p, SamplerState& st) {
  SampleOutput out;
  // Logprobs report the model's distribution, before any request-side processing.
  // The chosen token's logprob is raw[token] - lse, the expression of the top entries, so a
  // token listed in both has the same value in both.
  float lse = 0.0f;
  if (p.logprobs >= 0) {
    out.logprob = logprob_of(logits, vocab, 0, p.logprobs, &idx_);
    lse = log_sum_exp(logits, vocab);
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
    float best = logits[0];
    for (int32_t i = 1; i < vocab; ++i)
      if (logits[i] > best) best = logits[i], token = i;
  } else {
    const float inv_t = 1.0f / p.temperature;
    float mx = -std::numeric_limits<float>::infinity();
    for (int32_t i = 0; i < vocab; ++i) mx = std::max(mx, logits[i]);
    probs_.resize(vocab);
    for (int32_t i = 0; i < vocab; ++i) probs_[i] = std::exp((logits[i] - mx) * inv_t);  // max -> 1
    // Candidates, best first only where an ordering is needed.
    idx_.clear();
    const bool need_sort = p.top_k > 0 || p.top_p < 1.0f;
    double total = 0;
    for (int32_t i = 0; i < vocab; ++i) total += probs_[i];
    // min-p: drop tokens below min_p times the best (the best has probability weight 1).
    const float floor_w = p.min_p > 0.0f ? p.min_p : 0.0f;
    if (need_sort) {
      // Only tokens with weight >= a threshold can be in the top-k / nucleus; lower the
      // threshold geometrically until the kept set is big enough, then sort just that set.
      const double need_mass = p.top_p < 1.0f ? p.top_p * total : 0.0;
      const int32_t need_count = p.top_k > 0 ? std::min(p.top_k, vocab) : 1;
      float thr = 0.5f;
      while (true) {
        double mass = 0;
        int32_t count = 0;
        for (int32_t i = 0; i < vocab; ++i)
          if (probs_[i] >= thr) mass += probs_[i], ++count;
        if ((mass >= need_mass && count >= need_count) || thr == 0.0f) break;
        thr = thr < 1e-30f ? 0.0f : thr * 0.125f;
      }
      for (int32_t i = 0; i < vocab; ++i)
        if (probs_[i] >= thr && probs_[i] >= floor_w) idx_.push_back(i);
      std::sort(idx_.begin(), idx_.end(), [&](int32_t a, int32_t b) {
        return probs_[a] != probs_[b] ? probs_[a] > probs_[b] : a < b;
      });
      if (p.top_k > 0 && int32_t(idx_.size()) > p.top_k) idx_.resize(p.top_k);
      if (p.top_p < 1.0f) {
        double kept = 0;
        for (int32_t i : idx_) kept += probs_[i];
        // Nucleus within what survived top-k / min-p (renormalised, as in HF's warper order).
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
    double mass = 0;
    for (int32_t i : idx_) mass += probs_[i];
    const double u = st.rng.uniform() * mass;
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
  out.token = token;
  if (p.logprobs >= 0) {
    out.logprob.id = token;
    out.logprob.logprob = raw_[token] - lse;
  }
  st.observe(token, p);
  return out;
}

}  // namespace astrai::infer
