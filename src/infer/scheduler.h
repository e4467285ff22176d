// Decides each step's work under a token budget and a cap on running sequences:
//   1. every running sequence with one pending token decodes it;
//   2. running sequences still in prefill get their next chunk;
//   3. waiting sequences are admitted in priority order (prefix-cache pages matched first);
//      one whose next page of prompt a running sequence is still computing (the same tokens
//      from position 0) waits until the prefix cache has it, so a prefix shared by requests
//      that arrive together is computed once.
// When a running sequence needs a page and none is available, the newest running sequence is
// preempted: its pages go back (published ones to the prefix cache) and it waits to be
// recomputed. The oldest sequence always progresses, so there is no deadlock as long as one
// sequence fits in the pool (checked at submit).
//
// Engine thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "infer/kv_pool.h"
#include "infer/sequence.h"

namespace astrai::infer {

struct StepItem {
  Sequence* seq = nullptr;
  int32_t num_tokens = 0;  // tokens[seq->num_computed, + num_tokens) are computed this step
  bool sample = false;     // the chunk reaches the last token: its logits are sampled
  bool all_rows = false;   // every row's logits are wanted (prompt logprobs)
};

struct SchedulerOptions {
  int32_t max_running = 64;
  int32_t max_step_tokens = 2048;
  int32_t prompt_logprobs_chunk = 64;  // bounds the logits buffer for all-row requests
};

class Scheduler {
 public:
  Scheduler(KvPool& pool, const SchedulerOptions& options) : pool_(pool), options_(options) {}

  // New or preempted sequences wait in priority order.
  void add_waiting(Sequence* seq);
  // A sequence that already holds pages (a forked choice) joins the running set directly.
  void add_running(Sequence* seq);
  // Builds the step; empty when there is nothing to do.
  const std::vector<StepItem>& schedule();
  // After the forward: advances num_computed and publishes newly full pages.
  void commit_step();
  // Removes a sequence (finished, cancelled or failed) and returns its pages at once.
  void remove(Sequence* seq);

  const std::vector<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  bool idle() const { return running_.empty() && waiting_.empty(); }
  uint64_t preemptions() const { return preemptions_; }
  uint64_t cache_hit_tokens() const { return hit_tokens_; }
  int32_t max_step_rows() const { return options_.max_running + options_.prompt_logprobs_chunk; }

 private:
  void preempt(Sequence* seq);
  // Returns seq's pages (matched, computed or reserved) and resets its progress to 0.
  void release_pages(Sequence* seq);
  // Pages to cover `tokens` KV entries.
  int32_t pages_for(int32_t tokens) const { return (tokens + pool_.page_size() - 1) / pool_.page_size(); }
  // Grows seq's pages for `chunk` more tokens, preempting newer running sequences if needed;
  // false if seq itself had to be preempted.
  bool reserve(Sequence* seq, int32_t chunk);
  void plan(Sequence* seq, int32_t chunk);
  void drop_plan(Sequence* seq);
  // True when a running sequence has yet to compute page `matched` of s's tokens with the same
  // tokens [0, (matched + 1) * page_size) as s (it publishes the page once computed).
  bool page_in_flight(const Sequence& s, int32_t matched) const;

  KvPool& pool_;
  SchedulerOptions options_;
  std::vector<Sequence*> running_;  // ascending priority key (oldest first)
  std::deque<Sequence*> waiting_;   // ascending priority key
  std::vector<StepItem> step_;
  int32_t budget_ = 0;
  uint64_t preemptions_ = 0;
  uint64_t hit_tokens_ = 0;
};

}  // namespace astrai::infer
