// Engine behaviour with a deterministic fake model (see fake_model.h): continuous batching,
// chunked prefill, paging, prefix cache, preemption, cancellation, sampling and text handling.
#include <gtest/gtest.h>

#include <cmath>
#include <future>
#include <random>
#include <thread>

#include "base/parallel.h"
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
  // The engine thread publishes stats after each loop; wait until it has gone idle. The bound
  // only stops a hung engine (under TSan on a loaded machine going idle can take seconds).
  for (int i = 0; i < 60000; ++i) {
    auto s = e.stats();
    if (s.running == 0 && s.waiting == 0 && s.kv_pages_used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto s = e.stats();
  EXPECT_EQ(s.kv_pages_used, 0);
  EXPECT_EQ(s.kv_pages_free, s.kv_pages_total);
}

}  // namespace

EngineOptions small(int32_t page_size = 4, int64_t pages = 4096, int32_t step_tokens = 2048);

TEST(Engine, KvDtypeAutoFollowsTheWeightsAndBadNamesAreRejected) {
  using astrai::DType;
  auto build = [](const std::string& kv_dtype, DType weights) {
    auto model = std::make_unique<FakeModel>();
    model->mutable_info().weight_dtype = weights;
    EngineOptions o;
    o.kv_dtype = kv_dtype;
    o.kv_cache_bytes = 1 << 20;
    return Engine(std::move(model), nullptr, o).kv_dtype();
  };
  EXPECT_EQ(build("auto", DType::kF32), DType::kF32);
  EXPECT_EQ(build("auto", DType::kF16), DType::kF32);
  EXPECT_EQ(build("auto", DType::kBF16), DType::kBF16);
  EXPECT_EQ(build("f32", DType::kBF16), DType::kF32);
  EXPECT_EQ(build("bf16", DType::kF32), DType::kBF16);
  try {
    build("fp8", DType::kF32);
    ADD_FAILURE() << "fp8 accepted";
  } catch (const astrai::Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv_dtype must be auto, f32 or bf16, got 'fp8'"), std::string::npos);
  }
}

TEST(Engine, GreedyMatchesFullRecomputation) {
  auto rig = make_engine(small());
  std::mt19937 rng(1);
  auto prompt = random_prompt(rng, 37);
  auto res = rig.engine->submit(greedy(prompt, 20)).wait();
  ASSERT_EQ(res.choices.size(), 1u);
  EXPECT_EQ(res.choices[0].token_ids, reference_greedy(prompt, 300, 20));
  EXPECT_EQ(res.choices[0].finish, FinishReason::kLength);
  EXPECT_EQ(res.prompt_tokens, 37);
  EXPECT_EQ(res.completion_tokens, 20);
  expect_pool_full(*rig.engine);
  EXPECT_EQ(rig.engine->stats().tokens_generated, 20u);
}

EngineOptions small(int32_t page_size, int64_t pages, int32_t step_tokens) {
  EngineOptions o;
  o.page_size = page_size;
  // FakeModel: 2 layers, 1 kv head, k/v dim 2 -> 32 bytes per token.
  o.kv_cache_bytes = pages * page_size * 32;
  o.max_step_tokens = step_tokens;
  return o;
}

