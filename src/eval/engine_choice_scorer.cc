// ChoiceScorer over the local engine: tokenize each (context, continuation) pair, then score
// every choice's continuation tokens in one batched run of span_scorer.
#include <utility>

#include "base/error.h"
#include "eval/choice_scorer.h"
#include "infer/engine.h"
#include "tokenizer/tokenizer.h"

namespace astrai::eval {

namespace {

class EngineChoiceScorer : public ChoiceScorer {
 public:
  explicit EngineChoiceScorer(infer::Engine& engine) : engine_(engine) {}

  std::vector<std::vector<ChoiceScore>> score(const std::vector<Question>& questions,
                                              const ProgressFn& progress) override {
    const tokenizer::Tokenizer& tok = engine_.tokenizer();
    const int64_t limit = max_scored_length(engine_);
    std::vector<std::vector<int32_t>> seqs;
    std::vector<ScoreSpan> spans;
    for (const Question& q : questions) {
      // The context is the question less its trailing whitespace, the same for every choice.
      const auto context_len =
          static_cast<int64_t>(tok.encode(context_and_continuation(q.question, "").first).size());
      for (size_t c = 0; c < q.choices.size(); ++c) {
        auto [context, continuation] = context_and_continuation(q.question, q.choices[c]);
        std::vector<int32_t> whole = tok.encode(context + continuation);
        const auto n = static_cast<int64_t>(whole.size());
        ASTRAI_CHECK(context_len >= 1, "line ", q.line, ": the question encodes to no tokens");
        ASTRAI_CHECK(n > context_len, "line ", q.line, ": choice ", c,
                     " adds no tokens to the question once tokenized together with it");
        ASTRAI_CHECK(n <= limit, "line ", q.line, ": question and choice ", c, " are ", n,
                     " tokens; the engine scores at most ", limit);
        seqs.push_back(std::move(whole));
        spans.push_back({{}, context_len});
      }
    }
    for (size_t i = 0; i < spans.size(); ++i) spans[i].ids = seqs[i];  // seqs no longer grows
    const std::vector<SpanScore> sums = score_spans(engine_, spans, progress);
    std::vector<std::vector<ChoiceScore>> out;
    size_t i = 0;
    for (const Question& q : questions) {
      out.emplace_back();
      for (size_t c = 0; c < q.choices.size(); ++c, ++i) out.back().push_back({sums[i].logprob, sums[i].tokens});
    }
    return out;
  }

 private:
  infer::Engine& engine_;
};

}  // namespace

std::unique_ptr<ChoiceScorer> make_engine_choice_scorer(infer::Engine& engine) {
  return std::make_unique<EngineChoiceScorer>(engine);
}

}  // namespace astrai::eval
