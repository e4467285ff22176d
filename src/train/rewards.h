// Rewards for GRPO rollouts, chosen with --reward:
//   exact-match      1 when the completion's final answer equals the prompt record's
//                    "answer", else 0. The final answer is the completion's last
//                    whitespace-separated word with surrounding punctuation (.,;:!?"'`())
//                    removed; the answer is trimmed of white space; numbers also compare
//                    numerically ("4" == "4.0").
//   regex:PATTERN    1 when ECMAScript PATTERN matches somewhere in the completion, else 0
//                    (format rewards).
//   command:PROGRAM  PROGRAM (run by /bin/sh -c) gets {"prompt", "completion", "answer"} as
//                    one JSON object on stdin and prints the reward, a finite number, on
//                    stdout; a non-zero exit, other output or --reward-timeout is an error
//                    that stops training (the last checkpoint stays).
#pragma once

#include <memory>
#include <string>

namespace astrai::train {

struct RewardInput {
  std::string prompt;      // the prompt as text
  std::string completion;  // the generated text (special tokens such as EOS not included)
  std::string answer;      // the record's "answer" ("" when it has none)
};

class RewardFunction {
 public:
  virtual ~RewardFunction() = default;
  virtual double score(const RewardInput& input) const = 0;
  // Whether the function reads RewardInput::answer (the dataset must then hold answers).
  virtual bool needs_answer() const { return false; }
};

// Parses a --reward specification; unknown kinds and invalid patterns are errors.
std::unique_ptr<RewardFunction> make_reward(const std::string& spec, double timeout_seconds);

// exact-match's final answer of a completion (exposed for tests).
std::string final_answer(const std::string& completion);

}  // namespace astrai::train