TEST(Engine, SixteenConcurrentRaggedRequestsChunked) {
  auto rig = make_engine(small(4, 4096, 64));
  std::mt19937 rng(2);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> gens;
  for (int i = 0; i < 16; ++i) {
    prompts.push_back(random_prompt(rng, 1 + rng() % 150));
    gens.push_back(1 + rng() % 40);
  }
  std::vector<RequestHandle> handles;
  std::vector<std::thread> threads;
  std::mutex mu;
  // The first forward waits until every request is queued, so requests do batch however the
  // threads are scheduled (else a slow submitter can see each request finish before the next).
  std::atomic<bool> all_queued{false};
  rig.model->before_forward = [&](const astrai::model::Batch&) {
    while (!all_queued.load()) std::this_thread::yield();
  };
  for (int i = 0; i < 16; ++i)
    threads.emplace_back([&, i] {
      auto h = rig.engine->submit(greedy(prompts[i], gens[i]));
      std::lock_guard<std::mutex> lock(mu);
      handles.push_back(h);
    });
  for (auto& t : threads) t.join();
  all_queued.store(true);
  for (auto& h : handles) {
    auto r = h.wait();
    auto it = std::find(prompts.begin(), prompts.end(), r.prompt_ids);
    ASSERT_NE(it, prompts.end());
    const size_t i = it - prompts.begin();
    EXPECT_EQ(r.choices[0].token_ids, reference_greedy(prompts[i], 300, gens[i])) << "request " << i;
  }
  EXPECT_LE(rig.model->max_batch_tokens.load(), 64);
  EXPECT_GT(rig.model->max_batch_seqs.load(), 1);
  expect_pool_full(*rig.engine);
}

TEST(Engine, PreemptionWhenPagesRunOutGivesSameOutput) {
  // 40 pages of 4 tokens; 8 requests that each need 13 pages.
  auto opt = small(4, 40, 256);
  auto rig = make_engine(opt);
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<RequestHandle> handles;
  std::atomic<bool> all_queued{false};  // all 8 run together, however the threads are scheduled
  rig.model->before_forward = [&](const astrai::model::Batch&) {
    while (!all_queued.load()) std::this_thread::yield();
  };
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(random_prompt(rng, 20));
    handles.push_back(rig.engine->submit(greedy(prompts.back(), 30)));
  }
  all_queued.store(true);
  for (int i = 0; i < 8; ++i) {
    auto r = handles[i].wait();
    EXPECT_EQ(r.choices[0].token_ids, reference_greedy(prompts[i], 300, 30)) << "request " << i;
    EXPECT_EQ(r.choices[0].finish, FinishReason::kLength);
  }
  EXPECT_GT(rig.engine->stats().preemptions, 0u);
  expect_pool_full(*rig.engine);
}

TEST(Engine, PrefixSharedBetweenRunningAndNewRequest) {
  auto rig = make_engine(small(4));
  std::mt19937 rng(4);
  auto prefix = random_prompt(rng, 64);
  std::atomic<int> produced{0};
  std::promise<void> ten;
  auto a = rig.engine->submit(greedy(prefix, 3000), [&](const ChoiceDelta& d) {
    if (++produced == 10) ten.set_value();
  });
  ten.get_future().wait();
  // A is still running: its prompt pages (and its first generated pages) are shared.
  auto prompt_b = prefix;
  auto ref_a = reference_greedy(prefix, 300, 8);
  prompt_b.insert(prompt_b.end(), ref_a.begin(), ref_a.begin() + 8);
  prompt_b.push_back(7);
  auto rb = rig.engine->submit(greedy(prompt_b, 20)).wait();
  EXPECT_FALSE(a.done());
  EXPECT_EQ(rb.cached_prompt_tokens, 72);  // 18 full pages of 73 tokens (the last token recomputes)
  EXPECT_EQ(rb.choices[0].token_ids, reference_greedy(prompt_b, 300, 20));
  rig.engine->cancel(a);
  auto ra = a.wait();
  ASSERT_GE(ra.choices[0].token_ids.size(), 10u);
  EXPECT_EQ(ra.choices[0].token_ids, reference_greedy(prefix, 300, ra.choices[0].token_ids.size()));
  EXPECT_GE(rig.engine->stats().prefix_cache_hit_tokens, 72u);
  expect_pool_full(*rig.engine);
}

