// Multiple-choice log-likelihood tasks (the lm-evaluation-harness way): each choice is a
// continuation of the question, scored as the sum of log p(continuation tokens | question);
// the prediction is the choice with the highest sum (acc) or the highest sum per UTF-8 byte of
// the choice (acc_norm).
//
// Input: JSONL, one {"question": str, "choices": [str, ...], "answer": int} per line (blank
// lines skipped; other fields ignored).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/json.h"

namespace astrai::eval {

struct Question {
  int64_t line = 0;  // 1-based line in the file
  std::string question;
  std::vector<std::string> choices;
  int64_t answer = 0;
};

// Reads and validates the file; throws astrai::Error naming the file and line for bad JSON, a
// missing or mistyped field, an empty question, no choices, an empty choice or an answer out of range.
std::vector<Question> read_questions(const std::string& path);

// (context, continuation) of one choice, as lm-evaluation-harness forms them: trailing ASCII
// whitespace of the question moves to the front of the continuation ("Q: x\nA: " + "Paris" ->
// "Q: x\nA:" + " Paris"), so a leading space is tokenized with the word it precedes; no space
// is added. The continuation's tokens are then encode(context + continuation) past the first
// encode(context).size() tokens.
std::pair<std::string, std::string> context_and_continuation(const std::string& question, const std::string& choice);

struct ChoiceScore {
  double logprob = 0;  // sum over the continuation's tokens
  int64_t tokens = 0;
};

struct TaskResult {
  int64_t questions = 0;
  int64_t correct = 0;       // argmax of the sum is the answer
  int64_t correct_norm = 0;  // argmax of sum / UTF-8 bytes of the choice is the answer
  double seconds = 0;
  Json per_question;         // [{"line", "answer", "pred", "pred_norm", "logprobs": [...], "tokens": [...]}]

  double acc() const;
  double acc_norm() const;
  Json to_json() const;
};

// scores[q][c] for question q, choice c. Ties go to the lowest index (as numpy's argmax).
TaskResult summarize_tasks(const std::vector<Question>& questions, const std::vector<std::vector<ChoiceScore>>& scores);

}  // namespace astrai::eval
