#include "infer/engine.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "base/error.h"
#include "base/log.h"
#include "base/parallel.h"
#include "infer/engine_impl.h"

namespace astrai::infer {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop:
    case FinishReason::kStopString: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "none";
}

uint64_t RequestHandle::id() const { return state_->id; }

bool RequestHandle::done() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->finished;
}

GenerationResult RequestHandle::wait() const {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->finished; });
  return state_->result;
}

namespace {
DType resolve_kv_dtype(const std::string& name, DType weights) {
  if (name == "f32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  ASTRAI_CHECK(name == "auto", "kv_dtype must be auto, f32 or bf16, got '", name, "'");
  return weights == DType::kBF16 ? DType::kBF16 : DType::kF32;
}

KvLayout layout_of(const ModelInfo& info, const EngineOptions& o) {
  KvLayout l;
  l.dtype = resolve_kv_dtype(o.kv_dtype, info.weight_dtype);
  l.num_layers = info.num_layers;
  l.num_kv_heads = info.num_kv_heads;
  l.k_head_dim = info.k_head_dim;
  l.v_head_dim = info.v_head_dim;
  l.page_size = o.page_size;
  return l;
}

SchedulerOptions scheduler_options(const EngineOptions& o) {
  ASTRAI_CHECK(o.max_running >= 1, "max_running must be >= 1, got ", o.max_running);
  ASTRAI_CHECK(o.max_step_tokens >= 1, "max_step_tokens must be >= 1, got ", o.max_step_tokens);
  ASTRAI_CHECK(o.max_queue >= 1, "max_queue must be >= 1, got ", o.max_queue);
  SchedulerOptions s;
  s.max_running = o.max_running;
  s.max_step_tokens = o.max_step_tokens;
  return s;
}

uint64_t mix_seed(uint64_t seed, int32_t choice) {
  SplitMix64 r(seed ^ (0x632be59bd9b4e019ull * (static_cast<uint64_t>(choice) + 1)));
  return r.next();
}
}  // namespace

Engine::Impl::Impl(std::unique_ptr<ForwardBackend> backend, std::unique_ptr<TextCodec> codec,
                   const EngineOptions& options, std::shared_ptr<const model::Transformer> model,
                   std::shared_ptr<const tokenizer::Tokenizer> tokenizer)
    : model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      backend_(std::move(backend)),
      codec_(std::move(codec)),
      options_(options),
      pool_(layout_of(backend_->info(), options), options.kv_cache_bytes),
      kv_(backend_->make_kv_storage(pool_.layout(), pool_.num_pages())),
      scheduler_(pool_, scheduler_options(options)),
      runner_(*backend_) {
  const ModelInfo& info = backend_->info();
  ASTRAI_CHECK(info.vocab_size > 0, "engine: model has no vocabulary");
  max_context_ = options.max_context > 0 ? options.max_context : info.max_context;
  if (info.max_context > 0) max_context_ = std::min(max_context_, info.max_context);
  ASTRAI_CHECK(max_context_ >= 2, "engine: context length ", max_context_, " is too small");
  ASTRAI_CHECK(options.sample_on == "auto" || options.sample_on == "host" ||
                   options.sample_on == "device",
               "sample_on must be auto, host or device, got '", options.sample_on, "'");
  ASTRAI_CHECK(options.sample_on != "device" || backend_->can_sample(),
               "sample_on device: this model does not sample on its device");
  // "auto" is the host for now: sampling on a GPU stays opt-in until scripts/gpu-check.sh has
  // passed on one (then auto becomes "device" for a model not on the CPU, where it saves the
  // logits' copy; on the CPU the host's sampler, over the threads, is the faster).
  device_sampling_ = options.sample_on == "device";
  pool_.set_prefix_cache(options.prefix_cache);
  if (options.prefault_kv) kv_->prefault();
  stats_.kv_pages_total = pool_.num_pages();
  stats_.kv_pages_free = pool_.num_available();
  // The engine thread runs every forward: it takes the constructing thread's thread count,
  // and that thread's idle OpenMP workers are let go so the engine's pool is the only one
  // (see release_idle_threads: 18.4 -> 13.4 ms per batch-1 decode step in `bench decode`).
  const int threads = num_threads();
  release_idle_threads();
  thread_ = std::thread([this, threads] {
    set_num_threads(threads);
    loop();
  });
}

Engine::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    accepting_ = false;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<int32_t> Engine::Impl::render_prompt(const GenerationRequest& r) const {
  if (!r.prompt_ids.empty()) return r.prompt_ids;
  if (!r.messages.is_null()) {
    ASTRAI_CHECK(codec_, "chat messages need a tokenizer with a chat template");
    ASTRAI_CHECK(r.messages.is_array(), "messages must be an array");
    return codec_->encode_chat(r);
  }
  ASTRAI_CHECK(codec_, "a text prompt needs a tokenizer");
  return codec_->encode(r.prompt_text);
}

RequestHandle Engine::Impl::submit(GenerationRequest request, StreamCallback on_delta) {
  const ModelInfo& info = backend_->info();
  std::vector<int32_t> ids = render_prompt(request);
  ASTRAI_CHECK(!ids.empty(), "the prompt is empty");
  for (int32_t t : ids)
    ASTRAI_CHECK(t >= 0 && t < info.vocab_size, "prompt token id ", t, " is outside the vocabulary of ",
                 info.vocab_size);
  validate_sampling(request.sampling, info.vocab_size);
  ASTRAI_CHECK(codec_ || request.sampling.stop_strings.empty(), "stop strings need a tokenizer");
  const int32_t capacity = pool_.num_pages() * pool_.page_size();
  const int32_t limit = std::min(max_context_, capacity);
  if (static_cast<int32_t>(ids.size()) >= limit) {
    ASTRAI_CHECK(request.truncate_left, "the prompt has ", ids.size(), " tokens but the ",
                 limit == max_context_ ? "context" : "KV cache", " holds ", limit,
                 " (at least one token must be generated); shorten it or ask for left truncation");
    ids.erase(ids.begin(), ids.end() - (limit - 1));  // keep the newest tokens
  }
  auto state = std::make_shared<RequestState>();
  state->on_delta = std::move(on_delta);
  state->max_len = static_cast<int32_t>(
      std::min<int64_t>(int64_t(ids.size()) + request.sampling.max_tokens, limit));
  std::vector<int32_t> stops = request.sampling.stop_token_ids;
  if (!request.sampling.ignore_eos) {
    stops.insert(stops.end(), info.eos_ids.begin(), info.eos_ids.end());
    if (codec_) {
      auto more = codec_->stop_ids();
      stops.insert(stops.end(), more.begin(), more.end());
    }
  }
  std::sort(stops.begin(), stops.end());
  stops.erase(std::unique(stops.begin(), stops.end()), stops.end());
  state->stop_ids = std::move(stops);
  request.prompt_ids = std::move(ids);
  state->request = std::move(request);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_) throw Error("the engine is shutting down");
    if (queued_ >= options_.max_queue)
      throw QueueFullError(str_cat("the request queue is full (", options_.max_queue, " waiting)"));
    state->id = next_id_++;
    ++queued_;
    inbox_.push_back(state);
  }
  cv_.notify_all();
  return RequestHandle(state);
}

