// Tool-call parsing: whole-text cases per format, and streaming equivalence under every split.
#include "tokenizer/tool_calls.h"

#include <gtest/gtest.h>

#include <random>

#include "base/error.h"

namespace astrai::tokenizer {
namespace {

constexpr uint64_t kSeed = 7;

struct Expect {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

void check(ToolCallFormat f, const std::string& text, const Expect& want) {
  SCOPED_TRACE(text);
  ToolCallParse got = parse_tool_calls(text, f, kSeed);
  EXPECT_EQ(got.content, want.content);
  ASSERT_EQ(got.tool_calls.size(), want.calls.size());
  for (size_t i = 0; i < want.calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].name, want.calls[i].first);
    EXPECT_EQ(got.tool_calls[i].arguments, want.calls[i].second);
    EXPECT_FALSE(got.tool_calls[i].id.empty());
  }
}

// Feeding the text in pieces gives the same result as parsing it whole, and content is emitted
// as a prefix-consistent stream (never retracted).
ToolCallParse stream(ToolCallFormat f, const std::string& text, const std::vector<size_t>& cuts) {
  ToolCallStreamParser p(f, kSeed);
  ToolCallParse all;
  size_t prev = 0;
  auto take = [&](ToolCallParse d) {
    all.content += d.content;
    for (auto& c : d.tool_calls) all.tool_calls.push_back(std::move(c));
  };
  for (size_t c : cuts) {
    take(p.feed(std::string_view(text).substr(prev, c - prev)));
    prev = c;
  }
  take(p.feed(std::string_view(text).substr(prev)));
  take(p.finish());
  return all;
}

void check_streaming(ToolCallFormat f, const std::string& text) {
  SCOPED_TRACE(text);
  ToolCallParse whole = parse_tool_calls(text, f, kSeed);
  auto same = [&](const ToolCallParse& s) {
    EXPECT_EQ(s.content, whole.content);
    ASSERT_EQ(s.tool_calls.size(), whole.tool_calls.size());
    for (size_t i = 0; i < s.tool_calls.size(); ++i) {
      EXPECT_EQ(s.tool_calls[i].name, whole.tool_calls[i].name);
      EXPECT_EQ(s.tool_calls[i].arguments, whole.tool_calls[i].arguments);
      EXPECT_EQ(s.tool_calls[i].id, whole.tool_calls[i].id);
    }
  };
  // Every single split point, then byte by byte, then random chunkings.
  for (size_t c = 0; c <= text.size(); ++c) same(stream(f, text, {c}));
  std::vector<size_t> bytes;
  for (size_t c = 1; c < text.size(); ++c) bytes.push_back(c);
  same(stream(f, text, bytes));
  std::mt19937 rng(1);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<size_t> cuts;
    for (size_t c = 1; c < text.size(); ++c)
      if (rng() % 4 == 0) cuts.push_back(c);
    same(stream(f, text, cuts));
  }
}

TEST(ToolCalls, HermesSingle) {
  check(ToolCallFormat::kHermes,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>",
        {"", {{"get_weather", "{\"location\":\"Paris\"}"}}});
}

TEST(ToolCalls, HermesContentBeforeAndParallel) {
  check(ToolCallFormat::kHermes,
        "Let me check both.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"y\": [1, 2.5, \"z\"], \"k\": {\"n\": null}}}\n</tool_call>",
        {"Let me check both.", {{"a", "{\"x\":1}"}, {"b", "{\"y\":[1,2.5,\"z\"],\"k\":{\"n\":null}}"}}});
}

TEST(ToolCalls, HermesKeepsArgumentKeyOrderAndUnicode) {
  check(ToolCallFormat::kHermes,
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"z\": \"日本\", \"a\": \"😀\"}}</tool_call>",
        {"", {{"f", "{\"z\":\"日本\",\"a\":\"😀\"}"}}});
}

TEST(ToolCalls, HermesStringArgumentsAndMissingArguments) {
  check(ToolCallFormat::kHermes, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
        {"", {{"f", "{\"a\": 1}"}}});
  check(ToolCallFormat::kHermes, "<tool_call>{\"name\": \"now\"}</tool_call>", {"", {{"now", "{}"}}});
}

TEST(ToolCalls, HermesInvalidBlockStaysContent) {
  check(ToolCallFormat::kHermes, "Hi <tool_call>not json</tool_call> there",
        {"Hi <tool_call>not json</tool_call> there", {}});
  check(ToolCallFormat::kHermes, "<tool_call>{\"arguments\": {}}</tool_call>",
        {"<tool_call>{\"arguments\": {}}</tool_call>", {}});
}

