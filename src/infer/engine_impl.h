// Engine internals shared by engine.cc and the model/tokenizer adapters.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "infer/backend.h"
#include "infer/engine.h"
#include "infer/kv_pool.h"
#include "infer/runner.h"
#include "infer/sampler.h"
#include "infer/scheduler.h"
#include "infer/sequence.h"

namespace astrai::infer {

class Engine::Impl {
 public:
  Impl(std::unique_ptr<ForwardBackend> backend, std::unique_ptr<TextCodec> codec, const EngineOptions& options,
       std::shared_ptr<const model::Transformer> model, std::shared_ptr<const tokenizer::Tokenizer> tokenizer);
  ~Impl();

  RequestHandle submit(GenerationRequest request, StreamCallback on_delta);
  void cancel(const RequestHandle& handle);
  EngineStats stats() const;
  bool accepting_requests() const;
  void invalidate(uint64_t version);
  void shutdown(double grace_seconds);
  std::vector<int32_t> render_prompt(const GenerationRequest& request) const;
  int32_t kv_capacity_tokens() const { return pool_.num_pages() * pool_.page_size(); }
  DType kv_dtype() const { return pool_.layout().dtype; }

  std::shared_ptr<const model::Transformer> model_;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<ForwardBackend> backend_;
  std::unique_ptr<TextCodec> codec_;
  EngineOptions options_;
  int32_t max_context_ = 0;

 private:
  struct Active {
    std::shared_ptr<RequestState> state;
    std::vector<std::unique_ptr<Sequence>> seqs;
  };

  void loop();
  void admit(std::shared_ptr<RequestState> state);
  void step();
  void handle_cancellations();
  void fork(Sequence* parent);
  // Samples the next token of `seq` from `logits` and streams the result.
  void sample(Sequence* seq, float* logits);
  // Streams a token sampled for `seq` (sample, or presample_rows).
  void apply_sample(Sequence* seq, const SampleOutput& out);
  // Samples the rows of this step's items whose choice samples alone (not about to fork): on
  // the device those marked in on_device_, the others over the host's threads; each row has its
  // own RNG and state, so the tokens do not depend on the threads. presampled_[i] tells which
  // items got one (in sampled_[i]).
  void presample_rows();
  // Whether item samples a token for its choice alone (not finished, not about to fork).
  bool samples_alone(const StepItem& item) const;
  // Whether item's row is sampled by the backend next to its logits (EngineOptions::sample_on):
  // a choice sampling alone, without logit bias, penalties or prompt logprobs.
  bool samples_on_device(const StepItem& item) const;
  // The rows of items_ marked in on_device_, sampled by the backend in one call into
  // sampled_ (presample_rows).
  void sample_on_device();
  // Ends the requests of this step's items with an error (a failed forward or device sampling).
  void fail_step(const std::exception& e, const char* what);
  std::string drain_text(Sequence* seq, FinishReason* finish);
  void prompt_logprobs(Sequence* seq, int32_t first_index, int32_t rows, const float* logits);
  void finish_sequence(Sequence* seq, FinishReason reason, ChoiceDelta* delta);
  void end_request(RequestState* req, FinishReason reason, const std::string& error);
  void complete(RequestState* req);
  void deliver(RequestState* req, const ChoiceDelta& delta);
  void publish_stats();
  Sequence* new_sequence(Active& active, int32_t choice);

  KvPool pool_;
  std::unique_ptr<KvStorage> kv_;  // the pages' memory, the backend's (pool_ hands out their ids)
  Scheduler scheduler_;
  Runner runner_;
  Sampler sampler_;
  std::vector<Sampler> thread_samplers_;  // presample_rows: one per thread (their scratch)
  std::vector<size_t> presample_items_;
  std::vector<uint8_t> presampled_;
  std::vector<SampleOutput> sampled_;
  std::vector<float> row_copy_;
  bool device_sampling_ = false;       // options_.sample_on resolved
  std::vector<uint8_t> on_device_;     // per item of items_: sampled by the backend
  std::vector<size_t> device_items_;   // sample_on_device: the items, the specs, the results
  std::vector<backend::SampleSpec> device_specs_;
  std::vector<backend::SampleResult> device_results_;
  std::vector<StepItem> items_;
  std::unordered_map<RequestState*, Active> active_;
  std::vector<RequestState*> completed_;
  uint64_t next_order_ = 1;

  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the engine thread
  std::condition_variable idle_cv_;  // signalled when the engine has no work
  std::deque<std::shared_ptr<RequestState>> inbox_;
  std::vector<uint64_t> invalidations_;
  bool stop_ = false;
  bool accepting_ = true;
  bool cancel_all_ = false;
  uint64_t next_id_ = 1;
  int32_t queued_ = 0;  // inbox + waiting, for the queue limit
  int32_t active_count_ = 0;

  mutable std::mutex stats_mu_;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace astrai::infer