void Engine::Impl::cancel(const RequestHandle& handle) {
  handle.state()->cancel_requested.store(true);
  cv_.notify_all();
}

bool Engine::Impl::accepting_requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return accepting_ && queued_ < options_.max_queue;
}

EngineStats Engine::Impl::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void Engine::Impl::invalidate(uint64_t version) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    invalidations_.push_back(version);
  }
  cv_.notify_all();
}

void Engine::Impl::shutdown(double grace_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  accepting_ = false;
  cv_.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_seconds);
  auto idle = [&] { return queued_ == 0 && active_count_ == 0; };
  if (!idle_cv_.wait_until(lock, deadline, idle)) {
    cancel_all_ = true;
    cv_.notify_all();
    idle_cv_.wait(lock, idle);
  }
}

Sequence* Engine::Impl::new_sequence(Active& active, int32_t choice) {
  auto seq = std::make_unique<Sequence>();
  RequestState* req = active.state.get();
  const SamplingParams& p = req->request.sampling;
  seq->req = req;
  seq->choice = choice;
  seq->tokens = req->request.prompt_ids;
  seq->prompt_len = static_cast<int32_t>(seq->tokens.size());
  uint64_t seed;
  if (p.seed) {
    seed = mix_seed(*p.seed, choice);
  } else {
    static thread_local std::mt19937_64 entropy{std::random_device{}()};
    seed = entropy();
  }
  seq->sampler.init(p, seq->tokens, backend_->info().vocab_size, seed);
  if (codec_) {
    seq->decoder = codec_->decoder();
    seq->text = std::make_unique<TextStream>(p.stop_strings);
  }
  seq->result.index = choice;
  active.seqs.push_back(std::move(seq));
  return active.seqs.back().get();
}

