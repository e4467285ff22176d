// A small asynchronous HTTP/1.1 server: one epoll thread owns every socket; handlers answer
// through a thread-safe HttpResponse from any thread (worker pool, engine callbacks).
//
// Why our own loop (docs/server.md): the server must notice a client that goes away while its
// request waits or streams (EPOLLRDHUP on every connection, also while a response is in
// flight), hold hundreds of open streams with a fixed number of threads, bound each
// connection's memory, and speak keep-alive + chunked SSE. That is ~500 lines on epoll;
// a blocking library (cpp-httplib) cannot see disconnects, and Boost.Beast would bring
// heavy templates into every rebuild on a 2-core machine for the same result.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "serve/http.h"

namespace astrai::serve {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0 = any free port (see HttpServer::port())
  HttpLimits limits;
  int max_connections = 4096;            // beyond it new connections are closed at once
  size_t max_output_bytes = 32 << 20;    // per connection; a reader this slow is disconnected
  double idle_timeout_seconds = 120;     // keep-alive connections with no request in flight
};

class Connection;

// One request's answer. Either send() once, or begin_stream(), write()..., end(). Every
// method is thread-safe and never blocks on the network: bytes the socket does not take at
// once are queued and flushed by the loop thread.
class HttpResponse {
 public:
  explicit HttpResponse(std::shared_ptr<Connection> conn, bool keep_alive);
  ~HttpResponse();
  HttpResponse(const HttpResponse&) = delete;
  HttpResponse& operator=(const HttpResponse&) = delete;

  void send(int status, const HttpHeaders& headers, std::string_view body);
  void begin_stream(int status, const HttpHeaders& headers);
  bool write(std::string_view data);  // one chunk; false once the client is gone
  void end();
  bool finished() const { return finished_; }
  // The client went away before the response ended. `callback` runs once, on the loop
  // thread, or at once on the calling thread if it is already gone.
  void on_close(std::function<void()> callback);
  bool client_gone() const;

 private:
  std::shared_ptr<Connection> conn_;
  bool keep_alive_;
  std::atomic<bool> finished_{false};
  bool streaming_ = false;
};

using HttpHandler = std::function<void(HttpRequest&& request, std::shared_ptr<HttpResponse> response)>;

class HttpServer {
 public:
  // The handler runs on the loop thread: answer cheap requests inline, hand anything slow to
  // another thread with the response pointer.
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void start();  // binds and listens (throws astrai::Error), then runs the loop thread
  int port() const { return port_; }
  void stop_accepting();  // closes the listening socket; open connections continue
  void stop();            // closes everything and joins the loop thread
  size_t open_connections() const { return open_connections_.load(); }

 private:
  friend class Connection;
  friend class HttpResponse;
  void loop();
  void wake();
  void accept_all();
  void on_readable(const std::shared_ptr<Connection>& conn);
  void process_input(const std::shared_ptr<Connection>& conn);
  void close_connection(const std::shared_ptr<Connection>& conn);
  void sweep(double now);
  void request_attention(const std::shared_ptr<Connection>& conn);  // any thread

  HttpServerOptions options_;
  HttpHandler handler_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stop_accepting_{false};
  std::atomic<size_t> open_connections_{0};
  std::unordered_map<int, std::shared_ptr<Connection>> connections_;  // loop thread only
  std::mutex attention_mutex_;
  std::vector<std::shared_ptr<Connection>> attention_;  // finished responses, output to flush
};

}  // namespace astrai::serve
