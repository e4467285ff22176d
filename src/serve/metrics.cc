#include "serve/metrics.h"

#include <algorithm>
#include <cstdio>

namespace astrai::serve {

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void counter(std::string* out, const char* name, const char* help, double value) {
  *out += str_cat("# HELP ", name, " ", help, "\n# TYPE ", name, " counter\n", name, " ", num(value), "\n");
}

void gauge(std::string* out, const char* name, const char* help, double value) {
  *out += str_cat("# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n", name, " ", num(value), "\n");
}

// Latency buckets from 1 ms to 60 s.
std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 30, 60};
}

}  // namespace

Histogram::Histogram(std::string name, std::string help, std::vector<double> bounds)
    : name_(std::move(name)), help_(std::move(help)), bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  std::lock_guard lock(mu_);
  counts_[i]++;
  sum_ += value;
  count_++;
}

void Histogram::observe_many(const std::vector<double>& values) {
  std::lock_guard lock(mu_);
  for (double value : values) {
    size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
    counts_[i]++;
    sum_ += value;
    count_++;
  }
}

uint64_t Histogram::count() const {
  std::lock_guard lock(mu_);
  return count_;
}

void Histogram::render(std::string* out) const {
  std::lock_guard lock(mu_);
  *out += str_cat("# HELP ", name_, " ", help_, "\n# TYPE ", name_, " histogram\n");
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    *out += str_cat(name_, "_bucket{le=\"", num(bounds_[i]), "\"} ", cumulative, "\n");
  }
  cumulative += counts_.back();
  *out += str_cat(name_, "_bucket{le=\"+Inf\"} ", cumulative, "\n");
  *out += str_cat(name_, "_sum ", num(sum_), "\n", name_, "_count ", count_, "\n");
}

Metrics::Metrics()
    : ttft("astrai_time_to_first_token_seconds", "Time from request arrival to its first generated token.",
           latency_buckets()),
      inter_token("astrai_inter_token_latency_seconds", "Time between consecutive tokens of one choice.",
                  latency_buckets()),
      e2e("astrai_e2e_request_latency_seconds", "Time from request arrival to its last byte.", latency_buckets()),
      queue("astrai_request_queue_time_seconds", "Time a request waited in the engine queue before it ran.",
            latency_buckets()) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  requests_[{endpoint, status}]++;
}

void Metrics::count_tokens(int64_t prompt, int64_t completion) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += static_cast<uint64_t>(prompt);
  completion_tokens_ += static_cast<uint64_t>(completion);
}

void Metrics::count_disconnect() {
  std::lock_guard lock(mu_);
  disconnects_++;
}

std::string Metrics::render(const infer::EngineStats* engine, size_t open_connections) const {
  std::string out;
  {
    std::lock_guard lock(mu_);
    out += "# HELP astrai_http_requests_total HTTP requests answered, by endpoint and status.\n"
           "# TYPE astrai_http_requests_total counter\n";
    for (const auto& [key, value] : requests_) {
      out += str_cat("astrai_http_requests_total{endpoint=\"", key.first, "\",status=\"", key.second, "\"} ", value, "\n");
    }
    counter(&out, "astrai_prompt_tokens_total", "Prompt tokens of finished requests (after templating).",
            static_cast<double>(prompt_tokens_));
    counter(&out, "astrai_generation_tokens_total", "Tokens generated for finished requests.",
            static_cast<double>(completion_tokens_));
    counter(&out, "astrai_client_disconnects_total", "Requests cancelled because the client went away.",
            static_cast<double>(disconnects_));
  }
  gauge(&out, "astrai_http_open_connections", "Open HTTP connections.", static_cast<double>(open_connections));
  if (engine) {
    gauge(&out, "astrai_requests_running", "Requests in the running batch.", engine->running);
    gauge(&out, "astrai_requests_waiting", "Requests queued in the engine.", engine->waiting);
    counter(&out, "astrai_engine_requests_total", "Requests the engine accepted.", static_cast<double>(engine->requests_total));
    counter(&out, "astrai_engine_tokens_generated_total", "Tokens the engine generated.",
            static_cast<double>(engine->tokens_generated));
    counter(&out, "astrai_engine_steps_total", "Engine steps (forward passes).", static_cast<double>(engine->steps));
    counter(&out, "astrai_engine_preemptions_total", "Requests preempted for lack of KV pages.",
            static_cast<double>(engine->preemptions));
    gauge(&out, "astrai_kv_pages_total", "KV cache pages.", engine->kv_pages_total);
    gauge(&out, "astrai_kv_pages_used", "KV cache pages referenced by requests.", engine->kv_pages_used);
    gauge(&out, "astrai_kv_pages_free", "KV cache pages free or evictable.", engine->kv_pages_free);
    gauge(&out, "astrai_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / prompt tokens.",
          engine->prefix_cache_hit_rate);
  }
  ttft.render(&out);
  inter_token.render(&out);
  e2e.render(&out);
  queue.render(&out);
  return out;
}

}  // namespace astrai::serve
