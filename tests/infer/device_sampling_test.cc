// Ops::sample (backend/sample_rows.h: the sampling a device backend runs next to its logits)
// against the engine's sampler on the same rows: the same token, the same logprob bits, the
// same alternatives, for random rows of several shapes and every sampling setting it takes;
// and the same results whatever number of threads runs the block. Then the engine with
// sample_on "device" against "host" over a random-weight model: the same tokens and logprobs
// for every request of a mixed batch (the CUDA model's run is in tests/model/cuda_forward_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "../model_families.h"
#include "backend/ops.h"
#include "backend/sample_rows.h"
#include "base/error.h"
#include "base/rng.h"
#include "infer/engine.h"
#include "infer/sampler.h"
#include "model/transformer.h"
#if ASTRAI_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#endif

namespace astrai {
namespace {

using backend::SampleResult;
using backend::SampleSpec;

// A row of logits: `kind` 0 spread normal, 1 peaked, 2 many ties (few distinct values), 3 flat,
// 4 spread with NaNs (a broken model) and -infs (banned tokens) among them.
std::vector<float> random_row(std::mt19937_64& rng, int32_t vocab, int kind) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(vocab));
  for (float& x : row) {
    const float z = normal(rng);
    x = kind == 0 ? 3.0f * z : kind == 1 ? 12.0f * z : kind == 2 ? std::round(2.0f * z) : 0.01f * z;
    if (kind == 4) {
      const uint64_t u = rng() % 10;
      x = u == 0 ? std::nanf("") : u == 1 ? -INFINITY : 3.0f * z;
    }
  }
  return row;
}

infer::SamplingParams params_of(const SampleSpec& s) {
  infer::SamplingParams p;
  p.temperature = s.temperature;
  p.top_k = s.top_k;
  p.top_p = s.top_p;
  p.min_p = s.min_p;
  p.logprobs = s.top_logprobs;
  return p;
}

// The engine's sampler on a copy of the row, its choice seeded with `seed`; the spec's uniform
// is that seed's first draw (what the engine passes a device: sample_specs in engine.cc).
infer::SampleOutput engine_sample(const std::vector<float>& row, const SampleSpec& s, uint64_t seed) {
  infer::Sampler sampler;
  infer::SamplerState st;
  const infer::SamplingParams p = params_of(s);
  st.init(p, {}, static_cast<int32_t>(row.size()), seed);
  std::vector<float> copy(row);
  return sampler.sample(copy.data(), static_cast<int32_t>(copy.size()), p, st);
}

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

void expect_same(const infer::SampleOutput& want, const SampleResult& got, const SampleSpec& s, const char* what) {
  SCOPED_TRACE(::testing::Message() << what << ": temperature " << s.temperature << " top_k " << s.top_k
                                    << " top_p " << s.top_p << " min_p " << s.min_p << " logprobs "
                                    << s.top_logprobs << " uniform " << s.uniform);
  ASSERT_EQ(got.token, want.token);
  if (s.top_logprobs < 0) return;
  EXPECT_EQ(bits(got.logprob), bits(want.logprob.logprob));
  ASSERT_EQ(static_cast<size_t>(got.num_top), want.logprob.top.size());
  for (int32_t r = 0; r < got.num_top; ++r) {
    EXPECT_EQ(got.top_ids[r], want.logprob.top[static_cast<size_t>(r)].first) << "entry " << r;
    EXPECT_EQ(bits(got.top_logprobs[r]), bits(want.logprob.top[static_cast<size_t>(r)].second)) << "entry " << r;
  }
}

SampleSpec random_spec(std::mt19937_64& rng, uint64_t* seed) {
  const float temps[] = {0.0f, 0.3f, 1.0f, 2.5f};
  const int32_t ks[] = {0, 0, 1, 5, 50};
  const float ps[] = {1.0f, 1.0f, 0.5f, 0.9f, 0.99f};
  const float mins[] = {0.0f, 0.0f, 0.05f, 0.3f};
  const int32_t lps[] = {-1, 0, 5, 20};
  SampleSpec s;
  s.temperature = temps[rng() % 4];
  s.top_k = ks[rng() % 5];
  s.top_p = ps[rng() % 5];
  s.min_p = mins[rng() % 4];
  s.top_logprobs = lps[rng() % 4];
  *seed = rng();
  s.uniform = SplitMix64(*seed).uniform();
  return s;
}

TEST(DeviceSampling, EqualsTheEnginesSamplerOnRandomRowsAndSettings) {
  std::mt19937_64 rng(7);
  const int32_t vocabs[] = {1, 7, 300, 4099, 32000};
  int cases = 0;
  for (int32_t vocab : vocabs)
    for (int kind = 0; kind < 5; ++kind)
      for (int rep = 0; rep < 12; ++rep) {
        const std::vector<float> row = random_row(rng, vocab, kind);
        uint64_t seed = 0;
        const SampleSpec s = random_spec(rng, &seed);
        SampleResult got;
        backend::cpu_ops().sample(row.data(), 1, vocab, &s, 1, &got);
        expect_same(engine_sample(row, s, seed), got, s, "cpu_ops");
        ++cases;
      }
  EXPECT_EQ(cases, 300);
}

