#include "infer/scheduler.h"

#include <algorithm>

#include "base/error.h"

namespace astrai::infer {
namespace {
bool before(const Sequence* a, const Sequence* b) {
  return a->order != b->order ? a->order < b->order : a->choice < b->choice;
}
bool wants_all_rows(const Sequence* s) {
  return s->req->request.prompt_logprobs && !s->prompt_logprobs_done;
}
}  // namespace

void Scheduler::add_waiting(Sequence* seq) {
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), seq, before), seq);
}

void Scheduler::add_running(Sequence* seq) {
  running_.insert(std::upper_bound(running_.begin(), running_.end(), seq, before), seq);
}

void Scheduler::remove(Sequence* seq) {
  drop_plan(seq);
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end()) waiting_.erase(it);
  release_pages(seq);
}

void Scheduler::release_pages(Sequence* seq) {
  pool_.release_all(&seq->pages);
  seq->num_computed = 0;
  seq->published = 0;
}

void Scheduler::preempt(Sequence* seq) {
  ++preemptions_;
  drop_plan(seq);
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  // Recompute from scratch later (the prefix cache usually still holds the published pages).
  release_pages(seq);
  add_waiting(seq);
}

void Scheduler::drop_plan(Sequence* seq) {
  for (size_t i = 0; i < step_.size(); ++i) {
    if (step_[i].seq == seq) {
      budget_ += step_[i].num_tokens;
      step_.erase(step_.begin() + i);
      return;
    }
  }
}

void Scheduler::plan(Sequence* seq, int32_t chunk) {
  StepItem item;
  item.seq = seq;
  item.num_tokens = chunk;
  item.sample = chunk == seq->pending_tokens();
  item.all_rows = wants_all_rows(seq);
  step_.push_back(item);
  budget_ -= chunk;
}

bool Scheduler::reserve(Sequence* seq, int32_t chunk) {
  const int32_t need = pages_for(seq->num_computed + chunk) - static_cast<int32_t>(seq->pages.size());
  while (!pool_.allocate(need, &seq->pages)) {
    Sequence* victim = running_.back();
    preempt(victim);
    if (victim == seq) return false;
  }
  return true;
}

const std::vector<StepItem>& Scheduler::schedule() {
  step_.clear();
  budget_ = options_.max_step_tokens;
  const int32_t ps = pool_.page_size();

  // 1. Decodes, oldest first. Preemption only ever removes the tail, so index i stays valid.
  for (size_t i = 0; i < running_.size() && budget_ > 0; ++i) {
    Sequence* s = running_[i];
    if (s->pending_tokens() != 1) continue;
    if (reserve(s, 1)) plan(s, 1);
  }
  // 2. Prefill chunks of running sequences.
  for (size_t i = 0; i < running_.size() && budget_ > 0; ++i) {
    Sequence* s = running_[i];
    if (s->pending_tokens() <= 1) continue;
    int32_t chunk = std::min(s->pending_tokens(), budget_);
    if (wants_all_rows(s)) chunk = std::min(chunk, options_.prompt_logprobs_chunk);
    // Shrink the chunk to the pages at hand before preempting anyone.
    const int32_t fit = (static_cast<int32_t>(s->pages.size()) + pool_.num_available()) * ps - s->num_computed;
    if (fit >= 1) chunk = std::min(chunk, fit);
    if (reserve(s, chunk)) plan(s, chunk);
  }
  // 3. Admission, in priority order; stops at the first sequence that does not fit. A
  //    sequence whose next page of prompt a running one is still computing waits for the
  //    prefix cache to publish it instead (at most max_running of them are looked at per step).
  int32_t deferred = 0;
  for (size_t w = 0;
       w < waiting_.size() && budget_ > 0 && static_cast<int32_t>(running_.size()) < options_.max_running;) {
    Sequence* s = waiting_[w];
    const bool all_rows = wants_all_rows(s);
    int32_t matched = 0;
    if (s->pages.empty() && !all_rows) {
      // The last token is always recomputed: its logits are what we sample from.
      const int32_t full_pages = (static_cast<int32_t>(s->tokens.size()) - 1) / ps;
      matched = pool_.match(s->tokens, full_pages, &s->pages, &s->link);
      s->published = matched;
      s->num_computed = matched * ps;
      if (matched < full_pages && page_in_flight(*s, matched)) {
        release_pages(s);
        if (++deferred >= options_.max_running) break;
        ++w;
        continue;
      }
    } else if (s->pages.empty()) {
      s->link = pool_.root();
    }
    int32_t chunk = std::min(s->pending_tokens(), budget_);
    if (all_rows) chunk = std::min(chunk, options_.prompt_logprobs_chunk);
    const int32_t fit = (static_cast<int32_t>(s->pages.size()) + pool_.num_available()) * ps - s->num_computed;
    chunk = std::min(chunk, fit);
    if (chunk < 1) {
      release_pages(s);
      break;
    }
    const bool ok = pool_.allocate(pages_for(s->num_computed + chunk) - static_cast<int32_t>(s->pages.size()), &s->pages);
    ASTRAI_CHECK(ok, "scheduler: page accounting error");
    if (!s->req->admitted_once) {
      s->req->admitted_once = true;
      s->req->pending.cached_prompt_tokens = matched * ps;
      s->req->pending.queue_seconds = s->req->clock.seconds();
      hit_tokens_ += static_cast<uint64_t>(matched) * ps;
    }
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(w));
    add_running(s);
    plan(s, chunk);
  }
  return step_;
}

bool Scheduler::page_in_flight(const Sequence& s, int32_t matched) const {
  if (!pool_.prefix_cache_enabled()) return false;
  const size_t end = size_t(matched + 1) * pool_.page_size();
  for (const Sequence* r : running_) {
    // r computes tokens [num_computed, tokens.size()) and publishes each page it fills.
    if (static_cast<size_t>(r->num_computed) >= end || r->tokens.size() < end) continue;
    const auto s_end = s.tokens.begin() + static_cast<std::ptrdiff_t>(end);
    if (std::equal(s.tokens.begin(), s_end, r->tokens.begin())) return true;
  }
  return false;
}

void Scheduler::commit_step() {
  const int32_t ps = pool_.page_size();
  for (const StepItem& item : step_) {
    Sequence* s = item.seq;
    s->num_computed += item.num_tokens;
    if (!pool_.prefix_cache_enabled()) continue;
    // Pages whose every slot now holds K/V from a completed forward become matchable.
    while (s->published < s->num_computed / ps) {
      const int32_t p = s->published;
      s->link = pool_.publish(s->link, std::span<const int32_t>(s->tokens).subspan(size_t(p) * ps, ps), s->pages[p]);
      ++s->published;
    }
  }
}

}  // namespace astrai::infer
