// ChoiceScorer over an OpenAI-compatible /v1/completions endpoint, called the way
// lm-evaluation-harness calls it for log-likelihoods: echo true, logprobs 0, max_tokens 0.
// The server tokenizes; the context's token count comes from a request for the context alone.
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "base/json.h"
#include "eval/choice_scorer.h"
#include "eval/http_client.h"

namespace astrai::eval {

namespace {

// One request: the context alone (choice < 0: only its token count is wanted) or context +
// continuation of one choice.
struct Job {
  size_t question = 0;
  int64_t choice = -1;
};

// "/" and a base URL ending in /v1 (as OpenAI clients take it) get /v1/completions appended;
// any other path is the endpoint itself.
std::string completions_path(std::string path) {
  if (path == "/") return "/v1/completions";
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (path.size() >= 3 && path.compare(path.size() - 3, 3, "/v1") == 0) return path + "/completions";
  return path;
}

class ApiChoiceScorer : public ChoiceScorer {
 public:
  explicit ApiChoiceScorer(const ApiOptions& o) : options_(o), url_(parse_http_url(o.url)) {
    ASTRAI_CHECK(o.parallel >= 1, "--parallel must be at least 1, got ", o.parallel);
    path_ = completions_path(url_.path);
    if (!o.api_key.empty()) headers_.emplace_back("Authorization", "Bearer " + o.api_key);
  }

  std::vector<std::vector<ChoiceScore>> score(const std::vector<Question>& questions,
                                              const ProgressFn& progress) override {
    std::vector<Job> jobs;
    for (size_t q = 0; q < questions.size(); ++q)
      for (int64_t c = -1; c < static_cast<int64_t>(questions[q].choices.size()); ++c) jobs.push_back({q, c});
    context_tokens_.assign(questions.size(), 0);
    token_logprobs_.assign(questions.size(), {});
    for (size_t q = 0; q < questions.size(); ++q) token_logprobs_[q].resize(questions[q].choices.size());
    run_jobs(questions, jobs, progress);
    return sums(questions);
  }

 private:
  Json post(const Json& request, const Question& q) const {
    const HttpResponse r = http_post_json(url_, path_, request.dump(), headers_, options_.timeout_seconds);
    Json body;
    try {
      body = Json::parse(r.body);
    } catch (const Json::parse_error&) {
      fail("line ", q.line, ": ", options_.url, path_, " answered ", r.status, " with a body that is not JSON");
    }
    if (r.status != 200) {
      const Json* err = body.contains("error") ? &body["error"] : nullptr;
      fail("line ", q.line, ": ", options_.url, path_, " answered ", r.status, ": ",
           err && err->is_object() ? err->value("message", err->dump()) : body.dump());
    }
    return body;
  }

  void run_job(const std::vector<Question>& questions, const Job& job) {
    try {
      read_job(questions, job);
    } catch (const Json::exception& e) {
      fail("line ", questions[job.question].line, ": ", options_.url, path_,
           " answered without the expected fields (", e.what(), ")");
    }
  }

  void read_job(const std::vector<Question>& questions, const Job& job) {
    const Question& q = questions[job.question];
    const auto [context, continuation] =
        context_and_continuation(q.question, job.choice < 0 ? std::string() : q.choices[static_cast<size_t>(job.choice)]);
    // The context request sends the context alone (the question less its trailing whitespace).
    Json req = {{"prompt", job.choice < 0 ? context : context + continuation},
                {"echo", true},
                {"max_tokens", 0},
                {"temperature", 0}};
    if (job.choice < 0) {
      const Json body = post(req, q);
      context_tokens_[job.question] = body.at("usage").at("prompt_tokens").get<int64_t>();
      return;
    }
    req["logprobs"] = 0;
    const Json body = post(req, q);
    std::vector<double>& out = token_logprobs_[job.question][static_cast<size_t>(job.choice)];
    for (const Json& lp : body.at("choices").at(0).at("logprobs").at("token_logprobs"))
      out.push_back(lp.is_null() ? 0.0 : lp.get<double>());
  }

  void run_jobs(const std::vector<Question>& questions, const std::vector<Job>& jobs, const ProgressFn& progress) {
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex mu;
    std::exception_ptr error;
    size_t choices_done = 0;
    auto worker = [&] {
      for (size_t i; !failed && (i = next++) < jobs.size();) {
        try {
          run_job(questions, jobs[i]);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!error) error = std::current_exception();
          failed = true;
          return;
        }
        if (jobs[i].choice >= 0 && progress) {
          std::lock_guard<std::mutex> lock(mu);
          progress(++choices_done);
        }
      }
    };
    std::vector<std::thread> threads;
    const size_t n = std::min<size_t>(static_cast<size_t>(options_.parallel), jobs.size());
    for (size_t t = 0; t < n; ++t) threads.emplace_back(worker);
    for (auto& t : threads) t.join();
    if (error) std::rethrow_exception(error);
  }

  std::vector<std::vector<ChoiceScore>> sums(const std::vector<Question>& questions) const {
    std::vector<std::vector<ChoiceScore>> out(questions.size());
    for (size_t q = 0; q < questions.size(); ++q) {
      const auto ctx = static_cast<size_t>(context_tokens_[q]);
      for (size_t c = 0; c < questions[q].choices.size(); ++c) {
        const std::vector<double>& lps = token_logprobs_[q][c];
        ASTRAI_CHECK(ctx >= 1 && lps.size() > ctx, "line ", questions[q].line, ": choice ", c,
                     " adds no tokens to the question once tokenized together with it (server: ", lps.size(),
                     " tokens, the question alone ", ctx, ")");
        ChoiceScore s;
        for (size_t i = ctx; i < lps.size(); ++i) s.logprob += lps[i];
        s.tokens = static_cast<int64_t>(lps.size() - ctx);
        out[q].push_back(s);
      }
    }
    return out;
  }

  ApiOptions options_;
  HttpUrl url_;
  std::string path_;
  std::vector<std::pair<std::string, std::string>> headers_;
  std::vector<int64_t> context_tokens_;                      // per question
  std::vector<std::vector<std::vector<double>>> token_logprobs_;  // per question, choice, token
};

}  // namespace

std::unique_ptr<ChoiceScorer> make_api_choice_scorer(const ApiOptions& options) {
  return std::make_unique<ApiChoiceScorer>(options);
}

}  // namespace astrai::eval
