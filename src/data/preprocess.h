// Preprocessing: text / JSONL records -> tokenized, packed shards (see shard.h, packing.h).
//
// Record kinds (JSONL; each line one object, detected per record):
//   {"text": "..."}                                   plain text: loss on every token
//   {"messages": [{"role", "content"}, ...]}         chat: rendered with the tokenizer's chat
//                                                     template, loss only on assistant turns
//   {"prompt"|"instruction" (+ "input"), "response"|"output"}
//                                                     instruction pair: loss only on the response
//   {"prompt" or "messages", "chosen", "rejected"}   preference pair (for DPO)
//   {"prompt" or "messages" (+ "reward", "answer")}  prompt only (for GRPO rollouts)
// The first three make an "lm" dataset (keys sequence, loss_mask, position_ids; packed when
// seq_len > 0), preference pairs a "preference" dataset (chosen, chosen_mask, rejected,
// rejected_mask: one record per pair, unpacked), prompts a "prompt" dataset (prompt, and
// reward (F32) / answer (UTF-8 bytes) when present). Kinds of different datasets cannot be
// mixed in one run. --format text reads each file as plain text documents.
//
// Finding assistant spans (chat): prefix renders plus end-of-turn markers. For assistant
// message i,
//   P_i = render(messages[:i], add_generation_prompt=true)
//   Q_i = render(messages[:i+1], add_generation_prompt=false)
// The span starts at len(P_i) (the assistant header belongs to the generation prompt and is
// not trained) and ends right after the first end-of-turn marker in Q_i from there (the EOS
// token, or <|im_end|>, <|eot_id|>, <end_of_turn>, ... when in the vocabulary), else at the
// end of Q_i: the content and the end-of-turn token are trained, text a template appends
// after the turn is not. When every Q_i up to its span end is a prefix of the full render,
// the conversation is one document with those spans trained. Templates that rewrite
// history (e.g. Qwen3 drops earlier turns' reasoning) are not prefix-consistent: then each
// assistant turn becomes its own document Q_i[:end], exactly what the model sees at inference
// for that turn. A template where P_i is not a prefix of Q_i is an error naming the record.
// Text is tokenized span by span (add_special_tokens=false: templates write their own BOS),
// so span edges are token edges; stats.retokenized counts documents whose span-wise tokens
// differ from tokenizing the whole text at once.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/json.h"
#include "data/packing.h"

namespace astrai::data {

struct PreprocessOptions {
  std::string tokenizer;             // tokenizer directory (tokenizer.json ...)
  std::vector<std::string> inputs;   // files
  std::string output;                // dataset directory
  std::string format = "jsonl";      // "jsonl" | "text"
  // Text format: how a file splits into documents: "file" (whole file), "line" (each
  // non-empty line), "blank" (paragraphs separated by blank lines).
  std::string text_split = "file";
  int64_t seq_len = 0;               // > 0: pack rows of seq_len + 1 tokens
  Packing packing = Packing::kSimple;  // used when seq_len > 0
  bool add_eos = false;              // append EOS to each text / instruction document
  bool add_special_tokens = true;    // post-processor specials (BOS) for plain text
  bool chat_template = true;         // instruction pairs via the chat template when one exists
  bool overwrite = false;
  int64_t batch_records = 2048;      // records tokenized in parallel at a time
  int64_t pack_buffer_tokens = int64_t{1} << 24;  // BFD packs this many tokens at a time
  // Progress callback (records done, tokens written, bytes read, bytes total); may be empty.
  std::function<void(int64_t, int64_t, int64_t, int64_t)> progress;
};

// Runs the whole job and returns the meta.json written.
Json preprocess(const PreprocessOptions& options);

}  // namespace astrai::data
