// Host-side sampling cost per row (infer::Sampler), the work the engine does for every sequence
// of every decode step after the forward: greedy, temperature, top-k, top-p and with logprobs,
// over random logits (normal, std 3) of a vocabulary of 32,000 (or argv[1]). Best of 5 runs of
// 200 rows each, in microseconds per row, one thread. Reports numbers, never passes or fails.
//   sampler_bench [VOCAB]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "infer/sampler.h"

using namespace astrai::infer;

int main(int argc, char** argv) {
  const int32_t vocab = argc > 1 ? std::atoi(argv[1]) : 32000;
  if (vocab < 2) {
    std::fprintf(stderr, "usage: sampler_bench [VOCAB >= 2]\n");
    return 2;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> base(static_cast<size_t>(vocab)), logits(base.size());
  for (float& x : base) x = normal(rng);
  struct Case {
    const char* name;
    float temperature, top_p;
    int32_t top_k, logprobs;
  };
  const Case cases[] = {{"greedy", 0.0f, 1.0f, 0, -1},
                        {"temperature 1", 1.0f, 1.0f, 0, -1},
                        {"temperature 0.7, top-p 0.95", 0.7f, 0.95f, 0, -1},
                        {"temperature 1, top-k 40", 1.0f, 1.0f, 40, -1},
                        {"temperature 1, 5 logprobs", 1.0f, 1.0f, 0, 5}};
  std::printf("vocabulary %d, microseconds per row (best of 5 x 200 rows; the copy of the logits included)\n", vocab);
  for (const Case& c : cases) {
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_p = c.top_p;
    p.top_k = c.top_k;
    p.logprobs = c.logprobs;
    Sampler sampler;
    SamplerState state;
    state.init(p, {}, vocab, 7);
    double best = 1e30;
    int64_t checksum = 0;
    for (int run = 0; run < 5; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int row = 0; row < 200; ++row) {
        logits = base;
        checksum += sampler.sample(logits.data(), vocab, p, state).token;
      }
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, us / 200);
    }
    std::printf("  %-30s %8.1f us  (token checksum %lld)\n", c.name, best, static_cast<long long>(checksum));
  }
  return 0;
}
