// Server metrics in Prometheus text format (exposition format 0.0.4): request counters by
// endpoint and status, token counters, and latency histograms (time to first token,
// inter-token latency, end-to-end latency, queue time), plus the engine's gauges.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "infer/engine.h"

namespace astrai::serve {

class Histogram {
 public:
  Histogram(std::string name, std::string help, std::vector<double> bounds);
  void observe(double value);
  void observe_many(const std::vector<double>& values);
  void render(std::string* out) const;
  uint64_t count() const;

 private:
  std::string name_, help_;
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void count_request(const std::string& endpoint, int status);
  void count_tokens(int64_t prompt, int64_t completion);
  void count_disconnect();
  Histogram ttft, inter_token, e2e, queue;
  // Everything, with the engine's current state as gauges.
  std::string render(const infer::EngineStats* engine, size_t open_connections) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, completion_tokens_ = 0, disconnects_ = 0;
};

}  // namespace astrai::serve
