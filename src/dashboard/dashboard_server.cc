#include "dashboard/dashboard_server.h"

#include <pthread.h>
#include <signal.h>

#include <charconv>
#include <chrono>
#include <filesystem>

#include "base/error.h"
#include "dashboard/panels.h"
#include "serve/http_server.h"

namespace astrai::dashboard {

namespace fs = std::filesystem;
using serve::HttpHeaders;

namespace {

// Blocks SIGINT and SIGTERM on this thread while alive, so threads started meanwhile inherit
// the mask and the signals reach the thread that handles them (the trainer, or sigwait).
class SignalsBlocked {
 public:
  SignalsBlocked() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~SignalsBlocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

 private:
  sigset_t old_;
};

// The value of `name` in a query string "a=1&b=2", or nullptr-like empty optional.
bool query_value(std::string_view query, std::string_view name, std::string_view* value) {
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    const size_t eq = pair.find('=');
    if (pair.substr(0, eq) == name) {
      *value = eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
      return true;
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return false;
}

// A non-negative integer query parameter; `fallback` when absent, false when malformed.
bool query_number(std::string_view query, std::string_view name, uint64_t fallback, uint64_t* out) {
  std::string_view text;
  if (!query_value(query, name, &text)) {
    *out = fallback;
    return true;
  }
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

void send(serve::HttpResponse& response, int status, const char* type, std::string_view body) {
  const HttpHeaders headers = {{"Content-Type", type}, {"Cache-Control", "no-cache"}};
  response.send(status, headers, body);
}

void send_error(serve::HttpResponse& response, int status, const std::string& message) {
  send(response, status, "application/json", Json{{"error", message}}.dump());
}

}  // namespace

DashboardServer::DashboardServer(const std::vector<std::string>& run_dirs, DashboardOptions options)
    : options_(std::move(options)) {
  ASTRAI_CHECK(!run_dirs.empty(), "the dashboard needs at least one run directory");
  ASTRAI_CHECK(options_.poll_seconds > 0, "the dashboard's poll interval must be positive");
  const std::vector<std::string> names = run_names(run_dirs);
  for (size_t i = 0; i < run_dirs.size(); ++i) {
    const std::string file = (fs::path(run_dirs[i]) / "metrics.jsonl").string();
    runs_.push_back(std::make_unique<Run>(Run{run_dirs[i], names[i], MetricsTail(file)}));
  }
}

DashboardServer::~DashboardServer() { stop(); }

void DashboardServer::start() {
  poll_all();
  serve::HttpServerOptions o;
  o.host = options_.host;
  o.port = options_.port;
  o.max_connections = 256;
  SignalsBlocked blocked;
  http_ = std::make_unique<serve::HttpServer>(
      o, [this](serve::HttpRequest&& req, std::shared_ptr<serve::HttpResponse> res) { handle(std::move(req), std::move(res)); });
  try {
    http_->start();
  } catch (const Error& e) {
    http_.reset();
    fail("dashboard: ", e.what(), " (choose another --port, or 0 for any free one)");
  }
  reader_ = std::thread([this] { reader_loop(); });
}

void DashboardServer::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (reader_.joinable()) reader_.join();
  if (http_) http_->stop();
}

int DashboardServer::port() const { return http_ ? http_->port() : 0; }

std::string DashboardServer::url() const {
  const std::string host = options_.host.find(':') != std::string::npos ? "[" + options_.host + "]" : options_.host;
  return str_cat("http://", host, ":", port(), "/");
}

void DashboardServer::poll_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& run : runs_) run->tail.poll();
}

void DashboardServer::reader_loop() {
  const auto interval = std::chrono::duration<double>(options_.poll_seconds);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, interval, [this] { return stopping_; })) {
    for (auto& run : runs_) run->tail.poll();
  }
}

std::string DashboardServer::runs_json() {
  Json out = Json::array();
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < runs_.size(); ++i) {
    const Run& r = *runs_[i];
    out.push_back({{"id", i}, {"name", r.name}, {"dir", r.dir}, {"exists", r.tail.exists()},
                   {"generation", r.tail.generation()}, {"records", r.tail.lines().size()}});
  }
  return Json{{"runs", out}}.dump();
}

std::string DashboardServer::metrics_json(size_t run, size_t from, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Run& r = *runs_[run];
  const std::vector<std::string>& lines = r.tail.lines();
  if (generation != r.tail.generation() || from > lines.size()) from = 0;
  // The records are the file's own lines (each a JSON object checked when read).
  std::string body = Json{{"run", run}, {"name", r.name}, {"exists", r.tail.exists()},
                          {"generation", r.tail.generation()}, {"from", from}}.dump();
  body.pop_back();  // the closing brace
  body += ",\"records\":[";
  for (size_t i = from; i < lines.size(); ++i) {
    if (i > from) body += ',';
    body += lines[i];
  }
  return body + "]}";
}

void DashboardServer::handle(serve::HttpRequest&& request, std::shared_ptr<serve::HttpResponse> response) {
  if (request.error_status) return send_error(*response, request.error_status, request.error_message);
  if (request.method != "GET" && request.method != "HEAD") return send_error(*response, 405, "use GET");
  const std::string& path = request.path;
  if (path == "/" || path == "/index.html") return send(*response, 200, "text/html; charset=utf-8", dashboard_page());
  if (path == "/api/panels") return send(*response, 200, "application/json", panel_catalog_json().dump());
  if (path == "/api/runs") return send(*response, 200, "application/json", runs_json());
  if (path == "/api/metrics") {
    uint64_t run = 0, from = 0, generation = 0;
    std::string_view unused;
    if (!query_value(request.query, "run", &unused) || !query_number(request.query, "run", 0, &run) ||
        !query_number(request.query, "from", 0, &from) || !query_number(request.query, "generation", 0, &generation))
      return send_error(*response, 400, "expected /api/metrics?run=I[&from=N][&generation=G] with non-negative integers");
    if (run >= runs_.size())
      return send_error(*response, 404, str_cat("no run ", run, " (there are ", runs_.size(), ")"));
    return send(*response, 200, "application/json", metrics_json(run, from, generation));
  }
  send_error(*response, 404, "no such page: " + path);
}

}  // namespace astrai::dashboard