// Requests submitted together with a common prefix: the first computes it, the others wait
// for each of its pages to be published instead of computing it again, so the prefix's
// tokens go through the model once. With the cache off, everyone computes everything.
TEST(Engine, PrefixSharedByRequestsArrivingTogetherIsComputedOnce) {
  for (bool cache : {true, false}) {
    SCOPED_TRACE(cache ? "prefix cache on" : "prefix cache off");
    auto opt = small(4, 4096, 16);  // 16-token steps: the prefix takes the first request 3 steps
    opt.prefix_cache = cache;
    auto rig = make_engine(opt);
    std::mt19937 rng(11);
    const auto prefix = random_prompt(rng, 40);  // 10 full pages
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 4; ++i) {
      prompts.push_back(prefix);
      const auto tail = random_prompt(rng, 6);
      prompts.back().insert(prompts.back().end(), tail.begin(), tail.end());
    }
    prompts.push_back(random_prompt(rng, 46));  // unrelated: never waits
    std::atomic<bool> all_queued{false};
    std::atomic<int64_t> computed{0};
    rig.model->before_forward = [&](const astrai::model::Batch& b) {
      while (!all_queued.load()) std::this_thread::yield();
      computed += b.num_tokens();
    };
    std::vector<RequestHandle> handles;
    for (const auto& p : prompts) handles.push_back(rig.engine->submit(greedy(p, 4)));
    all_queued.store(true);
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto r = handles[i].wait();
      EXPECT_EQ(r.choices[0].token_ids, reference_greedy(prompts[i], 300, 4)) << "request " << i;
      const bool shares = cache && i >= 1 && i <= 3;
      EXPECT_EQ(r.cached_prompt_tokens, shares ? 40 : 0) << "request " << i;
    }
    // 5 prompts of 46 tokens, then 3 decode steps each; the cache spares 3 x 40 prefix tokens.
    EXPECT_EQ(computed.load(), 5 * 46 + 5 * 3 - (cache ? 3 * 40 : 0));
    expect_pool_full(*rig.engine);
  }
}

TEST(Engine, WholePromptInCacheStillRecomputesLastToken) {
  auto rig = make_engine(small(16));
  std::mt19937 rng(5);
  auto prompt = random_prompt(rng, 32);
  auto r1 = rig.engine->submit(greedy(prompt, 5)).wait();
  auto r2 = rig.engine->submit(greedy(prompt, 5)).wait();
  EXPECT_EQ(r1.cached_prompt_tokens, 0);
  EXPECT_EQ(r2.cached_prompt_tokens, 16);
  EXPECT_EQ(r1.choices[0].token_ids, r2.choices[0].token_ids);
  EXPECT_EQ(r2.choices[0].token_ids, reference_greedy(prompt, 300, 5));
  // Invalidation (new weights): nothing matches any more.
  rig.engine->invalidate_prefix_cache(1);
  auto r3 = rig.engine->submit(greedy(prompt, 5)).wait();
  EXPECT_EQ(r3.cached_prompt_tokens, 0);
  EXPECT_EQ(r3.choices[0].token_ids, r1.choices[0].token_ids);
  expect_pool_full(*rig.engine);
}

TEST(Engine, PrefixCacheOffNeverHits) {
  auto opt = small(4);
  opt.prefix_cache = false;
  auto rig = make_engine(opt);
  std::vector<int32_t> prompt(40, 3);
  rig.engine->submit(greedy(prompt, 3)).wait();
  auto r = rig.engine->submit(greedy(prompt, 3)).wait();
  EXPECT_EQ(r.cached_prompt_tokens, 0);
  EXPECT_EQ(rig.engine->stats().kv_pages_cached, 0);
}

TEST(Engine, CancelMidPrefillReturnsPages) {
  auto rig = make_engine(small(4, 4096, 8));
  std::mt19937 rng(6);
  std::promise<void> started, cancelled;
  std::shared_future<void> cancel_sent = cancelled.get_future().share();
  std::atomic<int> forwards{0};
  // The third forward waits until cancel() has returned, so the cancellation always lands in
  // the middle of the prefill, however the two threads are scheduled.
  rig.model->before_forward = [&](const astrai::model::Batch&) {
    if (++forwards == 3) {
      started.set_value();
      cancel_sent.wait();
    }
  };
  auto h = rig.engine->submit(greedy(random_prompt(rng, 200), 10));
  started.get_future().wait();
  rig.engine->cancel(h);
  cancelled.set_value();
  auto r = h.wait();
  EXPECT_EQ(r.choices[0].finish, FinishReason::kCancelled);
  EXPECT_TRUE(r.choices[0].token_ids.empty());
  EXPECT_LT(rig.model->forwards.load(), 25);  // 200 / 8 steps would be needed to finish prefill
  expect_pool_full(*rig.engine);
}