// Several rows in one call, each by its own spec (rows may repeat: n choices of one prompt).
TEST(DeviceSampling, RowsOfOneCallAreIndependent) {
  std::mt19937_64 rng(11);
  const int32_t vocab = 1000;
  std::vector<float> logits;
  for (int r = 0; r < 3; ++r) {
    const std::vector<float> row = random_row(rng, vocab, r % 4);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  std::vector<SampleSpec> specs;
  std::vector<uint64_t> seeds(8);
  for (int i = 0; i < 8; ++i) {
    SampleSpec s = random_spec(rng, &seeds[i]);
    s.row = i % 3;
    specs.push_back(s);
  }
  std::vector<SampleResult> got(specs.size());
  backend::cpu_ops().sample(logits.data(), 3, vocab, specs.data(), static_cast<int64_t>(specs.size()), got.data());
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::vector<float> row(logits.begin() + specs[i].row * vocab, logits.begin() + (specs[i].row + 1) * vocab);
    expect_same(engine_sample(row, specs[i], seeds[i]), got[i], specs[i], "batch");
  }
}

// The block's threads split every pass; no count of threads changes a bit (CUDA runs 256).
TEST(DeviceSampling, AnyNumberOfThreadsGivesTheSameResult) {
  std::mt19937_64 rng(3);
  const int32_t vocab = 5000;
  std::vector<float> w(vocab);
  std::vector<uint64_t> keys(static_cast<size_t>(backend::sampling::pow2_at_least(vocab)));
  std::vector<double> blocks(vocab / backend::sampling::kDrawBlock + 1);
  const backend::sampling::RowScratch scratch{w.data(), keys.data(), blocks.data()};
  auto shared = std::make_unique<backend::sampling::Shared>();
  for (int rep = 0; rep < 24; ++rep) {
    const std::vector<float> row = random_row(rng, vocab, rep % 4);
    uint64_t seed = 0;
    const SampleSpec s = random_spec(rng, &seed);
    const infer::SampleOutput want = engine_sample(row, s, seed);
    for (int threads : {1, 3, 8, 33, 256}) {
      SampleResult got;
      backend::sampling::sample_row(backend::sampling::HostBlock{threads}, *shared, row.data(), vocab, s, scratch,
                                    got);
      expect_same(want, got, s, threads == 1 ? "1 thread" : "several threads");
    }
  }
}

TEST(DeviceSampling, BadSpecsAreErrors) {
  const std::vector<float> row(10, 0.0f);
  SampleResult out;
  SampleSpec s;
  s.row = 1;
  EXPECT_THROW(backend::cpu_ops().sample(row.data(), 1, 10, &s, 1, &out), Error);
  s = SampleSpec{};
  s.top_logprobs = 21;
  EXPECT_THROW(backend::cpu_ops().sample(row.data(), 1, 10, &s, 1, &out), Error);
  s = SampleSpec{};
  s.uniform = 1.0;
  EXPECT_THROW(backend::cpu_ops().sample(row.data(), 1, 10, &s, 1, &out), Error);
}

// ---- the engine: sample_on "device" against "host" ----

std::shared_ptr<const model::Transformer> small_model(const char* family, Device device = Device::kCpu) {
  Json j = testing_util::cuda_test_family(family);
  j["vocab_size"] = 1500;  // wide enough for top-k / top-p / min-p to cut
  const model::ModelConfig c = model::ModelConfig::from_json(j);
  return std::make_shared<const model::Transformer>(c, testing_util::random_weights(c, 5), device);
}