void Engine::Impl::admit(std::shared_ptr<RequestState> state) {
  RequestState* req = state.get();
  Active& active = active_[req];
  active.state = std::move(state);
  req->live_sequences = req->request.sampling.n;
  req->pending.choices.resize(req->request.sampling.n);
  for (int32_t i = 0; i < req->request.sampling.n; ++i) req->pending.choices[i].index = i;
  if (req->request.prompt_logprobs) {
    const auto& ids = req->request.prompt_ids;
    req->pending.prompt_logprobs.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) req->pending.prompt_logprobs[i].id = ids[i];
  }
  Sequence* seq = new_sequence(active, 0);
  seq->order = next_order_++;
  seq->prompt_logprobs_done = !req->request.prompt_logprobs;
  scheduler_.add_waiting(seq);
}

void Engine::Impl::deliver(RequestState* req, const ChoiceDelta& delta) {
  if (!req->on_delta) return;
  try {
    req->on_delta(delta);
  } catch (const std::exception& e) {
    log_warn("stream callback of request ", req->id, " threw: ", e.what());
  }
}

void Engine::Impl::finish_sequence(Sequence* seq, FinishReason reason, ChoiceDelta* delta) {
  scheduler_.remove(seq);  // pages return at once
  seq->finished = true;
  seq->result.finish = reason;
  if (delta) {
    delta->finish = reason;
    delta->matched_stop = seq->result.matched_stop;
  }
  RequestState* req = seq->req;
  req->pending.choices[seq->choice] = seq->result;
  if (--req->live_sequences == 0) completed_.push_back(req);
}

void Engine::Impl::end_request(RequestState* req, FinishReason reason, const std::string& error) {
  Active& active = active_.at(req);
  if (!error.empty() && req->pending.error.empty()) req->pending.error = error;
  // Choices not forked yet end with the request.
  const int32_t n = req->request.sampling.n;
  if (!req->forked && n > 1) {
    for (int32_t i = 1; i < n; ++i) req->pending.choices[i].finish = reason;
    req->live_sequences -= n - 1;
    req->forked = true;
  }
  for (auto& seq : active.seqs) {
    if (seq->finished) continue;
    ChoiceDelta delta;
    delta.index = seq->choice;
    finish_sequence(seq.get(), reason, &delta);
    deliver(req, delta);
  }
}

