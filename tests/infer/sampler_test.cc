#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "infer/sampler.h"
#include "infer/text_stream.h"

using namespace astrai::infer;

namespace {
std::vector<float> logits_of(std::vector<float> l) { return l; }
SamplingParams params(float t) {
  SamplingParams p;
  p.temperature = t;
  return p;
}
std::map<int32_t, int> histogram(const std::vector<float>& logits, const SamplingParams& p, int draws,
                                 uint64_t seed = 1) {
  Sampler s;
  SamplerState st;
  st.init(p, {}, static_cast<int32_t>(logits.size()), seed);
  std::map<int32_t, int> h;
  for (int i = 0; i < draws; ++i) {
    auto l = logits;
    st.generated_counts.clear();
    ++h[s.sample(l.data(), static_cast<int32_t>(l.size()), p, st).token];
  }
  return h;
}
}  // namespace

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s;
  SamplerState st;
  auto p = params(0);
  st.init(p, {}, 4, 0);
  auto l = logits_of({1, 3, 3, 2});
  EXPECT_EQ(s.sample(l.data(), 4, p, st).token, 1);
}

// A NaN logit (a broken model) is never chosen, greedy or sampled.
TEST(Sampler, NanLogitsAreSkipped) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Sampler s;
  SamplerState st;
  auto p = params(0);
  st.init(p, {}, 5, 0);
  auto l = logits_of({nan, 1, 3, nan, 3});
  EXPECT_EQ(s.sample(l.data(), 5, p, st).token, 2);
  auto h = histogram({nan, 0.0f, 0.5f, nan, 0.2f}, params(1), 2000);
  EXPECT_EQ(h.count(0) + h.count(3), 0u);
  EXPECT_EQ(h[1] + h[2] + h[4], 2000);
  // Nor listed among the top logprobs (a NaN there would also be invalid JSON): fewer entries.
  p.logprobs = 5;
  auto l2 = logits_of({nan, 1, 3, nan, 3});
  const auto out = s.sample(l2.data(), 5, p, st);
  ASSERT_EQ(out.logprob.top.size(), 3u);
  EXPECT_EQ(out.logprob.top[0].first, 2);
  EXPECT_EQ(out.logprob.top[1].first, 4);
  EXPECT_EQ(out.logprob.top[2].first, 1);
  for (const auto& [id, lp] : out.logprob.top) EXPECT_TRUE(std::isfinite(lp)) << id;
}

