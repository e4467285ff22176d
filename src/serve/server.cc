#include "serve/server.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "base/log.h"
#include "serve/anthropic.h"
#include "serve/openai.h"

namespace astrai::serve {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const HttpHeaders kJson = {{"Content-Type", "application/json"}};

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

Protocol protocol_of(std::string_view path) {
  return starts_with(path, "/v1/messages") ? Protocol::kAnthropic : Protocol::kOpenAi;
}

// Endpoint label for metrics: known paths only, so a scanner cannot blow up the label set.
std::string endpoint_label(std::string_view path) {
  static const char* kKnown[] = {"/",           "/health",         "/health/live",         "/health/ready",
                                 "/stats",      "/metrics",        "/v1/models",           "/v1/completions",
                                 "/v1/chat/completions",           "/v1/messages", "/v1/messages/count_tokens"};
  for (const char* k : kKnown) {
    if (path == k) return k;
  }
  return "other";
}

bool equal_constant_time(std::string_view a, std::string_view b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

}  // namespace

// ---------------------------------------------------------------------------------------
// WorkerPool

WorkerPool::WorkerPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) {
    threads_.emplace_back([this] {
      while (true) {
        std::function<void()> task;
        {
          std::unique_lock lock(mu_);
          cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
          if (tasks_.empty()) return;
          task = std::move(tasks_.front());
          tasks_.pop_front();
        }
        try {
          task();
        } catch (const std::exception& e) {
          log_error("serve: worker task failed: ", e.what());
        }
      }
    });
  }
}

WorkerPool::~WorkerPool() { stop(); }

void WorkerPool::post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void WorkerPool::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

// ---------------------------------------------------------------------------------------
// Exchange: one generation request from submit to its last byte.

enum class Kind { kChat, kCompletion, kMessages };