void Engine::Impl::complete(RequestState* req) {
  auto it = active_.find(req);
  if (it == active_.end()) return;
  GenerationResult& r = req->pending;
  r.prompt_ids = req->request.prompt_ids;
  r.prompt_tokens = static_cast<int32_t>(r.prompt_ids.size());
  r.completion_tokens = 0;
  for (const auto& c : r.choices) r.completion_tokens += static_cast<int32_t>(c.token_ids.size());
  r.total_seconds = req->clock.seconds();
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.prompt_tokens_total += r.prompt_tokens;
    stats_.prefix_cache_hit_tokens += r.cached_prompt_tokens;
  }
  std::shared_ptr<RequestState> keep = it->second.state;
  active_.erase(it);  // sequences are gone; their pages were returned when they finished
  {
    std::lock_guard<std::mutex> lock(keep->mu);
    keep->result = std::move(r);
    keep->finished = true;
  }
  keep->cv.notify_all();
}

void Engine::Impl::handle_cancellations() {
  std::vector<RequestState*> cancelled;
  for (auto& [req, active] : active_)
    if (cancel_all_ || req->cancel_requested.load()) cancelled.push_back(req);
  for (RequestState* req : cancelled) end_request(req, FinishReason::kCancelled, "");
}

void Engine::Impl::fork(Sequence* parent) {
  RequestState* req = parent->req;
  req->forked = true;
  Active& active = active_.at(req);
  const int32_t ps = pool_.page_size();
  for (int32_t c = 1; c < req->request.sampling.n; ++c) {
    Sequence* child = new_sequence(active, c);
    child->order = parent->order;
    child->tokens = parent->tokens;
    child->prompt_logprobs_done = true;
    // Full pages are shared by reference; the partial last page is copied, since each choice
    // writes its own tokens into it. Without a free page the child recomputes later.
    const int32_t full = parent->num_computed / ps;
    const bool partial = parent->num_computed % ps != 0;
    std::vector<int32_t> extra;
    if (!partial || pool_.allocate(1, &extra)) {
      for (int32_t p = 0; p < full; ++p) {
        pool_.retain(parent->pages[p]);
        child->pages.push_back(parent->pages[p]);
      }
      if (partial) {
        kv_->copy_page(parent->pages[full], extra[0]);
        child->pages.push_back(extra[0]);
      }
      child->num_computed = parent->num_computed;
      child->link = parent->link;
      child->published = parent->published;
      scheduler_.add_running(child);
    } else {
      scheduler_.add_waiting(child);
    }
  }
}

void Engine::Impl::prompt_logprobs(Sequence* seq, int32_t first_index, int32_t rows, const float* logits) {
  RequestState* req = seq->req;
  const int32_t vocab = runner_.vocab();
  const int32_t top = std::max(0, req->request.sampling.logprobs);
  std::vector<int32_t> scratch;
  for (int32_t j = 0; j < rows; ++j) {
    const int32_t next = first_index + j + 1;  // the row at index i predicts token i + 1
    if (next >= seq->prompt_len) break;
    req->pending.prompt_logprobs[next] =
        Sampler::logprob_of(logits + size_t(j) * vocab, vocab, seq->tokens[next], top, &scratch);
  }
  if (seq->num_computed >= seq->prompt_len) seq->prompt_logprobs_done = true;
}

std::string Engine::Impl::drain_text(Sequence* seq, FinishReason* finish) {
  // What the detokenizer still holds can complete a stop string too.
  bool stopped = false;
  std::string out = seq->text->push(seq->decoder->flush(), &stopped);
  if (stopped) {
    *finish = FinishReason::kStopString;
    seq->result.matched_stop = seq->text->matched();
    return out;
  }
  return out + seq->text->flush();
}