TEST(ToolCalls, HermesUnterminatedAtEnd) {
  // Generation stopped before </tool_call>: a complete JSON body still counts...
  check(ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n", {"", {{"f", "{}"}}});
  // ...an incomplete one is content.
  check(ToolCallFormat::kHermes, "ok <tool_call>\n{\"name\": \"f\", \"argu",
        {"ok <tool_call>\n{\"name\": \"f\", \"argu", {}});
}

TEST(ToolCalls, HermesTextAfterCall) {
  check(ToolCallFormat::kHermes, "A<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n\nB ",
        {"AB", {{"f", "{}"}}});
}

TEST(ToolCalls, HermesXmlFunctionQwen3Coder) {
  check(ToolCallFormat::kHermes,
        "I'll look.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis, France\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"c\"}\n</parameter>\n"
        "<parameter=note>\nline one\nline two\n</parameter>\n</function>\n</tool_call>",
        {"I'll look.",
         {{"get_weather", "{\"location\":\"Paris, France\",\"days\":3,\"opts\":{\"unit\":\"c\"},\"note\":\"line one\\nline two\"}"}}});
  check(ToolCallFormat::kHermes, "<tool_call>\n<function=now>\n</function>\n</tool_call>", {"", {{"now", "{}"}}});
  check(ToolCallFormat::kHermes, "<tool_call><function=f><parameter=a>1</function></tool_call>",
        {"<tool_call><function=f><parameter=a>1</function></tool_call>", {}});
}

TEST(ToolCalls, PlainTextKeepsWhitespace) {
  check(ToolCallFormat::kHermes, "  Hello,\n world!\n\n", {"  Hello,\n world!\n\n", {}});
  check(ToolCallFormat::kMistral, "a < b and [x] ", {"a < b and [x] ", {}});
  check(ToolCallFormat::kLlama3Json, "\nJust text {not: json}\n", {"\nJust text {not: json}\n", {}});
}

TEST(ToolCalls, Llama3Json) {
  check(ToolCallFormat::kLlama3Json, "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}",
        {"", {{"get_weather", "{\"location\":\"Paris\"}"}}});
  check(ToolCallFormat::kLlama3Json, "\n {\"name\": \"f\", \"arguments\": {\"a\": true}}",
        {"", {{"f", "{\"a\":true}"}}});
  check(ToolCallFormat::kLlama3Json,
        "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"q\": \"x;y\"}}",
        {"", {{"a", "{}"}, {"b", "{\"q\":\"x;y\"}"}}});
  check(ToolCallFormat::kLlama3Json, "Sure.<|python_tag|>{\"name\": \"f\", \"parameters\": {\"n\": 3}}",
        {"Sure.", {{"f", "{\"n\":3}"}}});
}

TEST(ToolCalls, Llama3JsonThatIsNotACall) {
  check(ToolCallFormat::kLlama3Json, "{\"answer\": 42} is the JSON you asked for.",
        {"{\"answer\": 42} is the JSON you asked for.", {}});
  check(ToolCallFormat::kLlama3Json, "{\"name\": \"f\", \"parameters\": {\"a\":", {"{\"name\": \"f\", \"parameters\": {\"a\":", {}});
}

TEST(ToolCalls, MistralJsonArray) {
  check(ToolCallFormat::kMistral,
        "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}, \"id\": \"abcDEF123\"}, "
        "{\"name\": \"search\", \"arguments\": {\"query\": \"]\\\"[\"}}]",
        {"", {{"get_weather", "{\"location\":\"Paris\"}"}, {"search", "{\"query\":\"]\\\"[\"}"}}});
  ToolCallParse p = parse_tool_calls("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"abcDEF123\"}, "
                                     "{\"name\": \"g\", \"arguments\": {}}]",
                                     ToolCallFormat::kMistral, kSeed);
  ASSERT_EQ(p.tool_calls.size(), 2u);
  EXPECT_EQ(p.tool_calls[0].id, "abcDEF123");
  EXPECT_EQ(p.tool_calls[1].id.size(), 9u);  // Mistral templates require 9 alphanumerics
}

TEST(ToolCalls, MistralV11) {
  check(ToolCallFormat::kMistral, "Checking.[TOOL_CALLS]get_weather[ARGS]{\"location\": \"Paris\"}",
        {"Checking.", {{"get_weather", "{\"location\":\"Paris\"}"}}});
  check(ToolCallFormat::kMistral, "[TOOL_CALLS]a[ARGS]{\"x\": 1}[TOOL_CALLS]b[CALL_ID]Xy12345ab[ARGS]{}",
        {"", {{"a", "{\"x\":1}"}, {"b", "{}"}}});
  ToolCallParse p = parse_tool_calls("[TOOL_CALLS]b[CALL_ID]Xy12345ab[ARGS]{}", ToolCallFormat::kMistral, kSeed);
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].id, "Xy12345ab");
}

TEST(ToolCalls, MistralInvalidPayloadIsContent) {
  check(ToolCallFormat::kMistral, "[TOOL_CALLS] oops", {"[TOOL_CALLS] oops", {}});
  check(ToolCallFormat::kMistral, "x [TOOL_CALLS][{\"arguments\": {}}]", {"x [TOOL_CALLS][{\"arguments\": {}}]", {}});
}