TEST(Engine, CancelMidDecodeFromCallback) {
  auto rig = make_engine(small(4));
  std::mt19937 rng(7);
  // The callback may run before submit() returns; it waits for the handle to be published.
  std::atomic<const RequestHandle*> self{nullptr};
  Engine* engine = rig.engine.get();
  std::atomic<int> n{0};
  std::vector<ChoiceDelta> deltas;
  auto h = engine->submit(greedy(random_prompt(rng, 30), 1000), [&](const ChoiceDelta& d) {
    deltas.push_back(d);
    if (++n == 5) {
      while (!self.load()) std::this_thread::yield();
      engine->cancel(*self.load());
    }
  });
  self.store(&h);
  auto r = h.wait();
  EXPECT_EQ(r.choices[0].finish, FinishReason::kCancelled);
  EXPECT_GE(r.choices[0].token_ids.size(), 5u);
  EXPECT_LE(r.choices[0].token_ids.size(), 6u);
  ASSERT_FALSE(deltas.empty());
  EXPECT_EQ(deltas.back().finish, FinishReason::kCancelled);
  expect_pool_full(*rig.engine);
}

TEST(Engine, NChoicesShareThePromptPages) {
  auto rig = make_engine(small(4));
  std::mt19937 rng(8);
  auto prompt = random_prompt(rng, 23);  // the last page is partial: forked by copy
  auto req = greedy(prompt, 12);
  req.sampling.n = 3;
  auto r = rig.engine->submit(req).wait();
  ASSERT_EQ(r.choices.size(), 3u);
  for (const auto& c : r.choices) EXPECT_EQ(c.token_ids, reference_greedy(prompt, 300, 12));
  // Sampled choices differ from one another but are reproducible with a seed.
  req.sampling.temperature = 1.0f;
  req.sampling.seed = 42;
  req.sampling.n = 4;
  auto s1 = rig.engine->submit(req).wait();
  auto s2 = rig.engine->submit(req).wait();
  ASSERT_EQ(s1.choices.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(s1.choices[i].token_ids, s2.choices[i].token_ids);
  EXPECT_NE(s1.choices[0].token_ids, s1.choices[1].token_ids);
  EXPECT_EQ(s1.completion_tokens, 48);
  expect_pool_full(*rig.engine);
}

TEST(Engine, SeedGivesSameOutputWhateverTheBatch) {
  auto rig = make_engine(small(4, 4096, 32));
  std::mt19937 rng(9);
  auto prompt = random_prompt(rng, 40);
  GenerationRequest req = greedy(prompt, 25);
  req.sampling.temperature = 0.8f;
  req.sampling.top_p = 0.9f;
  req.sampling.top_k = 50;
  req.sampling.seed = 1234;
  auto alone = rig.engine->submit(req).wait();
  std::vector<RequestHandle> others;
  for (int i = 0; i < 20; ++i) {
    auto o = greedy(random_prompt(rng, 1 + rng() % 100), 30);
    o.sampling.temperature = 1.0f;
    others.push_back(rig.engine->submit(o));
  }
  auto batched = rig.engine->submit(req).wait();
  EXPECT_EQ(alone.choices[0].token_ids, batched.choices[0].token_ids);
  req.sampling.seed = 99;
  auto other_seed = rig.engine->submit(req).wait();
  EXPECT_NE(alone.choices[0].token_ids, other_seed.choices[0].token_ids);
  for (auto& o : others) o.wait();
  expect_pool_full(*rig.engine);
}

// The rows of a step are sampled over the engine's threads (presample_rows): the tokens of 12
// seeded choices (temperature, top-k, top-p, logprobs, n = 2) decoded together are the same with
// 1, 2 and 3 threads.
TEST(Engine, SampledTokensDoNotDependOnTheThreads) {
#if defined(__SANITIZE_THREAD__)
  // libgomp is not built for ThreadSanitizer: its barriers are invisible to it, so every
  // parallel region looks like a race (the release and ASan builds run this test).
  GTEST_SKIP() << "OpenMP teams under ThreadSanitizer report libgomp's own synchronisation as races";
#endif
  auto run = [](int threads) {
    const int saved = astrai::num_threads();
    astrai::set_num_threads(threads);
    auto rig = make_engine(small(4, 4096, 256));
    astrai::set_num_threads(saved);
    std::mt19937 rng(21);
    std::vector<RequestHandle> handles;
    std::atomic<bool> all_queued{false};
    rig.model->before_forward = [&](const astrai::model::Batch&) {
      while (!all_queued.load()) std::this_thread::yield();
    };
    for (int i = 0; i < 12; ++i) {
      GenerationRequest r = greedy(random_prompt(rng, 5 + i), 20);
      r.sampling.temperature = 0.6f + 0.1f * (i % 5);
      r.sampling.top_k = i % 3 == 0 ? 40 : 0;
      r.sampling.top_p = i % 4 == 1 ? 0.9f : 1.0f;
      r.sampling.logprobs = i % 2 ? 3 : -1;
      r.sampling.n = i == 7 ? 2 : 1;
      r.sampling.seed = 100 + i;
      handles.push_back(rig.engine->submit(r));
    }
    all_queued.store(true);
    std::vector<std::vector<int32_t>> tokens;
    for (auto& h : handles)
      for (const auto& c : h.wait().choices) tokens.push_back(c.token_ids);
    return tokens;
  };
  const auto one = run(1);
  EXPECT_EQ(one.size(), 13u);
  EXPECT_EQ(run(2), one);
  EXPECT_EQ(run(3), one);
}

TEST(Engine, LongPromptsErrorOrTruncateLeft) {
  auto rig = make_engine(small(4), 300, 128);
  std::mt19937 rng(10);
  auto prompt = random_prompt(rng, 200);
  EXPECT_THROW(rig.engine->submit(greedy(prompt, 5)), astrai::Error);
  auto req = greedy(prompt, 5);
  req.truncate_left = true;
  auto r = rig.engine->submit(req).wait();
  EXPECT_EQ(r.prompt_tokens, 127);
  EXPECT_EQ(r.prompt_ids, std::vector<int32_t>(prompt.end() - 127, prompt.end()));
  EXPECT_EQ(r.choices[0].token_ids.size(), 1u);
  EXPECT_EQ(r.choices[0].finish, FinishReason::kLength);
}

TEST(Engine, MaxTokensBeyondContextIsClamped) {
  auto rig = make_engine(small(4), 300, 64);
  std::mt19937 rng(11);
  auto prompt = random_prompt(rng, 50);
  auto r = rig.engine->submit(greedy(prompt, 1000)).wait();
  EXPECT_EQ(r.choices[0].token_ids.size(), 14u);
  EXPECT_EQ(r.choices[0].finish, FinishReason::kLength);
  EXPECT_EQ(r.choices[0].token_ids, reference_greedy(prompt, 300, 14));
}

TEST(Engine, StopStringsAcrossTokenBoundariesAreNeverEmitted) {
  auto rig = make_engine(small(4));
  std::vector<int32_t> prompt(10, 'x');
  // Positions 10.. produce: "a", "ST", "OP", "b".
  rig.model->forced_next = {{10, 'a'}, {11, 262}, {12, 263}, {13, 'b'}};
  for (const char* stop : {"STOP", "TO", "aS"}) {
    auto req = greedy(prompt, 10);
    req.sampling.stop_strings = {stop, "never"};
    std::string streamed;
    auto r = rig.engine->submit(req, [&](const ChoiceDelta& d) { streamed += d.text; }).wait();
    const std::string expect = std::string(stop) == "STOP" ? "a" : std::string(stop) == "TO" ? "aS" : "";
    EXPECT_EQ(r.choices[0].text, expect) << stop;
    EXPECT_EQ(streamed, expect) << stop;
    EXPECT_EQ(r.choices[0].finish, FinishReason::kStopString);
    EXPECT_EQ(r.choices[0].matched_stop, stop);
  }
  // A stop-string prefix that never completes is emitted in the end.
  auto req = greedy(prompt, 2);
  req.sampling.stop_strings = {"STX"};
  auto r = rig.engine->submit(req).wait();
  EXPECT_EQ(r.choices[0].text, "aST");
  EXPECT_EQ(r.choices[0].finish, FinishReason::kLength);
}

TEST(Engine, Utf8SplitAcrossTokensIsHeldUntilWhole) {
  auto rig = make_engine(small(4));
  std::vector<int32_t> prompt(6, 'x');
  // "\xE2\x82" + "\xAC" = "€", then "\xF0\x9F" + "\x98\x80" = "😀".
  rig.model->forced_next = {{6, 258}, {7, 259}, {8, 260}, {9, 261}, {10, 'z'}};
  std::vector<std::string> pieces;
  auto r = rig.engine->submit(greedy(prompt, 5), [&](const ChoiceDelta& d) { pieces.push_back(d.text); }).wait();
  EXPECT_EQ(r.choices[0].text, "\xE2\x82\xAC\xF0\x9F\x98\x80z");
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "\xE2\x82\xAC", "", "\xF0\x9F\x98\x80", "z"}));
}

