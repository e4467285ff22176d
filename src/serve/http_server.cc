#include "serve/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "base/error.h"
#include "base/log.h"

namespace astrai::serve {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr uint32_t kBaseEvents = EPOLLRDHUP;  // always watched: the peer going away
constexpr double kDrainSeconds = 5.0;         // lingering close after an error answer

}  // namespace

// Per-socket state. Fields marked (loop) are touched only by the loop thread; the rest are
// guarded by mu, because responses are written from other threads.
class Connection {
 public:
  Connection(HttpServer* server, int fd) : server(server), fd(fd) {}

  HttpServer* server;
  const int fd;
  // (loop)
  std::string in;
  bool busy = false;           // a request is being answered
  bool continue_sent = false;  // "100 Continue" sent for the request being received
  bool draining = false;       // write side shut; discarding input until EOF
  double last_activity = 0;

  std::mutex mu;
  bool closed = false;
  bool io_error = false;          // a write failed or output overflowed: close it
  std::string out;                // queued output not yet taken by the socket
  size_t out_off = 0;
  bool want_read = true;
  bool want_write = false;
  bool response_done = false;     // the current response ended: start on the next request
  bool close_after_flush = false;
  std::function<void()> on_close;

  // Writes now if the socket takes it, else queues. Caller holds mu.
  bool write_locked(std::string_view data) {
    if (closed || io_error) return false;
    if (data.empty()) return true;
    if (out_off == out.size()) {
      out.clear();
      out_off = 0;
      ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          io_error = true;
          return false;
        }
        n = 0;
      }
      data.remove_prefix(static_cast<size_t>(n));
      if (data.empty()) return true;
    }
    if (out.size() - out_off + data.size() > server->options_.max_output_bytes) {
      io_error = true;  // the client reads far slower than we produce; give up on it
      return false;
    }
    out.append(data);
    if (!want_write) {
      want_write = true;
      update_interest_locked();
    }
    return true;
  }

  // Sends queued output. Caller holds mu. Returns false on a socket error.
  bool flush_locked() {
    while (out_off < out.size()) {
      ssize_t n = ::send(fd, out.data() + out_off, out.size() - out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        io_error = true;
        return false;
      }
      out_off += static_cast<size_t>(n);
    }
    out.clear();
    out_off = 0;
    if (want_write) {
      want_write = false;
      update_interest_locked();
    }
    return true;
  }

  bool output_empty_locked() const { return out_off == out.size(); }

  void update_interest_locked() {
    if (closed) return;
    epoll_event ev{};
    ev.events = kBaseEvents | (want_read ? EPOLLIN : 0u) | (want_write ? EPOLLOUT : 0u);
    ev.data.fd = fd;
    ::epoll_ctl(server->epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
  }
};

// ---------------------------------------------------------------------------------------
// HttpResponse

HttpResponse::HttpResponse(std::shared_ptr<Connection> conn, bool keep_alive)
    : conn_(std::move(conn)), keep_alive_(keep_alive) {}

HttpResponse::~HttpResponse() {
  // A handler that dropped its response without answering must not hang the connection.
  if (!finished_) {
    if (streaming_) {
      end();
    } else {
      send(500, {{"Content-Type", "text/plain"}}, "internal error: no response was produced\n");
    }
  }
}

void HttpResponse::send(int status, const HttpHeaders& headers, std::string_view body) {
  if (finished_.exchange(true)) return;
  std::string bytes = http_response_head(status, headers, static_cast<int64_t>(body.size()), keep_alive_);
  bytes.append(body);
  {
    std::lock_guard lock(conn_->mu);
    conn_->write_locked(bytes);
    conn_->response_done = true;
    conn_->close_after_flush = !keep_alive_;
    conn_->on_close = nullptr;  // answered: nothing to cancel any more (and no cycles)
  }
  conn_->server->request_attention(conn_);
}

void HttpResponse::begin_stream(int status, const HttpHeaders& headers) {
  if (finished_ || streaming_) return;
  streaming_ = true;
  std::string head = http_response_head(status, headers, -1, keep_alive_);
  std::lock_guard lock(conn_->mu);
  conn_->write_locked(head);
}

bool HttpResponse::write(std::string_view data) {
  if (finished_ || !streaming_) return false;
  if (data.empty()) return !client_gone();  // an empty chunk would end the body
  std::string chunk = http_chunk(data);
  bool ok;
  {
    std::lock_guard lock(conn_->mu);
    ok = conn_->write_locked(chunk);
  }
  if (!ok) conn_->server->request_attention(conn_);  // let the loop close it
  return ok;
}

