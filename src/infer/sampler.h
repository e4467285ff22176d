// Per-row sampling: logit bias and penalties, then greedy (temperature 0) or temperature +
// top-k + top-p + min-p and one draw from the choice's own RNG. The RNG is seeded per choice and
// consumed exactly once per generated token, so a seeded choice gives the same tokens whatever
// else shares its batch. Logprobs are those of the model (log-softmax of the raw logits).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "base/rng.h"
#include "infer/engine.h"

namespace astrai::infer {

// What one choice remembers between tokens.
struct SamplerState {
  SplitMix64 rng;  // base/rng.h
  // Generated-token counts (presence / frequency penalties).
  std::unordered_map<int32_t, int32_t> generated_counts;
  // Every token seen, prompt included (repetition penalty, as in Hugging Face).
  std::vector<uint8_t> seen;

  void init(const SamplingParams& p, const std::vector<int32_t>& prompt, int32_t vocab, uint64_t seed);
  void observe(int32_t token, const SamplingParams& p);
};

struct SampleOutput {
  int32_t token = 0;
  TokenLogprob logprob;  // filled when params.logprobs >= 0
};

// Scratch buffers reused across rows and steps (no per-token allocation once warm).
class Sampler {
 public:
  // `logits` (vocab floats) is modified in place.
  SampleOutput sample(float* logits, int32_t vocab, const SamplingParams& params, SamplerState& state);
  // Log-softmax of raw logits: the chosen token's logprob and the top n alternatives (best
  // first; equal logits by lower id).
  static TokenLogprob logprob_of(const float* logits, int32_t vocab, int32_t token, int32_t top_n,
                                 std::vector<int32_t>* scratch);
  // The same given lse = log_sum_exp(logits, vocab).
  static TokenLogprob logprob_with(const float* logits, int32_t vocab, int32_t token, int32_t top_n, float lse,
                                   std::vector<int32_t>* scratch);
  // log Σ exp(logits[i]): the max taken out, exp by the kernels' own (kernels::exp_values), the
  // sum in double: what every logprob subtracts.
  static float log_sum_exp(const float* logits, int32_t vocab);

 private:
  std::vector<float> probs_;
  std::vector<float> raw_;
  std::vector<int32_t> idx_;
};

// Validates a request's sampling fields; throws astrai::Error naming the bad one.
void validate_sampling(const SamplingParams& p, int32_t vocab);

}  // namespace astrai::infer