void Engine::Impl::presample_rows() {
  presampled_.assign(items_.size(), 0);
  sampled_.resize(items_.size());
  presample_items_.clear();
  for (size_t i = 0; i < items_.size(); ++i) {
    if (samples_alone(items_[i]) && !on_device_[i]) presample_items_.push_back(i);
  }
  sample_on_device();
  if (presample_items_.empty()) return;
  thread_samplers_.resize(static_cast<size_t>(std::max(1, num_threads())));
  const int32_t vocab = runner_.vocab();
  parallel_for(0, static_cast<int64_t>(presample_items_.size()), [&](int64_t j) {
    const size_t i = presample_items_[static_cast<size_t>(j)];
    Sequence* seq = items_[i].seq;
    // The item's last row (all-row items: prompt logprobs read only the rows before it).
    float* row = const_cast<float*>(runner_.logits(i)) +
                 (items_[i].all_rows ? size_t(items_[i].num_tokens - 1) * vocab : 0);
    Sampler& sampler = thread_samplers_[static_cast<size_t>(omp_get_thread_num()) % thread_samplers_.size()];
    sampled_[i] = sampler.sample(row, vocab, seq->req->request.sampling, seq->sampler);
    presampled_[i] = 1;
  });
}

bool Engine::Impl::samples_alone(const StepItem& item) const {
  const Sequence* seq = item.seq;
  return item.sample && !seq->finished && (seq->req->request.sampling.n == 1 || seq->req->forked);
}

bool Engine::Impl::samples_on_device(const StepItem& item) const {
  const SamplingParams& p = item.seq->req->request.sampling;
  return device_sampling_ && samples_alone(item) && !item.all_rows && p.logit_bias.empty() &&
         p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f;
}

void Engine::Impl::sample_on_device() {
  device_items_.clear();
  device_specs_.clear();
  for (size_t i = 0; i < items_.size(); ++i) {
    Sequence* seq = items_[i].seq;
    if (!on_device_[i] || seq->finished) continue;
    const SamplingParams& p = seq->req->request.sampling;
    backend::SampleSpec s;
    s.row = runner_.row(i);
    s.temperature = p.temperature;
    s.top_k = p.top_k;
    s.top_p = p.top_p;
    s.min_p = p.min_p;
    s.top_logprobs = p.logprobs;
    // The host sampler takes one draw per token when it draws (temperature > 0): the same one.
    s.uniform = p.temperature > 0.0f ? seq->sampler.rng.uniform() : 0.0;
    device_items_.push_back(i);
    device_specs_.push_back(s);
  }
  if (device_items_.empty()) return;
  device_results_.resize(device_items_.size());
  runner_.sample(device_specs_.data(), static_cast<int64_t>(device_specs_.size()), device_results_.data());
  for (size_t j = 0; j < device_items_.size(); ++j) {
    const size_t i = device_items_[j];
    const backend::SampleResult& r = device_results_[j];
    Sequence* seq = items_[i].seq;
    const SamplingParams& p = seq->req->request.sampling;
    SampleOutput& out = sampled_[i];
    out.token = r.token;
    out.logprob = TokenLogprob{};
    if (p.logprobs >= 0) {
      out.logprob.id = r.token;
      out.logprob.logprob = r.logprob;
      for (int32_t k = 0; k < r.num_top; ++k) out.logprob.top.emplace_back(r.top_ids[k], r.top_logprobs[k]);
    }
    seq->sampler.observe(r.token, p);
    presampled_[i] = 1;
  }
}

void Engine::Impl::fail_step(const std::exception& e, const char* what) {
  log_error(what, " failed: ", e.what());
  for (const auto& item : items_) {
    RequestState* req = item.seq->req;
    if (active_.count(req) && !(req->live_sequences == 0)) end_request(req, FinishReason::kError, e.what());
  }
  for (RequestState* req : completed_) complete(req);
  completed_.clear();
}

void Engine::Impl::sample(Sequence* seq, float* logits) {
  apply_sample(seq, sampler_.sample(logits, runner_.vocab(), seq->req->request.sampling, seq->sampler));
}

