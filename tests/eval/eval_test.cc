// The eval layer's pure parts: the sliding windows, the task file and the (context,
// continuation) split, the scoring summary and URL parsing. The scoring itself is checked
// against PyTorch and `astrai score` by oracle_eval.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "base/error.h"
#include "eval/http_client.h"
#include "eval/perplexity.h"
#include "eval/tasks.h"

namespace astrai::eval {
namespace {

// Every token but the first is scored exactly once, each in a window that holds it.
TEST(SlidingWindows, OverlappingWindowsScoreEveryTokenOnce) {
  for (int64_t n : {2, 3, 10, 64, 65, 100}) {
    for (int64_t context : {2, 5, 16, 64}) {
      for (int64_t stride = 1; stride < context; ++stride) {
        std::vector<int> seen(static_cast<size_t>(n), 0);
        for (const Window& w : sliding_windows(n, context, stride)) {
          ASSERT_LE(w.end - w.begin, context);
          ASSERT_GT(w.first, w.begin);
          for (int64_t t = w.first; t < w.end; ++t) ++seen[static_cast<size_t>(t)];
        }
        EXPECT_EQ(seen[0], 0);
        for (int64_t t = 1; t < n; ++t) ASSERT_EQ(seen[static_cast<size_t>(t)], 1) << n << " " << context << " " << stride;
      }
    }
  }
}

TEST(SlidingWindows, TheRecipesWindows) {
  // 10 tokens, windows of 4 every 2: [0,4) scores 1..3, [2,6) scores 4..5, [4,8) 6..7, [6,10) 8..9.
  const auto w = sliding_windows(10, 4, 2);
  ASSERT_EQ(w.size(), 4u);
  EXPECT_EQ(w[0].begin, 0);
  EXPECT_EQ(w[0].first, 1);
  EXPECT_EQ(w[0].end, 4);
  EXPECT_EQ(w[1].begin, 2);
  EXPECT_EQ(w[1].first, 4);
  EXPECT_EQ(w[1].end, 6);
  EXPECT_EQ(w[3].begin, 6);
  EXPECT_EQ(w[3].first, 8);
  EXPECT_EQ(w[3].end, 10);
}

TEST(SlidingWindows, DisjointWindowsSkipEachWindowsFirstToken) {
  // Windows of 4 every 4 over 10 tokens: [0,4) scores 1..3, [4,8) 5..7, [8,10) 9.
  const auto w = sliding_windows(10, 4, 4);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[1].first, 5);
  EXPECT_EQ(w[2].begin, 8);
  EXPECT_EQ(w[2].first, 9);
  EXPECT_EQ(w[2].end, 10);
}

TEST(SlidingWindows, BadOptionsAreClearErrors) {
  EXPECT_THROW(sliding_windows(10, 1, 1), Error);
  EXPECT_THROW(sliding_windows(10, 4, 0), Error);
  EXPECT_THROW(sliding_windows(10, 4, 5), Error);
  EXPECT_THROW(sliding_windows(1, 4, 2), Error);
  try {
    check_window_options(8, 9);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--stride 9 is larger than --context 8"), std::string::npos);
  }
}

TEST(PerplexityResult, Metrics) {
  PerplexityResult r;
  r.nll = 20.0;
  r.scored_tokens = 10;
  r.scored_bytes = 40;
  EXPECT_DOUBLE_EQ(r.nll_per_token(), 2.0);
  EXPECT_DOUBLE_EQ(r.perplexity(), std::exp(2.0));
  EXPECT_DOUBLE_EQ(r.bits_per_byte(), 0.5 / std::log(2.0));
  EXPECT_DOUBLE_EQ(r.byte_perplexity(), std::exp(0.5));
  EXPECT_NEAR(std::pow(2.0, r.bits_per_byte()), r.byte_perplexity(), 1e-12);
  EXPECT_DOUBLE_EQ(r.to_json()["perplexity"].get<double>(), std::exp(2.0));
  r.scored_bytes = 0;  // e.g. only special tokens scored: no per-byte figures
  EXPECT_TRUE(r.to_json()["bits_per_byte"].is_null());
  EXPECT_TRUE(r.to_json()["byte_perplexity"].is_null());
}

TEST(Tasks, TrailingWhitespaceMovesToTheContinuation) {
  EXPECT_EQ(context_and_continuation("Q: x\nA: ", "Paris"), std::make_pair(std::string("Q: x\nA:"), std::string(" Paris")));
  EXPECT_EQ(context_and_continuation("Q: x\nA:", " Paris"), std::make_pair(std::string("Q: x\nA:"), std::string(" Paris")));
  EXPECT_EQ(context_and_continuation("Q \t\n", "y"), std::make_pair(std::string("Q"), std::string(" \t\ny")));
  EXPECT_EQ(context_and_continuation("Q", "y"), std::make_pair(std::string("Q"), std::string("y")));
}

// A file of its own: ctest runs each test in its own process, two at a time, so the name holds
// the process id (std::rand() started from the same seed in every process, and two tests in
// parallel wrote the same file).
std::string write_temp(const std::string& text) {
  static int counter = 0;
  const std::string path = testing::TempDir() + "/eval_tasks_" + std::to_string(::getpid()) + "_" +
                           std::to_string(counter++) + ".jsonl";
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::string& text) {
  const std::string path = write_temp(text);
  try {
    read_questions(path);
  } catch (const Error& e) {
    std::remove(path.c_str());
    return e.what();
  }
  std::remove(path.c_str());
  return "";
}

TEST(Tasks, ReadsQuestionsAndSkipsBlankLines) {
  const std::string path = write_temp(
      "{\"question\": \"a?\", \"choices\": [\" x\", \" y\"], \"answer\": 1, \"id\": 7}\n\n"
      "{\"question\": \"b?\", \"choices\": [\"z\"], \"answer\": 0}\n");
  const auto qs = read_questions(path);
  std::remove(path.c_str());
  ASSERT_EQ(qs.size(), 2u);
  EXPECT_EQ(qs[0].line, 1);
  EXPECT_EQ(qs[0].choices[1], " y");
  EXPECT_EQ(qs[0].answer, 1);
  EXPECT_EQ(qs[1].line, 3);
}

TEST(Tasks, MalformedRecordsNameTheLine) {
  const std::string ok = "{\"question\": \"q\", \"choices\": [\"a\"], \"answer\": 0}\n";
  EXPECT_NE(error_of(ok + "{\"question\": \"q\", \"choices\": [\"a\"\n").find(":2: not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(ok + ok + "{\"question\": \"q\", \"choices\": [\"a\", \"b\"], \"answer\": 2}\n")
                .find(":3: answer 2 is out of range for 2 choices"),
            std::string::npos);
  EXPECT_NE(error_of("{\"question\": \"q\", \"choices\": [], \"answer\": 0}\n").find(":1: \"choices\" is empty"),
            std::string::npos);
  EXPECT_NE(error_of("{\"question\": \"q\", \"choices\": [\"a\", \"\"], \"answer\": 0}\n").find("choice 1 is an empty string"),
            std::string::npos);
  EXPECT_NE(error_of("{\"question\": \"q\", \"choices\": [\"a\", 2], \"answer\": 0}\n")
                .find(":1: \"choices\" must be a list of strings, not 2"),
            std::string::npos);
  EXPECT_NE(error_of("{\"question\": \"q\", \"choices\": \"a\", \"answer\": 0}\n").find("must be a list of strings"),
            std::string::npos);
  EXPECT_NE(error_of("{\"question\": \"q\", \"choices\": [\"a\"]}\n").find("\"answer\" must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of("{\"question\": \"q\", \"choices\": [\"a\"], \"answer\": \"0\"}\n").find("\"answer\" must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of("{\"choices\": [\"a\"], \"answer\": 0}\n").find("missing required field \"question\""),
            std::string::npos);
  EXPECT_NE(error_of("{\"question\": \" \", \"choices\": [\"a\"], \"answer\": 0}\n").find("\"question\" is empty"),
            std::string::npos);
  EXPECT_NE(error_of("[1, 2]\n").find("expected a JSON object"), std::string::npos);
  EXPECT_NE(error_of("\n\n").find("no questions"), std::string::npos);
  EXPECT_THROW(read_questions("/nonexistent/tasks.jsonl"), Error);
}

TEST(Tasks, AccuracyAndByteNormalisedAccuracy) {
  std::vector<Question> qs(2);
  qs[0].choices = {"a", "bbbb"};  // sums -2, -4: acc picks 0; per byte -2, -1: acc_norm picks 1
  qs[0].answer = 1;
  qs[1].choices = {"\xC3\xA9", "e"};  // "é" is 2 bytes: -3/2 = -1.5 beats -2/1 for acc_norm; acc picks 1
  qs[1].answer = 0;
  const TaskResult r = summarize_tasks(qs, {{{-2, 1}, {-4, 2}}, {{-3, 1}, {-2, 1}}});
  EXPECT_EQ(r.questions, 2);
  EXPECT_EQ(r.correct, 0);
  EXPECT_EQ(r.correct_norm, 2);
  EXPECT_DOUBLE_EQ(r.acc(), 0.0);
  EXPECT_DOUBLE_EQ(r.acc_norm(), 1.0);
  EXPECT_EQ(r.per_question[0]["pred"], 0);
  EXPECT_EQ(r.per_question[0]["pred_norm"], 1);
  // Ties go to the lowest index.
  const TaskResult t = summarize_tasks({qs[0]}, {{{-1, 1}, {-1, 1}}});
  EXPECT_EQ(t.per_question[0]["pred"], 0);
}

TEST(HttpUrl, Parses) {
  const HttpUrl a = parse_http_url("http://127.0.0.1:8080");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, "8080");
  EXPECT_EQ(a.path, "/");
  const HttpUrl b = parse_http_url("http://example.org/v1/completions");
  EXPECT_EQ(b.host, "example.org");
  EXPECT_EQ(b.port, "80");
  EXPECT_EQ(b.path, "/v1/completions");
  const HttpUrl c = parse_http_url("http://[::1]:9000/x");
  EXPECT_EQ(c.host, "::1");
  EXPECT_EQ(c.port, "9000");
  EXPECT_EQ(c.path, "/x");
  EXPECT_THROW(parse_http_url("https://example.org"), Error);
  EXPECT_THROW(parse_http_url("example.org:80"), Error);
  EXPECT_THROW(parse_http_url("http://:80"), Error);
  EXPECT_THROW(parse_http_url("http://host:99999"), Error);
  EXPECT_THROW(parse_http_url("http://host:x"), Error);
}

TEST(HttpClient, ConnectionRefusedIsAClearError) {
  try {
    http_post_json(parse_http_url("http://127.0.0.1:1"), "/v1/completions", "{}", {}, 5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("http://127.0.0.1:1: cannot connect"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace astrai::eval