class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Server* server = nullptr;
  std::shared_ptr<infer::Engine> engine;
  std::shared_ptr<HttpResponse> res;
  std::string endpoint;
  Protocol protocol = Protocol::kOpenAi;
  Kind kind = Kind::kChat;
  bool stream = false;
  int32_t prompt_tokens = 0;
  double received = 0;
  std::unique_ptr<openai::ChatWriter> chat;
  std::unique_ptr<openai::CompletionWriter> completion;
  std::unique_ptr<anthropic::MessagesWriter> messages;

  // Engine thread: queue and hand the formatting to a worker.
  void on_delta(const infer::ChoiceDelta& delta) {
    double now = now_seconds();
    std::lock_guard lock(mu_);
    if (!delta.token_ids.empty()) {
      if (first_token_ == 0) first_token_ = now;
      size_t i = static_cast<size_t>(std::max(0, delta.index));
      if (last_token_.size() <= i) last_token_.resize(i + 1, 0);
      if (last_token_[i] > 0) {
        double gap = (now - last_token_[i]) / static_cast<double>(delta.token_ids.size());
        for (size_t k = 0; k < delta.token_ids.size(); ++k) inter_token_.push_back(gap);
      }
      last_token_[i] = now;
    }
    pending_.push_back(delta);
    schedule_locked();
  }

  // After submit() returned: the stream head is written, deltas may go out.
  void started(infer::RequestHandle handle) {
    bool cancel_now;
    {
      std::lock_guard lock(mu_);
      handle_ = std::move(handle);
      started_ = true;
      cancel_now = gone_;
      if (!pending_.empty()) schedule_locked();
    }
    if (cancel_now) engine->cancel(*handle_);
  }

  // The client went away (loop thread): stop generating, pages go back.
  void client_gone() {
    std::optional<infer::RequestHandle> handle;
    {
      std::lock_guard lock(mu_);
      if (gone_ || finalized_) return;
      gone_ = true;
      handle = handle_;
    }
    server->metrics_.count_disconnect();
    if (handle) engine->cancel(*handle);
  }

  // Watchdog: the engine finished the request without (all) final deltas (an error).
  void check_done() {
    std::lock_guard lock(mu_);
    if (!handle_ || finalized_ || !handle_->done()) return;
    force_finalize_ = true;
    schedule_locked();
  }

 private:
  void schedule_locked() {
    if (!started_ || scheduled_ || finalized_) return;
    scheduled_ = true;
    server->workers_.post([self = shared_from_this()] { self->drain(); });
  }

  bool all_finished() const {
    switch (kind) {
      case Kind::kChat: return chat->all_finished();
      case Kind::kCompletion: return completion->all_finished();
      case Kind::kMessages: return messages->finished();
    }
    return false;
  }

  std::string push(const infer::ChoiceDelta& d) {
    switch (kind) {
      case Kind::kChat: return chat->push(d);
      case Kind::kCompletion: return completion->push(d);
      case Kind::kMessages: return messages->push(d);
    }
    return {};
  }

  // Worker; never runs twice at once for one exchange (scheduled_), so writers need no lock.
  void drain() {
    while (true) {
      std::deque<infer::ChoiceDelta> batch;
      bool finalize_now = false;
      {
        std::lock_guard lock(mu_);
        if (pending_.empty()) {
          scheduled_ = false;
          if ((all_finished() || force_finalize_) && !finalized_) {
            finalized_ = true;
            finalize_now = true;
          }
        } else {
          batch.swap(pending_);
        }
      }
      if (finalize_now) {
        finalize();
        return;
      }
      if (batch.empty()) return;
      std::string out;
      for (const auto& d : batch) out += push(d);
      if (stream && !out.empty() && !res->write(out)) client_gone();
    }
  }

  void finalize() {
    infer::GenerationResult result = handle_->wait();  // the engine is done: returns at once
    double now = now_seconds();
    Usage usage;
    usage.prompt_tokens = result.prompt_tokens > 0 ? result.prompt_tokens : prompt_tokens;
    usage.completion_tokens = result.completion_tokens;
    if (kind == Kind::kCompletion && completion->score_only()) usage.completion_tokens = 0;
    usage.cached_tokens = result.cached_prompt_tokens;
    std::vector<double> itl;
    double first;
    {
      std::lock_guard lock(mu_);
      itl.swap(inter_token_);
      first = first_token_;
      usage.timings = timings_locked(result.queue_seconds, itl.size());
    }
    bool cancelled = false;
    for (const auto& c : result.choices) cancelled |= c.finish == infer::FinishReason::kCancelled;
    std::string failure = result.error;
    if (failure.empty() && cancelled) failure = "the request was cancelled (server shutting down)";
    if (failure.empty() && !all_finished()) failure = "the engine ended the request without a result";
    int status = 200;
    bool client_left;
    {
      std::lock_guard lock(mu_);
      client_left = gone_;
    }
    if (client_left) {
      status = 499;  // nginx's "client closed request", for the metrics only
    } else if (!failure.empty()) {
      status = 500;
      if (stream) {
        res->write(kind == Kind::kChat         ? chat->error(failure)
                   : kind == Kind::kCompletion ? completion->error(failure)
                                               : messages->error(failure));
        res->end();
      } else {
        server->send_error(*res, endpoint, protocol, 500, failure);
      }
    } else if (stream) {
      res->write(kind == Kind::kChat         ? chat->finish(usage)
                 : kind == Kind::kCompletion ? completion->finish(usage)
                                             : messages->finish(usage));
      res->end();
    } else {
      Json body = kind == Kind::kChat         ? chat->response(usage)
                  : kind == Kind::kCompletion ? completion->response(result, usage)
                                              : messages->response(usage);
      server->send_json(*res, endpoint, 200, body);
      status = -1;  // counted by send_json
    }
    if (status != -1) server->metrics_.count_request(endpoint, status);
    Metrics& m = server->metrics_;
    m.count_tokens(usage.prompt_tokens, usage.completion_tokens);
    if (first > 0) m.ttft.observe(first - received);
    m.inter_token.observe_many(itl);
    m.e2e.observe(now - received);
    m.queue.observe(result.queue_seconds);
    server->forget(this);
  }

  // Queue time, time to the first token, and the decode span from the first token to the
  // last (of any choice), which produced the decode_tokens after each choice's first.
  Timings timings_locked(double queue_seconds, size_t decode_tokens) const {
    Timings t;
    t.queue_ms = queue_seconds * 1000.0;
    if (first_token_ > 0) {
      double last = *std::max_element(last_token_.begin(), last_token_.end());
      t.ttft_ms = (first_token_ - received) * 1000.0;
      t.decode_ms = (last - first_token_) * 1000.0;
      t.decode_tokens = static_cast<int32_t>(decode_tokens);
    }
    return t;
  }

  std::mutex mu_;
  std::deque<infer::ChoiceDelta> pending_;
  std::optional<infer::RequestHandle> handle_;
  bool started_ = false, scheduled_ = false, finalized_ = false, gone_ = false, force_finalize_ = false;
  double first_token_ = 0;
  std::vector<double> last_token_;
  std::vector<double> inter_token_;
};