void Engine::Impl::apply_sample(Sequence* seq, const SampleOutput& out) {
  RequestState* req = seq->req;
  const SamplingParams& p = req->request.sampling;
  seq->tokens.push_back(out.token);
  seq->result.token_ids.push_back(out.token);
  if (p.logprobs >= 0) seq->result.logprobs.push_back(out.logprob);
  if (!req->first_token_seen) {
    req->first_token_seen = true;
    req->pending.first_token_seconds = req->clock.seconds();
  }
  ChoiceDelta delta;
  delta.index = seq->choice;
  delta.token_ids.push_back(out.token);
  if (p.logprobs >= 0) delta.logprobs.push_back(out.logprob);

  FinishReason finish = FinishReason::kNone;
  if (std::binary_search(req->stop_ids.begin(), req->stop_ids.end(), out.token)) {
    finish = FinishReason::kStop;
    if (seq->text) delta.text = drain_text(seq, &finish);
  } else if (seq->text) {
    bool stopped = false;
    delta.text = seq->text->push(seq->decoder->push(out.token), &stopped);
    if (stopped) {
      finish = FinishReason::kStopString;
      seq->result.matched_stop = seq->text->matched();
    }
  }
  if (finish == FinishReason::kNone && static_cast<int32_t>(seq->tokens.size()) >= req->max_len) {
    finish = FinishReason::kLength;
    if (seq->text) delta.text += drain_text(seq, &finish);
  }
  seq->result.text += delta.text;
  if (finish != FinishReason::kNone) finish_sequence(seq, finish, &delta);
  deliver(req, delta);
}

void Engine::Impl::step() {
  Timer timer;
  const std::vector<StepItem>& planned = scheduler_.schedule();
  if (planned.empty()) return;
  items_.assign(planned.begin(), planned.end());
  int32_t tokens = 0;
  for (const auto& item : items_) tokens += item.num_tokens;
  const double t_schedule = timer.seconds();
  on_device_.assign(items_.size(), 0);
  for (size_t i = 0; i < items_.size(); ++i) on_device_[i] = samples_on_device(items_[i]);
  try {
    runner_.run(items_, *kv_, on_device_);
  } catch (const std::exception& e) {
    // The step's K/V may be half written: fail its requests and drop their pages.
    fail_step(e, "forward pass");
    return;
  }
  const double t_forward = timer.seconds();
  {
    // The forward's time is counted before sampling, so a snapshot taken while this step
    // samples (a delta callback) covers the same forwards as the wall time up to it.
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.schedule_seconds += t_schedule;
    stats_.forward_seconds += t_forward - t_schedule;
    stats_.forward_profile = backend_->profile();
  }
  scheduler_.commit_step();
  try {
    presample_rows();
  } catch (const std::exception& e) {
    // Sampling on the device failed (its memory, a bad row): no token for this step's requests.
    fail_step(e, "sampling");
    return;
  }
  uint64_t sampled = 0;  // tokens generated this step, for stats
  for (size_t i = 0; i < items_.size(); ++i) {
    Sequence* seq = items_[i].seq;
    if (seq->finished) continue;
    const float* rows = runner_.logits(i);
    if (items_[i].all_rows) {
      prompt_logprobs(seq, seq->num_computed - items_[i].num_tokens, items_[i].num_tokens, rows);
      rows += size_t(items_[i].num_tokens - 1) * runner_.vocab();
    }
    if (!items_[i].sample) continue;
    if (presampled_[i]) {
      apply_sample(seq, sampled_[i]);
      ++sampled;
      continue;
    }
    float* row = const_cast<float*>(rows);
    if (seq->req->request.sampling.n > 1 && !seq->req->forked) {
      fork(seq);
      // Every choice samples from the same row; each needs its own copy (sampling edits it).
      row_copy_.assign(row, row + runner_.vocab());
      Active& active = active_.at(seq->req);
      for (size_t c = 1; c < active.seqs.size(); ++c) {
        std::vector<float> copy(row_copy_);
        if (!active.seqs[c]->finished) {
          sample(active.seqs[c].get(), copy.data());
          ++sampled;
        }
      }
    }
    sample(seq, row);
    ++sampled;
  }
  for (RequestState* req : completed_) complete(req);
  completed_.clear();
  const double t_total = timer.seconds();
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.steps++;
  stats_.step_tokens_total += tokens;
  stats_.tokens_generated += sampled;
  stats_.sample_seconds += t_total - t_forward;
}

