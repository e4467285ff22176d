#include "train/rewards.h"

#include <cmath>
#include <cstdlib>
#include <regex>

#include "base/error.h"
#include "base/json.h"
#include "base/subprocess.h"

namespace astrai::train {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_punct(char c) { return std::string_view(".,;:!?\"'`()").find(c) != std::string_view::npos; }

std::string trim(const std::string& s, bool (*drop)(char)) {
  size_t b = 0, e = s.size();
  while (b < e && drop(s[b])) ++b;
  while (e > b && drop(s[e - 1])) --e;
  return s.substr(b, e - b);
}

bool parse_number(const std::string& s, double* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(*v);
}

class ExactMatch final : public RewardFunction {
 public:
  bool needs_answer() const override { return true; }
  double score(const RewardInput& in) const override {
    const std::string got = final_answer(in.completion);
    const std::string want = trim(in.answer, is_space);
    if (got == want) return 1.0;
    double a = 0, b = 0;
    return parse_number(got, &a) && parse_number(want, &b) && a == b ? 1.0 : 0.0;
  }
};

class RegexMatch final : public RewardFunction {
 public:
  explicit RegexMatch(const std::string& pattern) {
    try {
      re_ = std::regex(pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      fail("--reward regex:", pattern, ": invalid pattern (", e.what(), ")");
    }
  }
  double score(const RewardInput& in) const override { return std::regex_search(in.completion, re_) ? 1.0 : 0.0; }

 private:
  std::regex re_;
};

class Command final : public RewardFunction {
 public:
  Command(std::string program, double timeout) : program_(std::move(program)), timeout_(timeout) {
    ASTRAI_CHECK(!program_.empty(), "--reward command: needs a program (command:PROGRAM)");
    ASTRAI_CHECK(timeout_ > 0, "--reward-timeout must be positive");
  }
  double score(const RewardInput& in) const override {
    const Json j{{"prompt", in.prompt}, {"completion", in.completion}, {"answer", in.answer}};
    const SubprocessResult r = run_shell(program_, j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n", timeout_);
    ASTRAI_CHECK(!r.timed_out, "reward command `", program_, "` did not answer within --reward-timeout ", timeout_, " s");
    ASTRAI_CHECK(r.exit_code == 0, "reward command `", program_, "` failed (",
                 r.term_signal ? str_cat("signal ", r.term_signal) : str_cat("exit code ", r.exit_code), ")");
    double v = 0;
    ASTRAI_CHECK(parse_number(trim(r.out, is_space), &v), "reward command `", program_,
                 "` printed \"", r.out.substr(0, 80), "\"; expected one finite number");
    return v;
  }

 private:
  std::string program_;
  double timeout_;
};

}  // namespace

std::string final_answer(const std::string& completion) {
  const std::string t = trim(completion, is_space);
  size_t b = t.size();
  while (b > 0 && !is_space(t[b - 1])) --b;
  return trim(t.substr(b), is_punct);
}

std::unique_ptr<RewardFunction> make_reward(const std::string& spec, double timeout_seconds) {
  if (spec == "exact-match") return std::make_unique<ExactMatch>();
  if (spec.rfind("regex:", 0) == 0) return std::make_unique<RegexMatch>(spec.substr(6));
  if (spec.rfind("command:", 0) == 0) return std::make_unique<Command>(spec.substr(8), timeout_seconds);
  fail("unknown --reward \"", spec, "\" (exact-match, regex:PATTERN, command:PROGRAM)");
}

}  // namespace astrai::train
