// The training dashboard behind `astrai dashboard RUN_DIR...` and `astrai train --dashboard`:
// an HTTP server (serve::HttpServer) with the page (web/dashboard.html) and a JSON API over
// the runs' metrics.jsonl files, which one reader thread tails (MetricsTail) every
// poll interval. Training never waits on it: the trainer only appends to its file.
//
//   GET /                 the page
//   GET /api/panels       the panel catalog (panels.h)
//   GET /api/runs         [{id, name, dir, exists, generation, records}]
//   GET /api/metrics?run=I&from=N&generation=G
//                         {run, name, exists, generation, from, records: [...]}: the records of
//                         run I from index N on; when G is not the run's generation (the file
//                         was replaced, e.g. a new run in that directory) from is 0 and the
//                         client replaces what it holds.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dashboard/metrics_tail.h"

namespace astrai::serve {
class HttpServer;
class HttpResponse;
struct HttpRequest;
}  // namespace astrai::serve

namespace astrai::dashboard {

struct DashboardOptions {
  std::string host = "127.0.0.1";
  int port = 8050;            // 0 = any free port (see port())
  double poll_seconds = 0.5;  // how often the reader thread looks at the files
};

class DashboardServer {
 public:
  // run_dirs: training output directories (their metrics.jsonl need not exist yet).
  DashboardServer(const std::vector<std::string>& run_dirs, DashboardOptions options);
  ~DashboardServer();
  DashboardServer(const DashboardServer&) = delete;
  DashboardServer& operator=(const DashboardServer&) = delete;

  // Reads the files once, listens (throws astrai::Error when the address is taken) and starts
  // the threads, with SIGINT and SIGTERM blocked on them: those stay with the caller's thread.
  void start();
  void stop();  // idempotent; joins the threads
  int port() const;
  std::string url() const;  // http://HOST:PORT/

 private:
  struct Run {
    std::string dir, name;
    MetricsTail tail;
  };
  void reader_loop();
  void poll_all();
  void handle(serve::HttpRequest&& request, std::shared_ptr<serve::HttpResponse> response);
  std::string runs_json();
  std::string metrics_json(size_t run, size_t from, uint64_t generation);

  DashboardOptions options_;
  std::vector<std::unique_ptr<Run>> runs_;
  std::mutex mutex_;  // guards runs_[i]->tail and stopping_
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread reader_;
  std::unique_ptr<serve::HttpServer> http_;
};

// The page, embedded in the binary (dashboard_page.cc).
std::string_view dashboard_page();

}  // namespace astrai::dashboard