void Engine::Impl::publish_stats() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.running = static_cast<int32_t>(scheduler_.running().size());
  stats_.waiting = static_cast<int32_t>(scheduler_.waiting().size());
  stats_.kv_pages_total = pool_.num_pages();
  stats_.kv_pages_used = pool_.num_referenced();
  stats_.kv_pages_free = pool_.num_available();
  stats_.kv_pages_cached = pool_.num_cached();
  stats_.preemptions = scheduler_.preemptions();
  stats_.prefix_cache_hit_rate =
      stats_.prompt_tokens_total ? double(stats_.prefix_cache_hit_tokens) / double(stats_.prompt_tokens_total) : 0.0;
}

void Engine::Impl::loop() {
  std::vector<std::shared_ptr<RequestState>> fresh;
  std::vector<uint64_t> invalidations;
  for (;;) {
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (active_.empty() && inbox_.empty()) idle_cv_.notify_all();
      cv_.wait(lock, [&] {
        return stop_ || !inbox_.empty() || !active_.empty() || !invalidations_.empty() || cancel_all_;
      });
      stopping = stop_;
      fresh.assign(inbox_.begin(), inbox_.end());
      inbox_.clear();
      invalidations.swap(invalidations_);
      if (stopping) cancel_all_ = true;
    }
    for (auto& state : fresh) {
      admit(std::move(state));
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.requests_total++;
    }
    fresh.clear();
    for (uint64_t v : invalidations) pool_.invalidate(v);
    invalidations.clear();
    handle_cancellations();
    for (RequestState* req : completed_) complete(req);
    completed_.clear();
    if (!active_.empty()) step();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queued_ = static_cast<int32_t>(scheduler_.waiting().size()) + static_cast<int32_t>(inbox_.size());
      active_count_ = static_cast<int32_t>(active_.size());
      if (active_.empty()) {
        cancel_all_ = stop_ ? cancel_all_ : false;
        idle_cv_.notify_all();
      }
    }
    publish_stats();
    if (stopping && active_.empty()) break;
  }
}

// ---- Engine facade ----

Engine::Engine(std::unique_ptr<ForwardBackend> backend, std::unique_ptr<TextCodec> codec, EngineOptions options)
    : impl_(std::make_unique<Impl>(std::move(backend), std::move(codec), options, nullptr, nullptr)) {}

Engine::~Engine() = default;

RequestHandle Engine::submit(GenerationRequest request, StreamCallback on_delta) {
  return impl_->submit(std::move(request), std::move(on_delta));
}
void Engine::cancel(const RequestHandle& handle) { impl_->cancel(handle); }
EngineStats Engine::stats() const { return impl_->stats(); }

bool Engine::accepting_requests() const { return impl_->accepting_requests(); }
void Engine::invalidate_prefix_cache(uint64_t v) { impl_->invalidate(v); }
void Engine::shutdown(double grace_seconds) { impl_->shutdown(grace_seconds); }
std::vector<int32_t> Engine::render_prompt(const GenerationRequest& r) const { return impl_->render_prompt(r); }
int32_t Engine::max_context() const { return impl_->max_context_; }
int32_t Engine::kv_capacity_tokens() const { return impl_->kv_capacity_tokens(); }
DType Engine::kv_dtype() const { return impl_->kv_dtype(); }

const tokenizer::Tokenizer& Engine::tokenizer() const {
  ASTRAI_CHECK(impl_->tokenizer_, "this engine was built without a tokenizer");
  return *impl_->tokenizer_;
}
const model::Transformer& Engine::model() const {
  ASTRAI_CHECK(impl_->model_, "this engine was built without a model::Transformer");
  return *impl_->model_;
}

}  // namespace astrai::infer