void HttpResponse::end() {
  if (!streaming_ || finished_.exchange(true)) return;
  {
    std::lock_guard lock(conn_->mu);
    conn_->write_locked(kHttpLastChunk);
    conn_->response_done = true;
    conn_->close_after_flush = !keep_alive_;
    conn_->on_close = nullptr;
  }
  conn_->server->request_attention(conn_);
}

void HttpResponse::on_close(std::function<void()> callback) {
  {
    std::lock_guard lock(conn_->mu);
    if (!conn_->closed && !conn_->io_error) {
      if (!finished_) conn_->on_close = std::move(callback);
      return;
    }
  }
  if (!finished_) callback();
}

bool HttpResponse::client_gone() const {
  std::lock_guard lock(conn_->mu);
  return conn_->closed || conn_->io_error;
}

// ---------------------------------------------------------------------------------------
// HttpServer

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : options_(std::move(options)), handler_(std::move(handler)) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port = std::to_string(options_.port);
  int rc = ::getaddrinfo(options_.host.empty() ? nullptr : options_.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) fail("serve: cannot resolve host \"", options_.host, "\": ", gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      listen_fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0) fail("serve: cannot listen on ", options_.host, ":", options_.port, ": ", last_error);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);

  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) fail("serve: epoll/eventfd: ", std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.fd = wake_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] { loop(); });
}

void HttpServer::wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

void HttpServer::stop_accepting() {
  stop_accepting_ = true;
  if (wake_fd_ >= 0) wake();
}

void HttpServer::stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  wake();
  thread_.join();
  for (auto& [fd, conn] : connections_) {
    std::function<void()> cb;
    {
      std::lock_guard lock(conn->mu);
      conn->closed = true;
      cb = std::move(conn->on_close);
      conn->on_close = nullptr;
      ::close(fd);
    }
    if (cb) cb();
  }
  connections_.clear();
  open_connections_ = 0;
  if (listen_fd_ >= 0) ::close(listen_fd_);
  ::close(epoll_fd_);
  ::close(wake_fd_);
  listen_fd_ = epoll_fd_ = wake_fd_ = -1;
}

void HttpServer::request_attention(const std::shared_ptr<Connection>& conn) {
  {
    std::lock_guard lock(attention_mutex_);
    attention_.push_back(conn);
  }
  wake();
}

void HttpServer::loop() {
  std::vector<epoll_event> events(256);
  double last_sweep = now_seconds();
  while (!stopping_) {
    int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), 500);
    if (n < 0 && errno != EINTR) {
      log_error("serve: epoll_wait: ", std::strerror(errno));
      break;
    }
    if (stop_accepting_ && listen_fd_ >= 0) {
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
      ::close(listen_fd_);
      listen_fd_ = -1;
    }
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      uint32_t ev = events[i].events;
      if (fd == listen_fd_) {
        accept_all();
        continue;
      }
      if (fd == wake_fd_) {
        uint64_t count;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_, &count, sizeof count);
        continue;
      }
      auto it = connections_.find(fd);
      if (it == connections_.end()) continue;
      std::shared_ptr<Connection> conn = it->second;
      if (ev & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) {
        // The peer is gone (or half-closed: an HTTP client that stops sending has nothing
        // more to ask); take any last bytes, then close, cancelling what it waited for.
        close_connection(conn);
        continue;
      }
      if (ev & EPOLLOUT) {
        bool close_now = false;
        {
          std::lock_guard lock(conn->mu);
          if (!conn->flush_locked()) close_now = true;
          else if (conn->output_empty_locked() && conn->close_after_flush && !conn->draining) {
            ::shutdown(conn->fd, SHUT_WR);
            conn->draining = true;
          }
        }
        if (close_now) {
          close_connection(conn);
          continue;
        }
      }
      if (ev & EPOLLIN) on_readable(conn);
    }
    // Responses that ended or failed on other threads.
    std::vector<std::shared_ptr<Connection>> attention;
    {
      std::lock_guard lock(attention_mutex_);
      attention.swap(attention_);
    }
    for (auto& conn : attention) {
      if (!connections_.count(conn->fd) || connections_[conn->fd] != conn) continue;
      bool close_now = false, next = false;
      {
        std::lock_guard lock(conn->mu);
        if (conn->closed) continue;
        if (conn->io_error) {
          close_now = true;
        } else if (conn->response_done) {
          conn->response_done = false;
          conn->busy = false;
          conn->last_activity = now_seconds();
          if (conn->close_after_flush) {
            if (conn->output_empty_locked() && !conn->draining) {
              ::shutdown(conn->fd, SHUT_WR);
              conn->draining = true;
            }
          } else {
            next = true;
          }
        }
      }
      if (close_now) close_connection(conn);
      else if (next) process_input(conn);
    }
    double now = now_seconds();
    if (now - last_sweep >= 0.5) {
      sweep(now);
      last_sweep = now;
    }
  }
}