// A mixed batch: greedy, seeded draws with each filter, logprobs, n = 3 choices, and rows the
// engine keeps on the host (logit bias, penalties, prompt logprobs).
std::vector<infer::GenerationRequest> mixed_requests() {
  std::vector<infer::GenerationRequest> out;
  for (int i = 0; i < 12; ++i) {
    infer::GenerationRequest r;
    for (int t = 0; t < 5 + 3 * i; ++t) r.prompt_ids.push_back((17 * i + 31 * t + 1) % 1500);
    infer::SamplingParams& p = r.sampling;
    p.max_tokens = 12;
    p.ignore_eos = true;
    p.seed = 100 + i;
    p.temperature = i % 4 == 0 ? 0.0f : 0.7f + 0.2f * (i % 3);
    if (i % 3 == 1) p.top_k = 20;
    if (i % 4 == 2) p.top_p = 0.8f;
    if (i % 5 == 3) p.min_p = 0.05f;
    if (i % 2 == 1) p.logprobs = i % 3 == 0 ? 0 : 5;
    if (i == 5) p.n = 3;
    if (i == 7) p.logit_bias = {{3, 2.0f}};
    if (i == 9) p.presence_penalty = 0.5f;
    if (i == 10) r.prompt_logprobs = true;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<infer::GenerationResult> run_engine(const std::shared_ptr<const model::Transformer>& m,
                                                const std::string& sample_on) {
  infer::EngineOptions o;
  o.sample_on = sample_on;
  o.kv_cache_bytes = 16 << 20;
  infer::Engine engine(m, nullptr, o);
  std::vector<infer::RequestHandle> handles;
  for (auto& r : mixed_requests()) handles.push_back(engine.submit(std::move(r)));
  std::vector<infer::GenerationResult> results;
  for (auto& h : handles) results.push_back(h.wait());
  return results;
}

// Logprobs equal bit for bit (tol 0) or within tol relative; tokens and alternatives' ids equal.
void expect_same_logprob(float got, float want, double tol, const char* what) {
  if (tol == 0) EXPECT_EQ(bits(got), bits(want)) << what;
  else EXPECT_NEAR(got, want, tol * (1.0 + std::fabs(want))) << what;
}

void expect_same_results(const std::vector<infer::GenerationResult>& want,
                         const std::vector<infer::GenerationResult>& got, double tol = 0) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    SCOPED_TRACE(::testing::Message() << "request " << r);
    ASSERT_EQ(got[r].error, "");
    ASSERT_EQ(got[r].choices.size(), want[r].choices.size());
    for (size_t c = 0; c < want[r].choices.size(); ++c) {
      SCOPED_TRACE(::testing::Message() << "choice " << c);
      const infer::ChoiceResult& a = want[r].choices[c];
      const infer::ChoiceResult& b = got[r].choices[c];
      EXPECT_EQ(b.token_ids, a.token_ids);
      ASSERT_EQ(b.logprobs.size(), a.logprobs.size());
      for (size_t t = 0; t < a.logprobs.size(); ++t) {
        SCOPED_TRACE(::testing::Message() << "token " << t);
        expect_same_logprob(b.logprobs[t].logprob, a.logprobs[t].logprob, tol, "logprob");
        ASSERT_EQ(b.logprobs[t].top.size(), a.logprobs[t].top.size());
        for (size_t e = 0; e < a.logprobs[t].top.size(); ++e) {
          EXPECT_EQ(b.logprobs[t].top[e].first, a.logprobs[t].top[e].first) << "alternative " << e;
          expect_same_logprob(b.logprobs[t].top[e].second, a.logprobs[t].top[e].second, tol, "alternative");
        }
      }
    }
    EXPECT_EQ(got[r].prompt_logprobs.size(), want[r].prompt_logprobs.size());
  }
}

TEST(EngineSampleOn, DeviceGivesTheHostsTokensAndLogprobs) {
  for (const char* family : {"llama", "mla"}) {
    SCOPED_TRACE(family);
    const auto m = small_model(family);
    const auto host = run_engine(m, "host");
    // Not a run of greedy ties: the seeded draws took different tokens in different requests.
    std::vector<int32_t> firsts;
    for (const auto& r : host) firsts.push_back(r.choices[0].token_ids[0]);
    std::sort(firsts.begin(), firsts.end());
    EXPECT_GT(std::unique(firsts.begin(), firsts.end()) - firsts.begin(), 6);
    expect_same_results(host, run_engine(m, "device"));
    expect_same_results(host, run_engine(m, "auto"));  // the host's sampler
  }
}

TEST(EngineSampleOn, BadChoicesAreErrors) {
  const auto m = small_model("llama");
  infer::EngineOptions o;
  o.kv_cache_bytes = 4 << 20;
  o.sample_on = "gpu";
  EXPECT_THROW(infer::Engine(m, nullptr, o), Error);
}

#if ASTRAI_HAVE_CUDA
// The engine over the CUDA model: sampling on the GPU gives the tokens the host's sampler draws
// from the same device logits (copied back), and logprobs within one float ulp (backend/
// sample_rows.h: the lse's log() is the device's). Skipped without a GPU (scripts/gpu-check.sh).
TEST(CudaEngineSampleOn, DeviceGivesTheHostsTokens) {
  std::string why;
  if (!backend::cuda::available(&why)) GTEST_SKIP() << "no GPU here: " << why;
  for (const char* family : {"llama", "qwen3", "mla"}) {
    SCOPED_TRACE(family);
    const auto m = small_model(family, Device::kCuda);
    const auto host = run_engine(m, "host");
    expect_same_results(host, run_engine(m, "device"), 1.2e-7);
  }
}
#endif  // ASTRAI_HAVE_CUDA

}  // namespace
}  // namespace astrai