TEST(Engine, StopTokenEndsChoiceWithoutText) {
  auto rig = make_engine(small(4), 300, 4096, /*eos=*/{264});
  std::vector<int32_t> prompt(6, 'x');
  rig.model->forced_next = {{6, 'o'}, {7, 'k'}, {8, 264}, {9, 'z'}};
  auto r = rig.engine->submit(greedy(prompt, 10)).wait();
  EXPECT_EQ(r.choices[0].text, "ok");
  EXPECT_EQ(r.choices[0].finish, FinishReason::kStop);
  EXPECT_EQ(r.choices[0].token_ids, (std::vector<int32_t>{'o', 'k', 264}));
  auto req = greedy(prompt, 4);
  req.sampling.ignore_eos = true;
  auto r2 = rig.engine->submit(req).wait();
  EXPECT_EQ(r2.choices[0].finish, FinishReason::kLength);
  EXPECT_EQ(r2.choices[0].token_ids.size(), 4u);
}

TEST(Engine, TextPromptsAndMessages) {
  auto rig = make_engine(small(4));
  GenerationRequest req;
  req.prompt_text = "hello";
  req.sampling.temperature = 0;
  req.sampling.max_tokens = 3;
  auto r = rig.engine->submit(req).wait();
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{'h', 'e', 'l', 'l', 'o'}));
  GenerationRequest chat;
  chat.messages = astrai::Json::array({{{"role", "user"}, {"content", "hi"}}});
  chat.sampling.max_tokens = 2;
  auto rc = rig.engine->submit(chat).wait();
  const std::string rendered = "user: hi\nassistant: ";
  EXPECT_EQ(rc.prompt_tokens, static_cast<int32_t>(rendered.size()));
}