TEST(Sampler, TopKTopPMinPRestrictTheSupport) {
  const std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  auto p = params(1);
  p.top_k = 2;
  auto h = histogram(l, p, 4000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_NEAR(h[0] / 4000.0, 0.5 / 0.8, 0.03);
  p = params(1);
  p.top_p = 0.85f;  // 0.5 + 0.3 = 0.8 < 0.85 -> needs the third token
  h = histogram(l, p, 4000);
  EXPECT_EQ(h.size(), 3u);
  p = params(1);
  p.min_p = 0.5f;  // keeps p >= 0.25
  h = histogram(l, p, 4000);
  EXPECT_EQ(h.size(), 2u);
  p = params(1);
  h = histogram(l, p, 20000);
  EXPECT_EQ(h.size(), 4u);
  EXPECT_NEAR(h[3] / 20000.0, 0.05, 0.01);
}

// Top-p's nucleus is measured against the whole mass that survived (as HF's warper does), also
// when a long tail of small weights sits below the candidates' threshold: probabilities 1/2.1,
// ten of 0.1/2.1 and a tail of 1000 x 0.0001/2.1. top_p 0.9 keeps the head and nine of the ten
// (1.9/2.1 >= 0.9 > 1.8/2.1); measured against the candidates' 2.0 only, it kept the head and eight.
TEST(Sampler, TopPCountsTheMassBelowTheCandidatesThreshold) {
  std::vector<float> l(1011, std::log(0.0001f));
  l[0] = 0.0f;
  for (int i = 1; i <= 10; ++i) l[static_cast<size_t>(i)] = std::log(0.1f);
  auto p = params(1);
  p.top_p = 0.9f;
  const auto h = histogram(l, p, 6000);
  EXPECT_EQ(h.size(), 10u);  // the head and ids 1..9 (equal weights keep the lower ids)
  EXPECT_GT(h.count(9), 0u);
  EXPECT_EQ(h.count(10), 0u);
  EXPECT_EQ(h.rbegin()->first, 9);
}

TEST(Sampler, SeedReproducesAndTemperatureSharpens) {
  std::vector<float> l(50);
  for (int i = 0; i < 50; ++i) l[i] = std::sin(i * 1.7f) * 0.5f + i * 0.1f;
  auto p = params(1);
  EXPECT_EQ(histogram(l, p, 200, 5), histogram(l, p, 200, 5));
  EXPECT_NE(histogram(l, p, 200, 5), histogram(l, p, 200, 6));
  auto cold = params(0.01f);
  auto h = histogram(l, cold, 500);
  int best = std::max_element(l.begin(), l.end()) - l.begin();
  EXPECT_GT(h[best], 480);
}

TEST(Sampler, PenaltiesAndLogitBias) {
  Sampler s;
  SamplerState st;
  auto p = params(0);
  p.logit_bias = {{2, 10.0f}};
  st.init(p, {}, 3, 0);
  auto l = logits_of({1, 2, 0});
  EXPECT_EQ(s.sample(l.data(), 3, p, st).token, 2);
  // Repetition penalty (HF): seen tokens with positive logits are divided.
  p = params(0);
  p.repetition_penalty = 4.0f;
  st.init(p, {1}, 3, 0);
  l = logits_of({1.5f, 2.0f, 0});
  EXPECT_EQ(s.sample(l.data(), 3, p, st).token, 0);
  // Frequency penalty grows with the count of generated tokens.
  p = params(0);
  p.frequency_penalty = 1.0f;
  st.init(p, {}, 2, 0);
  int32_t first = -1, flips = 0;
  for (int i = 0; i < 4; ++i) {
    l = logits_of({1.0f, 0.5f});
    int32_t t = s.sample(l.data(), 2, p, st).token;
    if (first < 0) first = t;
    flips += t != first;
  }
  EXPECT_EQ(first, 0);
  EXPECT_GT(flips, 0);
  // Presence penalty is flat.
  p = params(0);
  p.presence_penalty = 0.4f;
  st.init(p, {}, 2, 0);
  l = logits_of({1.0f, 0.5f});
  EXPECT_EQ(s.sample(l.data(), 2, p, st).token, 0);
  l = logits_of({1.0f, 0.5f});
  EXPECT_EQ(s.sample(l.data(), 2, p, st).token, 0);  // 0.6 > 0.5
}

TEST(Sampler, LogprobsAreTheModelsDistribution) {
  Sampler s;
  SamplerState st;
  auto p = params(0);
  p.logprobs = 2;
  p.logit_bias = {{2, 100.0f}};
  st.init(p, {}, 3, 0);
  auto l = logits_of({0.0f, std::log(3.0f), 0.0f});
  auto out = s.sample(l.data(), 3, p, st);
  EXPECT_EQ(out.token, 2);
  EXPECT_NEAR(out.logprob.logprob, std::log(1 / 5.0), 1e-5);
  ASSERT_EQ(out.logprob.top.size(), 2u);
  EXPECT_EQ(out.logprob.top[0].first, 1);
  EXPECT_NEAR(out.logprob.top[0].second, std::log(3 / 5.0), 1e-5);
}

// The chosen token's logprob and its entry among the top alternatives are one value, to the
// bit: random logits over a vocabulary of 1000 (token 0's far below the rest), greedy and
// sampled, 50 draws each.
TEST(Sampler, ChosenLogprobEqualsItsTopEntry) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (float temperature : {0.0f, 1.0f}) {
    Sampler s;
    SamplerState st;
    auto p = params(temperature);
    p.logprobs = 20;
    st.init(p, {}, 1000, 3);
    for (int draw = 0; draw < 50; ++draw) {
      std::vector<float> l(1000);
      for (float& x : l) x = nd(rng);
      // |logits[0]| well above lse: -lse recovered as (logits[0] - lse) - logits[0] would round.
      l[0] = -30.0f + nd(rng);
      const auto out = s.sample(l.data(), 1000, p, st);
      bool listed = false;
      for (const auto& [id, lp] : out.logprob.top) {
        if (id != out.token) continue;
        EXPECT_EQ(lp, out.logprob.logprob) << "token " << id << ", draw " << draw;
        listed = true;
      }
      if (temperature == 0.0f) {
        EXPECT_TRUE(listed);
      }
    }
  }
}

