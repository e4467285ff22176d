// The API server: routes HTTP requests to the protocol adapters and the engine, streams
// engine deltas back, and answers health, stats, metrics and the web page.
//
// Threads (all bounded): one HTTP loop thread (sockets, routing of cheap requests), `threads`
// workers (JSON parsing, templating + tokenising, formatting deltas into SSE bytes), the
// engine's own thread (its callbacks only queue deltas), and one watchdog. A client that goes
// away is seen by the loop thread (EPOLLRDHUP), which cancels its request in the engine.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "infer/engine.h"
#include "serve/api_error.h"
#include "serve/choice_stream.h"
#include "serve/http_server.h"
#include "serve/metrics.h"
#include "serve/protocol_util.h"

namespace astrai::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0 = any free port
  std::vector<std::string> api_keys;  // empty = no authentication
  std::string model_name = "astrai";
  int threads = 4;
  size_t max_body_bytes = 8 << 20;
  std::string cors_origin = "*";
};

// A fixed set of threads running posted tasks in order of posting.
class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  void post(std::function<void()> task);
  void stop();  // runs what is queued, then joins

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

class Exchange;

class Server {
 public:
  // token_bytes: text of one token (logprobs, echo). tools: makes a tool-call recogniser for
  // the served model's format (null: tool calls stay text).
  Server(ServerOptions options, TokenBytesFn token_bytes, ToolRecognizerFactory tools);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void start();  // listens; /health answers 503 until set_engine()
  int port() const { return http_->port(); }
  void set_engine(std::shared_ptr<infer::Engine> engine);
  // Stops taking requests (503), lets running ones finish or cancels them after
  // grace_seconds, ends every open stream properly, then closes the listener and sockets.
  void shutdown(double grace_seconds);

  const Metrics& metrics() const { return metrics_; }

 private:
  friend class Exchange;
  void handle(HttpRequest&& request, std::shared_ptr<HttpResponse> response);
  void handle_generation(const std::string& endpoint, HttpRequest request, std::shared_ptr<HttpResponse> response,
                         double received);
  void handle_count_tokens(HttpRequest request, std::shared_ptr<HttpResponse> response);
  void send_json(HttpResponse& response, const std::string& endpoint, int status, const Json& body,
                 HttpHeaders extra = {});
  void send_error(HttpResponse& response, const std::string& endpoint, Protocol protocol, int status,
                  const std::string& message, const std::string& param = {}, HttpHeaders extra = {});
  HttpHeaders cors_headers() const;
  bool authorized(const HttpRequest& request) const;
  std::shared_ptr<infer::Engine> engine() const;
  void watchdog();
  void forget(Exchange* exchange);

  ServerOptions options_;
  TokenBytesFn token_bytes_;
  ToolRecognizerFactory tools_;
  std::unique_ptr<HttpServer> http_;
  WorkerPool workers_;
  Metrics metrics_;
  mutable std::mutex engine_mu_;
  std::shared_ptr<infer::Engine> engine_;
  std::atomic<bool> shutting_down_{false};
  int64_t created_ = 0;

  std::mutex live_mu_;
  std::condition_variable live_cv_;
  std::unordered_set<std::shared_ptr<Exchange>> live_;  // generation requests not yet answered
  std::atomic<bool> watchdog_stop_{false};
  std::thread watchdog_;
};

// The embedded chat page (src/serve/web/index.html).
std::string_view web_page();

}  // namespace astrai::serve