TEST(Engine, LogprobsAndPromptLogprobsMatchTheModel) {
  auto rig = make_engine(small(4));
  std::mt19937 rng(12);
  auto prompt = random_prompt(rng, 9);
  auto req = greedy(prompt, 3);
  req.sampling.logprobs = 2;
  req.prompt_logprobs = true;
  auto r = rig.engine->submit(req).wait();
  auto log_softmax = [](std::vector<float> l) {
    float mx = *std::max_element(l.begin(), l.end());
    double s = 0;
    for (float v : l) s += std::exp(double(v) - mx);
    for (auto& v : l) v = v - mx - float(std::log(s));
    return l;
  };
  ASSERT_EQ(r.prompt_logprobs.size(), prompt.size());
  for (size_t i = 1; i < prompt.size(); ++i) {
    auto ls = log_softmax(reference_logits(std::vector<int32_t>(prompt.begin(), prompt.begin() + i), 300));
    EXPECT_NEAR(r.prompt_logprobs[i].logprob, ls[prompt[i]], 1e-4) << i;
    EXPECT_EQ(r.prompt_logprobs[i].top.size(), 2u);
  }
  auto tokens = prompt;
  ASSERT_EQ(r.choices[0].logprobs.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    auto ls = log_softmax(reference_logits(tokens, 300));
    const int32_t t = r.choices[0].token_ids[k];
    EXPECT_NEAR(r.choices[0].logprobs[k].logprob, ls[t], 1e-4);
    EXPECT_EQ(r.choices[0].logprobs[k].top[0].first, t);  // greedy picks the top one
    tokens.push_back(t);
  }
}