// ---------------------------------------------------------------------------------------
// Server

Server::Server(ServerOptions options, TokenBytesFn token_bytes, ToolRecognizerFactory tools)
    : options_(std::move(options)),
      token_bytes_(std::move(token_bytes)),
      tools_(std::move(tools)),
      workers_(options_.threads),
      created_(unix_time()) {
  HttpServerOptions http;
  http.host = options_.host;
  http.port = options_.port;
  http.limits.max_body_bytes = options_.max_body_bytes;
  http_ = std::make_unique<HttpServer>(http, [this](HttpRequest&& req, std::shared_ptr<HttpResponse> res) {
    handle(std::move(req), std::move(res));
  });
}

Server::~Server() {
  watchdog_stop_ = true;
  if (watchdog_.joinable()) watchdog_.join();
  http_->stop();
  workers_.stop();
}

void Server::start() {
  http_->start();
  watchdog_ = std::thread([this] { watchdog(); });
}

void Server::set_engine(std::shared_ptr<infer::Engine> engine) {
  std::lock_guard lock(engine_mu_);
  engine_ = std::move(engine);
}

std::shared_ptr<infer::Engine> Server::engine() const {
  std::lock_guard lock(engine_mu_);
  return engine_;
}

void Server::watchdog() {
  while (!watchdog_stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::vector<std::shared_ptr<Exchange>> live;
    {
      std::lock_guard lock(live_mu_);
      live.assign(live_.begin(), live_.end());
    }
    for (auto& ex : live) ex->check_done();
  }
}

void Server::forget(Exchange* exchange) {
  std::lock_guard lock(live_mu_);
  for (auto it = live_.begin(); it != live_.end(); ++it) {
    if (it->get() == exchange) {
      live_.erase(it);
      break;
    }
  }
  live_cv_.notify_all();
}