// Temperature sampling draws each token with its softmax(logits / T) probability: 200000
// seeded draws over 700 tokens (the draw scans blocks of 256 weights, so three blocks), every
// token's frequency within 5 standard deviations of the probability computed here in double,
// and a token banned by logit_bias (-inf) or far below the rest never drawn.
TEST(Sampler, TemperatureDrawsFollowTheSoftmax) {
  const int32_t V = 700;
  std::vector<float> l(V);
  for (int32_t i = 0; i < V; ++i) l[i] = 2.0f * std::sin(0.37f * i) + 0.002f * i;
  l[650] = -1000.0f;
  auto p = params(0.8f);
  p.logit_bias = {{5, -std::numeric_limits<float>::infinity()}};
  std::vector<double> want(V);
  double z = 0;
  for (int32_t i = 0; i < V; ++i) z += want[i] = (i == 5 || i == 650) ? 0.0 : std::exp(double(l[i]) / 0.8);
  const int draws = 200000;
  auto h = histogram(l, p, draws, 11);
  EXPECT_EQ(h.count(5), 0u);
  EXPECT_EQ(h.count(650), 0u);
  for (int32_t i = 0; i < V; ++i) {
    const double q = want[i] / z, sd = std::sqrt(draws * q * (1 - q));
    EXPECT_NEAR(h[i], draws * q, 5 * sd + 1) << "token " << i;
  }
}

// The top alternatives are the best logits, equal ones by lower id, and every logprob is the
// logit minus log Σ exp (within 1e-6 of that sum taken in double here).
TEST(Sampler, TopLogprobsAreTheBestAndSumToOne) {
  std::vector<float> l(3000);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (auto& x : l) x = nd(rng);
  l[17] = l[2999] = l[400] = 9.0f;  // a three-way tie at the top: 17, 400, 2999
  std::vector<int32_t> scratch;
  const TokenLogprob out = Sampler::logprob_of(l.data(), 3000, 5, 20, &scratch);
  std::vector<int32_t> order(3000);
  for (int32_t i = 0; i < 3000; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  double mx = 9.0, sum = 0;
  for (float x : l) sum += std::exp(double(x) - mx);
  const double lse = mx + std::log(sum);
  ASSERT_EQ(out.top.size(), 20u);
  for (size_t k = 0; k < 20; ++k) {
    EXPECT_EQ(out.top[k].first, order[k]) << "rank " << k;
    EXPECT_NEAR(out.top[k].second, l[order[k]] - lse, 1e-6) << "rank " << k;
  }
  EXPECT_NEAR(out.logprob, l[5] - lse, 1e-6);
}

TEST(Sampler, ValidationNamesTheField) {
  SamplingParams p;
  p.top_p = 1.5f;
  try {
    validate_sampling(p, 10);
    FAIL();
  } catch (const astrai::Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
  p = SamplingParams{};
  p.logit_bias = {{10, 1.0f}};
  EXPECT_THROW(validate_sampling(p, 10), astrai::Error);
}

TEST(TextStream, Utf8HeldUntilWholeAndInvalidBytesReplaced) {
  TextStream ts;
  bool stop = false;
  EXPECT_EQ(ts.push("a\xE2", &stop), "a");
  EXPECT_EQ(ts.push("\x82", &stop), "");
  EXPECT_EQ(ts.push("\xAC", &stop), "\xE2\x82\xAC");
  EXPECT_EQ(ts.push("\xFF" "b", &stop), "\xEF\xBF\xBD" "b");
  EXPECT_EQ(ts.push("\xE2\x82", &stop), "");
  EXPECT_EQ(ts.flush(), "\xEF\xBF\xBD");
  std::string out;
  utf8_sanitize_append("\xC3(", &out);
  EXPECT_EQ(out, "\xEF\xBF\xBD(");
}

TEST(TextStream, StopStringsAcrossBoundariesHeldThenReleased) {
  TextStream ts({"</end>", "xyz"});
  bool stop = false;
  EXPECT_EQ(ts.push("hello </", &stop), "hello ");
  EXPECT_EQ(ts.push("en", &stop), "");
  EXPECT_EQ(ts.push("x", &stop), "</en");  // can no longer be </end>, but x may start xyz
  EXPECT_FALSE(stop);
  EXPECT_EQ(ts.push("yz tail", &stop), "");
  EXPECT_TRUE(stop);
  EXPECT_EQ(ts.matched(), "xyz");
  EXPECT_EQ(ts.push("more", &stop), "");

  TextStream t2({"ab"});
  EXPECT_EQ(t2.push("xa", &stop), "x");
  EXPECT_EQ(t2.flush(), "a");
  // Earliest match wins when two stop strings complete at once.
  TextStream t3({"cd", "bcd"});
  EXPECT_EQ(t3.push("abcde", &stop), "a");
  EXPECT_EQ(t3.matched(), "bcd");
}