TEST(Engine, BadRequestsThrowClearErrors) {
  auto rig = make_engine(small(4));
  EXPECT_THROW(rig.engine->submit(greedy({}, 3)), astrai::Error);
  EXPECT_THROW(rig.engine->submit(greedy({1, 2, 999}, 3)), astrai::Error);
  auto req = greedy({1, 2}, 3);
  req.sampling.top_p = 0;
  EXPECT_THROW(rig.engine->submit(req), astrai::Error);
  req = greedy({1, 2}, 0);
  EXPECT_THROW(rig.engine->submit(req), astrai::Error);
}

TEST(Engine, RandomSubmitCancelFinishPreemptKeepsPagesAccounted) {
  // Small pool (preemption), small steps (chunked prefill), shared prefixes (prefix cache),
  // random cancellation from another thread and from callbacks; every page must come back.
  auto rig = make_engine(small(4, 60, 24));
  std::mt19937 rng(13);
  auto common = random_prompt(rng, 40);
  struct Item {
    std::vector<int32_t> prompt;
    int32_t max_tokens;
    bool cancel;
    RequestHandle handle{nullptr};
  };
  std::vector<Item> items;
  for (int round = 0; round < 25; ++round) {
    std::vector<size_t> batch;
    for (int i = 0; i < 12; ++i) {
      Item it;
      it.prompt = rng() % 2 ? std::vector<int32_t>(common.begin(), common.begin() + rng() % 40 + 1)
                            : random_prompt(rng, 1 + rng() % 60);
      const int extra = rng() % 10;
      for (int k = 0; k < extra; ++k) it.prompt.push_back(rng() % 256);
      if (it.prompt.empty()) it.prompt.push_back(1);
      it.max_tokens = 1 + rng() % 25;
      it.cancel = rng() % 4 == 0;
      auto req = greedy(it.prompt, it.max_tokens);
      if (rng() % 5 == 0) req.sampling.n = 2;
      it.handle = rig.engine->submit(req);
      items.push_back(std::move(it));
      batch.push_back(items.size() - 1);
    }
    for (size_t i : batch)
      if (items[i].cancel) {
        if (rng() % 2) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
        rig.engine->cancel(items[i].handle);
      }
    for (size_t i : batch) {
      auto r = items[i].handle.wait();
      for (const auto& c : r.choices) {
        if (c.finish == FinishReason::kCancelled) {
          EXPECT_TRUE(items[i].cancel);
          continue;
        }
        EXPECT_EQ(c.token_ids, reference_greedy(items[i].prompt, 300, items[i].max_tokens));
      }
    }
    expect_pool_full(*rig.engine);
  }
  EXPECT_GT(rig.engine->stats().preemptions, 0u);
  EXPECT_GT(rig.engine->stats().prefix_cache_hit_tokens, 0u);
}

TEST(Engine, DestructorCancelsUnfinishedRequests) {
  auto rig = make_engine(small(4));
  std::mt19937 rng(14);
  auto h = rig.engine->submit(greedy(random_prompt(rng, 10), 100000));
  rig.engine.reset();
  EXPECT_TRUE(h.done());
  EXPECT_EQ(h.wait().choices[0].finish, FinishReason::kCancelled);
}