void Server::shutdown(double grace_seconds) {
  if (shutting_down_.exchange(true)) return;
  http_->stop_accepting();
  if (auto engine = this->engine()) engine->shutdown(grace_seconds);
  {
    // Every request is finished or cancelled now; let the workers write their last bytes.
    std::unique_lock lock(live_mu_);
    live_cv_.wait_for(lock, std::chrono::seconds(10), [this] { return live_.empty(); });
  }
  workers_.stop();
  watchdog_stop_ = true;
  if (watchdog_.joinable()) watchdog_.join();
  // Give the loop a moment to flush what the workers wrote, then close everything.
  for (int i = 0; i < 50 && http_->open_connections() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  http_->stop();
}

HttpHeaders Server::cors_headers() const {
  return {{"Access-Control-Allow-Origin", options_.cors_origin},
          {"Access-Control-Expose-Headers", "Retry-After, Content-Type"}};
}

void Server::send_json(HttpResponse& response, const std::string& endpoint, int status, const Json& body,
                       HttpHeaders extra) {
  HttpHeaders headers = cors_headers();
  headers.emplace_back("Content-Type", "application/json");
  for (auto& h : extra) headers.push_back(std::move(h));
  response.send(status, headers, dump_json(body));
  metrics_.count_request(endpoint, status);
}

void Server::send_error(HttpResponse& response, const std::string& endpoint, Protocol protocol, int status,
                        const std::string& message, const std::string& param, HttpHeaders extra) {
  send_json(response, endpoint, status, error_json(protocol, status, message, param), std::move(extra));
}

bool Server::authorized(const HttpRequest& request) const {
  if (options_.api_keys.empty()) return true;
  std::string key;
  if (const std::string* auth = request.header("authorization")) {
    if (auth->size() > 7 && iequals(std::string_view(*auth).substr(0, 7), "Bearer ")) key = auth->substr(7);
  }
  if (key.empty()) {
    if (const std::string* x = request.header("x-api-key")) key = *x;
  }
  if (key.empty()) return false;
  bool ok = false;
  for (const auto& k : options_.api_keys) ok |= equal_constant_time(key, k);
  return ok;
}

void Server::handle(HttpRequest&& request, std::shared_ptr<HttpResponse> response) {
  const double received = now_seconds();
  const std::string endpoint = endpoint_label(request.path);
  const Protocol protocol = protocol_of(request.path);
  if (request.error_status) {
    send_error(*response, endpoint, protocol, request.error_status, request.error_message);
    return;
  }
  if (request.method == "OPTIONS") {  // CORS preflight: no credentials are sent with it
    HttpHeaders h = cors_headers();
    h.emplace_back("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    const std::string* asked = request.header("access-control-request-headers");
    h.emplace_back("Access-Control-Allow-Headers",
                   asked ? *asked : "Authorization, Content-Type, x-api-key, anthropic-version");
    h.emplace_back("Access-Control-Max-Age", "86400");
    response->send(204, h, "");
    metrics_.count_request(endpoint, 204);
    return;
  }
  const std::string& path = request.path;
  auto engine = this->engine();
  const bool is_get = request.method == "GET" || request.method == "HEAD";
  if (path == "/health" || path == "/health/ready" || path == "/health/live") {
    if (!is_get) return send_error(*response, endpoint, protocol, 405, "use GET");
    // Live: the process answers (an orchestrator restarts it otherwise), also while loading
    // and draining.
    if (path == "/health/live") return send_json(*response, endpoint, 200, {{"status", "live"}});
    if (shutting_down_) return send_json(*response, endpoint, 503, {{"status", "shutting_down"}});
    if (!engine) return send_json(*response, endpoint, 503, {{"status", "loading"}});
    if (path == "/health") return send_json(*response, endpoint, 200, {{"status", "ok"}});
    // Ready: a new request would be taken now (a load balancer sends it elsewhere otherwise).
    if (!engine->accepting_requests()) return send_json(*response, endpoint, 503, {{"status", "queue_full"}});
    return send_json(*response, endpoint, 200, {{"status", "ready"}});
  }
  if (path == "/" || path == "/index.html") {
    if (!is_get) return send_error(*response, endpoint, protocol, 405, "use GET");
    HttpHeaders h = cors_headers();
    h.emplace_back("Content-Type", "text/html; charset=utf-8");
    h.emplace_back("Cache-Control", "no-cache");
    response->send(200, h, web_page());
    metrics_.count_request(endpoint, 200);
    return;
  }
  if (!authorized(request)) {
    return send_error(*response, endpoint, protocol, 401, "invalid or missing API key (Authorization: Bearer or x-api-key)");
  }
  struct Route {
    const char* path;
    bool post;
  };
  static const Route kRoutes[] = {{"/stats", false},           {"/metrics", false},
                                  {"/v1/models", false},       {"/v1/chat/completions", true},
                                  {"/v1/completions", true},   {"/v1/messages", true},
                                  {"/v1/messages/count_tokens", true}};
  const Route* route = nullptr;
  for (const auto& r : kRoutes) {
    if (path == r.path) route = &r;
  }
  if (!route && starts_with(path, "/v1/models/") && is_get) {
    std::string id = path.substr(11);
    if (id != options_.model_name) {
      return send_error(*response, endpoint, protocol, 404, str_cat("The model '", id, "' does not exist"), "model");
    }
    return send_json(*response, endpoint, 200, openai::model_json(id, created_, engine ? engine->max_context() : 0));
  }
  if (!route) return send_error(*response, endpoint, protocol, 404, str_cat("no route for ", request.method, " ", path));
  if (route->post != (request.method == "POST") || (!route->post && !is_get)) {
    return send_error(*response, endpoint, protocol, 405, str_cat("use ", route->post ? "POST" : "GET", " for ", path));
  }
  if (path == "/v1/models") {
    return send_json(*response, endpoint, 200,
                     openai::models_response(options_.model_name, created_, engine ? engine->max_context() : 0));
  }
  if (path == "/metrics") {
    std::optional<infer::EngineStats> stats;
    if (engine) stats = engine->stats();
    HttpHeaders h = cors_headers();
    h.emplace_back("Content-Type", "text/plain; version=0.0.4");
    response->send(200, h, metrics_.render(stats ? &*stats : nullptr, http_->open_connections()));
    metrics_.count_request(endpoint, 200);
    return;
  }
  if (shutting_down_) {
    return send_error(*response, endpoint, protocol, 503, "the server is shutting down", {}, {{"Retry-After", "5"}});
  }
  if (!engine) return send_error(*response, endpoint, protocol, 503, "the model is still loading", {}, {{"Retry-After", "5"}});
  if (path == "/stats") {
    infer::EngineStats s = engine->stats();
    return send_json(*response, endpoint, 200,
                     {{"running", s.running},
                      {"waiting", s.waiting},
                      {"requests_total", s.requests_total},
                      {"tokens_generated", s.tokens_generated},
                      {"prompt_tokens_total", s.prompt_tokens_total},
                      {"kv_pages_total", s.kv_pages_total},
                      {"kv_pages_used", s.kv_pages_used},
                      {"kv_pages_free", s.kv_pages_free},
                      {"kv_pages_cached", s.kv_pages_cached},
                      {"prefix_cache_hit_rate", s.prefix_cache_hit_rate},
                      {"prefix_cache_hit_tokens", s.prefix_cache_hit_tokens},
                      {"steps", s.steps},
                      {"preemptions", s.preemptions},
                      {"open_connections", http_->open_connections()},
                      {"model", options_.model_name}});
  }
  // Generation and token counting parse JSON and tokenize: off the loop thread.
  const bool count_tokens = path == "/v1/messages/count_tokens";
  auto shared_request = std::make_shared<HttpRequest>(std::move(request));  // `path` is gone now
  if (count_tokens) {
    workers_.post([this, shared_request, response] { handle_count_tokens(std::move(*shared_request), response); });
    return;
  }
  workers_.post([this, endpoint, shared_request, response, received] {
    handle_generation(endpoint, std::move(*shared_request), response, received);
  });
}

namespace {
Json parse_body(const HttpRequest& request) {
  Json body = Json::parse(request.body, nullptr, false);
  if (body.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return body;
}
}  // namespace

void Server::handle_count_tokens(HttpRequest request, std::shared_ptr<HttpResponse> response) {
  const std::string endpoint = "/v1/messages/count_tokens";
  auto engine = this->engine();
  try {
    Json body = parse_body(request);
    anthropic::MessagesRequest r = anthropic::parse_messages_request(body, options_.model_name, true);
    size_t n = engine->render_prompt(r.gen).size();
    send_json(*response, endpoint, 200, {{"input_tokens", n}});
  } catch (const ApiError& e) {
    send_error(*response, endpoint, Protocol::kAnthropic, e.status, e.what(), e.param);
  } catch (const std::exception& e) {
    send_error(*response, endpoint, Protocol::kAnthropic, 400, e.what());
  }
}

void Server::handle_generation(const std::string& endpoint, HttpRequest request,
                               std::shared_ptr<HttpResponse> response, double received) {
  const Protocol protocol = protocol_of(request.path);
  auto engine = this->engine();
  auto ex = std::make_shared<Exchange>();
  ex->server = this;
  ex->engine = engine;
  ex->res = response;
  ex->endpoint = endpoint;
  ex->protocol = protocol;
  ex->received = received;
  const std::string id_base = random_id("", 24);
  infer::GenerationRequest gen;
  try {
    Json body = parse_body(request);
    if (request.path == "/v1/chat/completions") {
      openai::ChatRequest r = openai::parse_chat_request(body, options_.model_name);
      ex->kind = Kind::kChat;
      ex->stream = r.stream;
      ex->chat = std::make_unique<openai::ChatWriter>("chatcmpl-" + id_base, options_.model_name, unix_time(), r, tools_,
                                                      token_bytes_);
      gen = std::move(r.gen);
    } else if (request.path == "/v1/completions") {
      openai::CompletionRequest r = openai::parse_completion_request(body, options_.model_name);
      ex->kind = Kind::kCompletion;
      ex->stream = r.stream;
      ex->completion = std::make_unique<openai::CompletionWriter>("cmpl-" + id_base, options_.model_name, unix_time(), r,
                                                                  token_bytes_);
      gen = std::move(r.gen);
    } else {
      anthropic::MessagesRequest r = anthropic::parse_messages_request(body, options_.model_name);
      ex->kind = Kind::kMessages;
      ex->stream = r.stream;
      ex->messages = std::make_unique<anthropic::MessagesWriter>("msg_" + id_base, options_.model_name, r, tools_);
      gen = std::move(r.gen);
    }
    // Render and tokenize here, once: the exact prompt count is known before the first byte
    // (Anthropic's message_start carries it) and the engine gets ids.
    if (gen.prompt_ids.empty()) {
      gen.prompt_ids = engine->render_prompt(gen);
      gen.messages = Json();
      gen.tools = Json();
      gen.prompt_text.clear();
    }
    if (gen.prompt_ids.empty()) throw ApiError(400, "the prompt is empty after templating");
    ex->prompt_tokens = static_cast<int32_t>(gen.prompt_ids.size());
  } catch (const ApiError& e) {
    return send_error(*response, endpoint, protocol, e.status, e.what(), e.param);
  } catch (const std::exception& e) {
    return send_error(*response, endpoint, protocol, 400, e.what());
  }

  std::vector<int32_t> prompt_ids = gen.prompt_ids;
  {
    std::lock_guard lock(live_mu_);
    live_.insert(ex);
  }
  infer::RequestHandle handle{nullptr};
  try {
    // The callback holds the exchange weakly: the engine may keep it in the request's state,
    // which the exchange itself holds (live_ keeps the exchange alive until it is answered).
    std::weak_ptr<Exchange> weak = ex;
    handle = engine->submit(std::move(gen), [weak](const infer::ChoiceDelta& d) {
      if (auto e = weak.lock()) e->on_delta(d);
    });
  } catch (const infer::QueueFullError& e) {
    forget(ex.get());
    return send_error(*response, endpoint, protocol, 429, str_cat("the server is busy: ", e.what()), {},
                      {{"Retry-After", "1"}});
  } catch (const std::exception& e) {
    forget(ex.get());
    int status = shutting_down_ ? 503 : 400;
    return send_error(*response, endpoint, protocol, status, e.what());
  }
  if (ex->stream) {
    HttpHeaders h = cors_headers();
    h.emplace_back("Content-Type", "text/event-stream");
    h.emplace_back("Cache-Control", "no-cache");
    h.emplace_back("X-Accel-Buffering", "no");
    response->begin_stream(200, h);
    std::string head = ex->kind == Kind::kChat         ? ex->chat->start()
                       : ex->kind == Kind::kCompletion ? ex->completion->start(prompt_ids)
                                                       : ex->messages->start(ex->prompt_tokens);
    response->write(head);
  }
  ex->started(handle);
  std::weak_ptr<Exchange> weak = ex;
  response->on_close([weak] {
    if (auto e = weak.lock()) e->client_gone();
  });
}

}  // namespace astrai::serve
