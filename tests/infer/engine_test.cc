// Engine behaviour with a deterministic fake model (see fake_model.h): continuous batching,
// chunked prefill, paging, prefix cache, preemption, cancellation, sampling and text handling.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "infer/engine.h"
#include "fake_model.h"

using namespace astrai::infer;
using namespace astrai::infer::testing;

namespace {

struct Rig {
  FakeModel* model = nullptr;
  std::unique_ptr<Engine> engine;
};

Rig make_engine(EngineOptions opt = {}, int32_t vocab = 300, int32_t max_context = 4096,
                std::vector<int32_t> eos = {}, bool codec = true) {
  auto model = std::make_unique<FakeModel>(vocab, max_context, eos);
  Rig rig;
  rig.model = model.get();
  rig.engine = std::make_unique<Engine>(std::move(model), codec ? std::make_unique<FakeCodec>(vocab) : nullptr, opt);
  return rig;
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int32_t len, int32_t vocab = 256) {
  std::vector<int32_t> p(len);
  for (auto& t : p) t = static_cast<int32_t>(rng() % vocab);
  return p;
}

GenerationRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  return r;
}

void expect_pool_full(const Engine& e) {
  // The engine thread publishes stats after each loop; wait until it has gone idle.
  for (int i = 0; i < 2000; ++i) {
    auto s = e.stats();
    if (s.running == 0 && s.waiting == 0 && s.kv_pages_used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto s = e.stats();
  EXPECT_EQ(s.kv_pages_used, 0);
  EXPECT_EQ(s.kv_pages_free, s.kv_pages_total);
}

}  // namespace

TEST(Engine, GreedyMatchesFullRecomputation) {
  auto rig = make_engine();
  std::mt19937 rng(1);
  auto prompt = random_prompt(rng, 37);
  auto res = rig.engine->submit(greedy(prompt, 20)).wait();
  ASSERT_EQ(res.choices.size(), 1u);
  EXPECT_EQ(res.choices[0].token_ids, reference_greedy(prompt, 300, 20));
  EXPECT_EQ(res.choices[0].finish, FinishReason::kLength);
  EXPECT_EQ(res.prompt_tokens, 37);
  EXPECT_EQ(res.completion_tokens, 20);
  expect_pool_full(*rig.engine);
}
