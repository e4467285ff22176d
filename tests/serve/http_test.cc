// HTTP parser and the epoll server over real loopback sockets.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>

#include "serve/http.h"
#include "serve/http_server.h"

namespace astrai::serve {
namespace {

using S = HttpParseResult::Status;

TEST(HttpParse, SimpleGetWithQueryAndHeaders) {
  auto r = parse_http_request("GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\nX-Api-Key:  k1 \r\n\r\n", {});
  ASSERT_EQ(r.status, S::kComplete);
  EXPECT_EQ(r.request.method, "GET");
  EXPECT_EQ(r.request.path, "/v1/models");
  EXPECT_EQ(r.request.query, "x=1");
  ASSERT_NE(r.request.header("x-api-key"), nullptr);
  EXPECT_EQ(*r.request.header("x-api-key"), "k1");
  EXPECT_TRUE(r.request.keep_alive);
}

TEST(HttpParse, ContentLengthBodyIncrementally) {
  std::string msg = "POST /v1/messages HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
  for (size_t cut = 0; cut < msg.size(); ++cut) {
    auto r = parse_http_request(std::string_view(msg).substr(0, cut), {});
    EXPECT_EQ(r.status, S::kNeedMore) << cut;
  }
  auto r = parse_http_request(msg + "GET / HTTP/1.1\r\n\r\n", {});
  ASSERT_EQ(r.status, S::kComplete);
  EXPECT_EQ(r.request.body, "hello");
  EXPECT_EQ(r.consumed, msg.size());  // the pipelined request stays in the buffer
}

TEST(HttpParse, ChunkedBody) {
  std::string msg = "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
  auto partial = parse_http_request(std::string_view(msg).substr(0, msg.size() - 3), {});
  EXPECT_EQ(partial.status, S::kNeedMore);
  auto r = parse_http_request(msg, {});
  ASSERT_EQ(r.status, S::kComplete);
  EXPECT_EQ(r.request.body, "hello world");
  EXPECT_EQ(r.consumed, msg.size());
}

TEST(HttpParse, LimitsAndErrors) {
  HttpLimits small{.max_header_bytes = 64, .max_body_bytes = 10};
  auto big = parse_http_request("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 11\r\n\r\n", small);
  EXPECT_EQ(big.status, S::kError);
  EXPECT_EQ(big.error_status, 413);
  EXPECT_EQ(big.request.path, "/v1/chat/completions");  // so the answer can use the right error shape
  auto chunked_big = parse_http_request("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nb\r\nhello world\r\n", small);
  EXPECT_EQ(chunked_big.error_status, 413);
  auto head = parse_http_request("GET / HTTP/1.1\r\nX: " + std::string(100, 'a'), small);
  EXPECT_EQ(head.error_status, 431);
  EXPECT_EQ(parse_http_request("GARBAGE\r\n\r\n", {}).error_status, 400);
  EXPECT_EQ(parse_http_request("GET / HTTP/2.0\r\n\r\n", {}).error_status, 505);
  EXPECT_EQ(parse_http_request("GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", {}).error_status, 400);
  EXPECT_EQ(parse_http_request("POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", {}).error_status, 400);
  EXPECT_EQ(parse_http_request("POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", {})
                .error_status,
            400);
  EXPECT_EQ(parse_http_request("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", {}).error_status, 501);
  EXPECT_EQ(parse_http_request("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", {}).error_status, 400);
}

TEST(HttpParse, KeepAliveRulesAndExpect) {
  EXPECT_FALSE(parse_http_request("GET / HTTP/1.1\r\nConnection: close\r\n\r\n", {}).request.keep_alive);
  EXPECT_FALSE(parse_http_request("GET / HTTP/1.0\r\n\r\n", {}).request.keep_alive);
  EXPECT_TRUE(parse_http_request("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", {}).request.keep_alive);
  auto r = parse_http_request("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n", {});
  EXPECT_EQ(r.status, S::kNeedMore);
  EXPECT_TRUE(r.headers_complete);
  EXPECT_TRUE(r.expect_continue);
}

TEST(HttpWrite, HeadAndChunks) {
  EXPECT_EQ(http_response_head(200, {{"Content-Type", "text/plain"}}, 2, true),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n");
  EXPECT_EQ(http_response_head(429, {}, -1, false),
            "HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(http_chunk("hello world, this!"), "12\r\nhello world, this!\r\n");
}

// ---- live server over loopback ------------------------------------------------------

int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::send(fd, s.data(), s.size(), MSG_NOSIGNAL);
    ASSERT_GT(n, 0);
    s.remove_prefix(static_cast<size_t>(n));
  }
}

// Reads until `needle` appears or the peer closes (poll-based, generous bound so a broken
// server fails the test instead of hanging it).
std::string read_until(int fd, std::string_view needle) {
  std::string got;
  char buf[4096];
  for (int i = 0; i < 1000 && got.find(needle) == std::string::npos; ++i) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

TEST(HttpServer, KeepAlivePipeliningAnd413) {
  HttpServerOptions opts;
  opts.port = 0;
  opts.limits.max_body_bytes = 16;
  HttpServer server(opts, [](HttpRequest&& req, std::shared_ptr<HttpResponse> res) {
    if (req.error_status) {
      res->send(req.error_status, {}, "error " + std::to_string(req.error_status) + " " + req.path);
      return;
    }
    res->send(200, {}, req.method + " " + req.path + " " + req.body);
  });
  server.start();
  int fd = connect_to(server.port());
  ASSERT_GE(fd, 0);
  send_all(fd, "POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET /b HTTP/1.1\r\n\r\n");
  std::string got = read_until(fd, "GET /b ");
  EXPECT_NE(got.find("Content-Length: 10\r\n\r\nPOST /a hi"), std::string::npos) << got;
  EXPECT_NE(got.find("GET /b "), std::string::npos) << got;
  send_all(fd, "POST /big HTTP/1.1\r\nContent-Length: 100\r\n\r\n");
  got = read_until(fd, "/big");
  EXPECT_NE(got.find("HTTP/1.1 413 "), std::string::npos) << got;
  EXPECT_NE(got.find("Connection: close"), std::string::npos) << got;
  ::close(fd);

  // Expect: 100-continue gets the go-ahead before the body is sent.
  fd = connect_to(server.port());
  send_all(fd, "POST /c HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n");
  got = read_until(fd, "\r\n\r\n");
  EXPECT_EQ(got, "HTTP/1.1 100 Continue\r\n\r\n");
  send_all(fd, "abc");
  got = read_until(fd, "POST /c abc");
  EXPECT_NE(got.find("POST /c abc"), std::string::npos) << got;
  ::close(fd);
  server.stop();
}

TEST(HttpServer, StreamsFromAnotherThreadAndNoticesDisconnect) {
  std::mutex mu;
  std::condition_variable cv;
  std::shared_ptr<HttpResponse> held;
  std::atomic<int> closed{0};
  HttpServerOptions opts;
  opts.port = 0;
  HttpServer server(opts, [&](HttpRequest&& req, std::shared_ptr<HttpResponse> res) {
    res->begin_stream(200, {{"Content-Type", "text/event-stream"}});
    res->on_close([&] { closed++; });
    std::lock_guard lock(mu);
    held = res;
    cv.notify_all();
  });
  server.start();
  int fd = connect_to(server.port());
  send_all(fd, "GET /stream HTTP/1.1\r\n\r\n");
  std::shared_ptr<HttpResponse> res;
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return held != nullptr; });
    res = held;
  }
  std::thread writer([res] {
    res->write("data: one\n\n");
    res->write("data: two\n\n");
  });
  writer.join();
  std::string got = read_until(fd, "data: two\n\n\r\n");
  EXPECT_NE(got.find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_NE(got.find("b\r\ndata: one\n\n\r\n"), std::string::npos) << got;
  EXPECT_EQ(closed.load(), 0);
  ::close(fd);  // the client walks away mid-stream
  for (int i = 0; i < 200 && closed.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(closed.load(), 1);
  EXPECT_FALSE(res->write("data: three\n\n"));
  EXPECT_TRUE(res->client_gone());
  res->end();
  server.stop();
}

TEST(HttpServer, HoldsManyOpenStreamsWithOneThread) {
  std::mutex mu;
  std::vector<std::shared_ptr<HttpResponse>> held;
  HttpServerOptions opts;
  opts.port = 0;
  HttpServer server(opts, [&](HttpRequest&&, std::shared_ptr<HttpResponse> res) {
    res->begin_stream(200, {});
    std::lock_guard lock(mu);
    held.push_back(res);
  });
  server.start();
  constexpr int kStreams = 300;
  std::vector<int> fds;
  for (int i = 0; i < kStreams; ++i) {
    int fd = connect_to(server.port());
    ASSERT_GE(fd, 0);
    send_all(fd, "GET /s HTTP/1.1\r\n\r\n");
    fds.push_back(fd);
  }
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard lock(mu);
      if (held.size() == kStreams) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::lock_guard lock(mu);
  ASSERT_EQ(held.size(), static_cast<size_t>(kStreams));
  for (auto& r : held) {
    EXPECT_TRUE(r->write("x"));
    r->end();
  }
  for (int fd : fds) {
    std::string got = read_until(fd, "0\r\n\r\n");
    EXPECT_NE(got.find("1\r\nx\r\n0\r\n\r\n"), std::string::npos);
    ::close(fd);
  }
  EXPECT_EQ(server.open_connections() <= static_cast<size_t>(kStreams), true);
  server.stop();
}

}  // namespace
}  // namespace astrai::serve