void HttpServer::accept_all() {
  while (true) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) log_warn("serve: accept: ", std::strerror(errno));
      return;
    }
    if (open_connections_ >= static_cast<size_t>(options_.max_connections) || stopping_) {
      ::close(fd);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // SSE tokens go out at once
    auto conn = std::make_shared<Connection>(this, fd);
    conn->last_activity = now_seconds();
    epoll_event ev{};
    ev.events = kBaseEvents | EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      continue;
    }
    connections_[fd] = conn;
    ++open_connections_;
  }
}

void HttpServer::on_readable(const std::shared_ptr<Connection>& conn) {
  char buf[64 << 10];
  const size_t max_buffer = options_.limits.max_header_bytes + options_.limits.max_body_bytes + (64 << 10);
  while (true) {
    ssize_t n = ::recv(conn->fd, buf, sizeof buf, 0);
    if (n == 0) {
      close_connection(conn);
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      close_connection(conn);
      return;
    }
    conn->last_activity = now_seconds();
    if (conn->draining) continue;
    conn->in.append(buf, static_cast<size_t>(n));
    if (conn->in.size() > max_buffer) {
      // A request in flight and the client keeps sending: stop reading (EPOLLRDHUP still
      // tells us if it leaves) until the current answer is done.
      std::lock_guard lock(conn->mu);
      conn->want_read = false;
      conn->update_interest_locked();
      break;
    }
  }
  if (!conn->busy && !conn->draining) process_input(conn);
}

void HttpServer::process_input(const std::shared_ptr<Connection>& conn) {
  if (conn->busy || conn->draining) return;
  {
    std::lock_guard lock(conn->mu);
    if (!conn->want_read) {
      conn->want_read = true;
      conn->update_interest_locked();
    }
  }
  if (conn->in.empty()) return;
  HttpParseResult r = parse_http_request(conn->in, options_.limits);
  if (r.status == HttpParseResult::Status::kNeedMore) {
    if (r.headers_complete && r.expect_continue && !conn->continue_sent) {
      conn->continue_sent = true;
      std::lock_guard lock(conn->mu);
      conn->write_locked("HTTP/1.1 100 Continue\r\n\r\n");
    }
    return;
  }
  conn->busy = true;
  conn->continue_sent = false;
  HttpRequest request;
  bool keep_alive;
  if (r.status == HttpParseResult::Status::kError) {
    request = std::move(r.request);
    request.error_status = r.error_status;
    request.error_message = std::move(r.error_message);
    request.body.clear();
    request.keep_alive = keep_alive = false;  // the stream position is unknown now
    conn->in.clear();
  } else {
    request = std::move(r.request);
    conn->in.erase(0, r.consumed);
    keep_alive = request.keep_alive && !stop_accepting_;
  }
  auto response = std::make_shared<HttpResponse>(conn, keep_alive);
  try {
    handler_(std::move(request), response);
  } catch (const std::exception& e) {
    log_error("serve: handler failed: ", e.what());
    response->send(500, {{"Content-Type", "text/plain"}}, "internal error\n");
  }
}

void HttpServer::close_connection(const std::shared_ptr<Connection>& conn) {
  std::function<void()> cb;
  {
    std::lock_guard lock(conn->mu);
    if (conn->closed) return;
    conn->closed = true;
    cb = std::move(conn->on_close);
    conn->on_close = nullptr;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, conn->fd, nullptr);
    ::close(conn->fd);
  }
  connections_.erase(conn->fd);
  --open_connections_;
  if (cb) cb();
}

void HttpServer::sweep(double now) {
  std::vector<std::shared_ptr<Connection>> expired;
  for (auto& [fd, conn] : connections_) {
    if (conn->draining && now - conn->last_activity > kDrainSeconds) expired.push_back(conn);
    else if (!conn->busy && now - conn->last_activity > options_.idle_timeout_seconds) expired.push_back(conn);
  }
  for (auto& conn : expired) close_connection(conn);
}

}  // namespace astrai::serve