TEST(ToolCalls, IdsAreUniqueAndShaped) {
  ToolCallParse p = parse_tool_calls(
      "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>", ToolCallFormat::kHermes);
  ASSERT_EQ(p.tool_calls.size(), 2u);
  EXPECT_NE(p.tool_calls[0].id, p.tool_calls[1].id);
  EXPECT_EQ(p.tool_calls[0].id.rfind("call_", 0), 0u);
  EXPECT_EQ(p.tool_calls[0].id.size(), 29u);
}

TEST(ToolCalls, NoneFormatPassesThrough) {
  ToolCallStreamParser p(ToolCallFormat::kNone);
  EXPECT_EQ(p.feed("<tool_call>{\"name\": \"f\"}").content, "<tool_call>{\"name\": \"f\"}");
  EXPECT_TRUE(p.finish().tool_calls.empty());
}

TEST(ToolCalls, StreamingHoldsBackMarkerPrefixes) {
  ToolCallStreamParser p(ToolCallFormat::kHermes, kSeed);
  EXPECT_EQ(p.feed("Hello <tool").content, "Hello");  // " <tool" may start a call
  ToolCallParse d = p.feed("_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}");
  EXPECT_EQ(d.content, "");
  EXPECT_TRUE(d.tool_calls.empty());  // not closed yet
  d = p.feed("</tool_call>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"a\":1}");
  EXPECT_TRUE(p.saw_tool_call());
  EXPECT_EQ(p.finish().content, "");

  ToolCallStreamParser q(ToolCallFormat::kHermes, kSeed);
  EXPECT_EQ(q.feed("a <").content, "a");
  EXPECT_EQ(q.feed("b> c").content, " <b> c");  // not a marker after all: released
  EXPECT_EQ(q.finish().content, "");
}

TEST(ToolCalls, StreamingEqualsWholeParse) {
  const std::vector<std::pair<ToolCallFormat, std::string>> cases = {
      {ToolCallFormat::kHermes, "Let me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                "{\"location\": \"Paris\", \"note\": \"</tool_call> in a string\"}}\n</tool_call>"},
      {ToolCallFormat::kHermes, "<tool_call>{\"name\": \"a\"}</tool_call>\n<tool_call>{\"name\": \"b\", "
                                "\"arguments\": {}}</tool_call> done"},
      {ToolCallFormat::kHermes, "no calls here, just < and <tool and <tool_cal text\n"},
      {ToolCallFormat::kHermes, "x\n<tool_call>\n<function=f>\n<parameter=q>\na < b\n</parameter>\n</function>\n</tool_call>"},
      {ToolCallFormat::kHermes, "x <tool_call>broken</tool_call> y <tool_call>{\"name\": \"z\"}"},
      {ToolCallFormat::kLlama3Json, "{\"name\": \"f\", \"parameters\": {\"a\": [1, {\"b\": \"}\"}]}}"},
      {ToolCallFormat::kLlama3Json, "  plain answer with {braces}  "},
      {ToolCallFormat::kLlama3Json, "Sure <|python_tag|>{\"name\": \"a\", \"parameters\": {}};{\"name\": \"b\", "
                                    "\"parameters\": {}}"},
      {ToolCallFormat::kMistral, "Ok.[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"q\": \"[TOOL_CALLS]\"}}]"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS]a[ARGS]{\"x\": 1}[TOOL_CALLS]b[CALL_ID]Xy12345ab[ARGS]{\"y\": 2}"},
      {ToolCallFormat::kMistral, "[TOOL_CALL text that is not a marker"},
  };
  for (const auto& [f, text] : cases) check_streaming(f, text);
}

// An end marker inside a JSON string closes the block early (as in other Hermes parsers); the
// truncated body does not parse, so nothing is reported as a call.
TEST(ToolCalls, EndMarkerInsideJsonString) {
  ToolCallParse p = parse_tool_calls(
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"a</tool_call>b\"}}</tool_call>", ToolCallFormat::kHermes,
      kSeed);
  EXPECT_TRUE(p.tool_calls.empty());
  EXPECT_EQ(p.content, "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"a</tool_call>b\"}}</tool_call>");
}

TEST(ToolCalls, DetectFormat) {
  EXPECT_EQ(detect_tool_call_format("{{ '<tool_call>\\n' }}"), ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format("{{ '[TOOL_CALLS]' }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(detect_tool_call_format("<|start_header_id|> ... \"parameters\""), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(detect_tool_call_format("{{ messages }}"), ToolCallFormat::kNone);
  EXPECT_EQ(parse_tool_call_format("mistral"), ToolCallFormat::kMistral);
  EXPECT_THROW(parse_tool_call_format("xml"), Error);
}

TEST(ToolCalls, FeedAfterFinishThrows) {
  ToolCallStreamParser p(ToolCallFormat::kHermes);
  p.finish();
  EXPECT_THROW(p.feed("x"), Error);
}

}  // namespace
}  // namespace astrai::tokenizer
