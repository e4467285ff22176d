// The whole server over loopback HTTP, with a real Engine on the deterministic fake model of
// tests/infer (the end-to-end tests with a real model and the official SDKs are e2e_*.mjs).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "../infer/fake_model.h"
#include "infer/backend.h"
#include "serve/server.h"

namespace astrai::serve {
namespace {

using infer::testing::FakeCodec;
using infer::testing::FakeModel;

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

struct Reply {
  int status = 0;
  std::string head;
  std::string body;  // de-chunked
  std::string header(const std::string& name) const {
    std::string lower_head = head;
    for (auto& c : lower_head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    size_t p = lower_head.find("\r\n" + name + ": ");
    if (p == std::string::npos) return "";
    size_t start = p + 4 + name.size();
    return head.substr(start, head.find("\r\n", start) - start);
  }
  Json json() const { return Json::parse(body); }
};

// Reads one whole response (Content-Length or chunked) from fd; gives up after ~20 s.
Reply read_reply(int fd) {
  std::string buf;
  char tmp[8192];
  Reply r;
  auto more = [&]() {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20000) <= 0) return false;
    ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf.append(tmp, static_cast<size_t>(n));
    return true;
  };
  size_t head_end;
  while ((head_end = buf.find("\r\n\r\n")) == std::string::npos) {
    if (!more()) return r;
  }
  r.head = buf.substr(0, head_end + 2);
  r.status = std::stoi(r.head.substr(9, 3));
  std::string rest = buf.substr(head_end + 4);
  buf = rest;
  std::string cl = r.header("content-length");
  if (!cl.empty()) {
    size_t n = std::stoul(cl);
    while (buf.size() < n && more()) {
    }
    r.body = buf.substr(0, n);
    return r;
  }
  size_t pos = 0;
  while (true) {
    size_t eol;
    while ((eol = buf.find("\r\n", pos)) == std::string::npos) {
      if (!more()) return r;
    }
    size_t size = std::stoul(buf.substr(pos, eol - pos), nullptr, 16);
    while (buf.size() < eol + 2 + size + 2) {
      if (!more()) return r;
    }
    if (size == 0) return r;
    r.body += buf.substr(eol + 2, size);
    pos = eol + 2 + size + 2;
  }
}

std::string request_text(const std::string& method, const std::string& path, const std::string& body,
                         const std::vector<std::string>& headers = {}) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: x\r\n";
  for (const auto& h : headers) req += h + "\r\n";
  if (!body.empty() || method == "POST") req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  return req + "\r\n" + body;
}

void send_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::send(fd, s.data(), s.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    s.remove_prefix(static_cast<size_t>(n));
  }
}

Reply call(int port, const std::string& method, const std::string& path, const std::string& body = "",
           const std::vector<std::string>& headers = {}) {
  int fd = connect_to(port);
  send_all(fd, request_text(method, path, body, headers));
  Reply r = read_reply(fd);
  ::close(fd);
  return r;
}

// SSE "data:" payloads in order.
std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  return out;
}

struct Rig {
  FakeModel* model = nullptr;
  std::shared_ptr<infer::Engine> engine;
  std::unique_ptr<Server> server;
  int port = 0;

  explicit Rig(ServerOptions so = {}, infer::EngineOptions eo = {}, bool with_engine = true) {
    so.port = 0;
    so.model_name = "fake";
    so.threads = 2;
    auto codec = std::make_shared<FakeCodec>();
    server = std::make_unique<Server>(so, [codec](int32_t id) { return codec->piece(id); }, nullptr);
    server->start();
    port = server->port();
    if (!with_engine) return;
    auto m = std::make_unique<FakeModel>();
    model = m.get();
    eo.page_size = 4;
    eo.kv_cache_bytes = 4096ll * 4 * 32;
    engine = std::make_shared<infer::Engine>(std::move(m), std::make_unique<FakeCodec>(), eo);
    server->set_engine(engine);
  }
  ~Rig() { server->shutdown(1.0); }
};

const std::string kChat = R"({"model":"fake","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"temperature":0)";

TEST(Server, ChatNonStreamingAndStreamingAgree) {
  Rig rig;
  Reply r = call(rig.port, "POST", "/v1/chat/completions", kChat + "}");
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = r.json();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  // "user: hi\nassistant: " is 20 bytes in the fake byte-level codec.
  EXPECT_EQ(j["usage"]["prompt_tokens"], 20);
  EXPECT_EQ(r.header("access-control-allow-origin"), "*");

  Reply s = call(rig.port, "POST", "/v1/chat/completions",
                 kChat + R"(,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_EQ(s.status, 200);
  EXPECT_EQ(s.header("content-type"), "text/event-stream");
  auto events = sse_data(s.body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(Json::parse(events[0])["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(events.back(), "[DONE]");
  Json usage = Json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 8);
  std::string text;
  std::string finish;
  for (size_t i = 1; i + 2 < events.size(); ++i) {
    Json c = Json::parse(events[i]);
    const Json& ch = c["choices"][0];
    if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(text, j["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(finish, "length");
  // The server's timings: 8 tokens, the 7 after the first over the decode span.
  const Json& t = usage["timings"];
  EXPECT_GT(t["ttft_ms"].get<double>(), 0.0) << t;
  EXPECT_GE(t["queue_ms"].get<double>(), 0.0);
  EXPECT_EQ(t["decode_tokens"], 7);
  const double rate = 7 / (t["decode_ms"].get<double>() / 1000);
  EXPECT_NEAR(t["decode_tokens_per_second"].get<double>(), rate, rate * 0.02);
  EXPECT_EQ(j["timings"]["decode_tokens"], 7);
}

TEST(Server, ModelsCarryTheContextLength) {
  Rig rig;
  Reply models = call(rig.port, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.json()["data"][0]["max_model_len"], rig.engine->max_context());
  EXPECT_GT(rig.engine->max_context(), 0);
  EXPECT_EQ(call(rig.port, "GET", "/v1/models/fake").json()["max_model_len"], rig.engine->max_context());
}

TEST(Server, AnthropicStreamAndCountTokens) {
  Rig rig;
  Reply c = call(rig.port, "POST", "/v1/messages/count_tokens",
                 R"({"model":"fake","messages":[{"role":"user","content":"hi"}]})");
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.json()["input_tokens"], 20);
  Reply s = call(rig.port, "POST", "/v1/messages",
                 R"({"model":"fake","max_tokens":5,"stream":true,"temperature":0,"messages":[{"role":"user","content":"hi"}]})");
  ASSERT_EQ(s.status, 200) << s.body;
  std::vector<std::string> names;
  size_t pos = 0;
  while ((pos = s.body.find("event: ", pos)) != std::string::npos) {
    size_t end = s.body.find('\n', pos);
    names.push_back(s.body.substr(pos + 7, end - pos - 7));
    pos = end;
  }
  ASSERT_GE(names.size(), 7u);
  EXPECT_EQ(names[0], "message_start");
  EXPECT_EQ(names[1], "content_block_start");
  EXPECT_EQ(names[2], "ping");
  EXPECT_EQ(names[3], "content_block_delta");
  EXPECT_EQ(names[names.size() - 3], "content_block_stop");
  EXPECT_EQ(names[names.size() - 2], "message_delta");
  EXPECT_EQ(names.back(), "message_stop");
  EXPECT_NE(s.body.find("\"stop_reason\":\"max_tokens\""), std::string::npos);
  EXPECT_NE(s.body.find("\"output_tokens\":5"), std::string::npos);
}

TEST(Server, ErrorsAuthAndCors) {
  ServerOptions so;
  so.api_keys = {"secret"};
  so.max_body_bytes = 4096;
  Rig rig(so);
  EXPECT_EQ(call(rig.port, "GET", "/health").status, 200);  // exempt
  Reply ready = call(rig.port, "GET", "/health/ready");     // exempt too
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.json()["status"], "ready");
  Reply no_key = call(rig.port, "GET", "/v1/models");
  EXPECT_EQ(no_key.status, 401);
  EXPECT_EQ(no_key.json()["error"]["code"], "invalid_api_key");
  Reply anthropic = call(rig.port, "POST", "/v1/messages", "{}", {"x-api-key: wrong"});
  EXPECT_EQ(anthropic.status, 401);
  EXPECT_EQ(anthropic.json()["type"], "error");
  EXPECT_EQ(anthropic.json()["error"]["type"], "authentication_error");
  Reply models = call(rig.port, "GET", "/v1/models", "", {"Authorization: Bearer secret"});
  EXPECT_EQ(models.status, 200);
  EXPECT_EQ(models.json()["data"][0]["id"], "fake");
  EXPECT_EQ(call(rig.port, "GET", "/v1/models", "", {"x-api-key: secret"}).status, 200);
  const std::vector<std::string> key = {"x-api-key: secret"};
  EXPECT_EQ(call(rig.port, "GET", "/nope", "", key).status, 404);
  EXPECT_EQ(call(rig.port, "GET", "/v1/chat/completions", "", key).status, 405);
  Reply bad_json = call(rig.port, "POST", "/v1/chat/completions", "{oops", key);
  EXPECT_EQ(bad_json.status, 400);
  EXPECT_EQ(bad_json.json()["error"]["type"], "invalid_request_error");
  Reply big = call(rig.port, "POST", "/v1/messages", std::string(5000, ' '), key);
  EXPECT_EQ(big.status, 413);
  EXPECT_EQ(big.json()["error"]["type"], "request_too_large");
  Reply wrong_model = call(rig.port, "POST", "/v1/chat/completions",
                           R"({"model":"gpt-9","messages":[{"role":"user","content":"x"}]})", key);
  EXPECT_EQ(wrong_model.status, 404);
  Reply preflight = call(rig.port, "OPTIONS", "/v1/chat/completions", "",
                         {"Origin: http://a.example", "Access-Control-Request-Method: POST",
                          "Access-Control-Request-Headers: authorization, content-type"});
  EXPECT_EQ(preflight.status, 204);
  EXPECT_EQ(preflight.header("access-control-allow-origin"), "*");
  EXPECT_EQ(preflight.header("access-control-allow-headers"), "authorization, content-type");
  Reply page = call(rig.port, "GET", "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("/v1/chat/completions"), std::string::npos);
  Reply metrics = call(rig.port, "GET", "/metrics", "", key);
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("astrai_http_requests_total{endpoint=\"/v1/models\",status=\"401\"} 1"), std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("# TYPE astrai_time_to_first_token_seconds histogram"), std::string::npos);
}

TEST(Server, HealthIs503WhileLoading) {
  Rig rig({}, {}, /*with_engine=*/false);
  Reply h = call(rig.port, "GET", "/health");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.json()["status"], "loading");
  // Live (the process answers) but not ready (no model yet).
  EXPECT_EQ(call(rig.port, "GET", "/health/live").status, 200);
  Reply ready = call(rig.port, "GET", "/health/ready");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.json()["status"], "loading");
  EXPECT_EQ(call(rig.port, "POST", "/v1/chat/completions", kChat + "}").status, 503);
}

Json stats(int port) { return call(port, "GET", "/stats").json(); }

TEST(Server, DisconnectCancelsAndReturnsPages) {
  Rig rig;
  rig.model->before_forward = [](const model::Batch&) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); };
  int fd = connect_to(rig.port);
  send_all(fd, request_text("POST", "/v1/chat/completions",
                            R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3000,"stream":true})"));
  // Wait for generated tokens to flow, then walk away.
  std::string got;
  char buf[4096];
  while (got.find("\"content\":\"") == std::string::npos || got.find("data: ", got.find("data: ") + 1) == std::string::npos) {
    pollfd p{fd, POLLIN, 0};
    ASSERT_GT(::poll(&p, 1, 20000), 0);
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  // The engine publishes its counters between steps: allow it one to show the request.
  Json during;
  for (int i = 0; i < 200; ++i) {
    during = stats(rig.port);
    if (during["running"] == 1 && during["kv_pages_used"].get<int>() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(during["running"], 1) << got << "\n" << during.dump();
  EXPECT_GT(during["kv_pages_used"].get<int>(), 0);
  ::close(fd);
  Json after;
  for (int i = 0; i < 500; ++i) {
    after = stats(rig.port);
    if (after["running"] == 0 && after["kv_pages_used"] == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(after["running"], 0);
  EXPECT_EQ(after["kv_pages_used"], 0);
  EXPECT_LT(after["tokens_generated"].get<int>(), 3000);  // it stopped early
  Reply m = call(rig.port, "GET", "/metrics");
  EXPECT_NE(m.body.find("astrai_client_disconnects_total 1"), std::string::npos);
}

TEST(Server, QueueFullIs429WithRetryAfter) {
  infer::EngineOptions eo;
  eo.max_running = 1;
  eo.max_queue = 1;
  Rig rig({}, eo);
  rig.model->before_forward = [](const model::Batch&) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); };
  const std::string slow = R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":2000,"stream":true})";
  auto wait_for = [&](const char* key, int value) {
    for (int i = 0; i < 2000; ++i) {
      if (stats(rig.port)[key].get<int>() == value) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  };
  // One running, one queued (the engine's queue holds a request until its thread takes it).
  int a = connect_to(rig.port), b = connect_to(rig.port);
  send_all(a, request_text("POST", "/v1/chat/completions", slow));
  ASSERT_TRUE(wait_for("running", 1));
  send_all(b, request_text("POST", "/v1/chat/completions", slow));
  ASSERT_TRUE(wait_for("waiting", 1));
  Reply third = call(rig.port, "POST", "/v1/messages",
                     R"({"model":"fake","max_tokens":5,"messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(third.status, 429) << third.body;
  EXPECT_EQ(third.header("retry-after"), "1");
  EXPECT_EQ(third.json()["error"]["type"], "rate_limit_error");
  // Not ready while the queue is full (a load balancer sends new requests elsewhere); still
  // live, and /health (loaded, not draining) still ok.
  Reply ready = call(rig.port, "GET", "/health/ready");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.json()["status"], "queue_full");
  EXPECT_EQ(call(rig.port, "GET", "/health/live").status, 200);
  EXPECT_EQ(call(rig.port, "GET", "/health").status, 200);
  ::close(a);
  ::close(b);
}

TEST(Server, ShutdownEndsOpenStreamsCleanly) {
  auto rig = std::make_unique<Rig>();
  rig->model->before_forward = [](const model::Batch&) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); };
  int fd = connect_to(rig->port);
  send_all(fd, request_text("POST", "/v1/chat/completions",
                            R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3000,"stream":true})"));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::thread stopper([&] { rig->server->shutdown(0.1); });
  Reply r = read_reply(fd);  // returns once the chunked body is terminated
  stopper.join();
  EXPECT_EQ(r.status, 200);
  auto events = sse_data(r.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");  // the stream was ended, not cut
  EXPECT_NE(r.body.find("shutting down"), std::string::npos);
  ::close(fd);
}

// What a load balancer sees while SIGTERM drains: the listening socket is closed (new connections
// are refused), and on connections it already holds /health and /health/ready say 503
// "shutting_down", /health/live stays 200, new work gets 503 with Retry-After, each answer closing
// its connection; the request in flight still ends properly, and the drain takes about the grace.
TEST(Server, DrainingIsLiveButNotReady) {
  auto rig = std::make_unique<Rig>();
  rig->model->before_forward = [](const model::Batch&) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); };
  const int port = rig->port;
  // Keep-alive connections opened before the signal, one per probe (a reply while draining
  // carries Connection: close).
  int held[4];
  for (int& fd : held) {
    fd = connect_to(port);
    send_all(fd, request_text("GET", "/health/ready", ""));
    ASSERT_EQ(read_reply(fd).status, 200);
  }
  int stream = connect_to(port);
  send_all(stream, request_text("POST", "/v1/chat/completions",
                                R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3000,"stream":true})"));
  for (int i = 0; i < 2000 && stats(port)["running"].get<int>() != 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const double grace = 1.0;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread stopper([&] { rig->server->shutdown(grace); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the drain has begun
  auto probe = [&](int fd, const char* method, const std::string& path, const std::string& body) {
    send_all(fd, request_text(method, path, body));
    Reply r = read_reply(fd);
    EXPECT_EQ(r.header("connection"), "close") << path;
    return r;
  };
  Reply ready = probe(held[0], "GET", "/health/ready", "");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.json()["status"], "shutting_down");
  Reply health = probe(held[1], "GET", "/health", "");
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(health.json()["status"], "shutting_down");
  EXPECT_EQ(probe(held[2], "GET", "/health/live", "").status, 200);
  Reply refused = probe(held[3], "POST", "/v1/chat/completions", kChat + "}");
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.header("retry-after"), "5");
  // New connections are refused (a proxy moves on to another replica at once).
  EXPECT_EQ(connect_to(port), -1);
  Reply r = read_reply(stream);  // the 3000-token stream is cut at the grace and ended cleanly
  stopper.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, 200);
  auto events = sse_data(r.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_GE(took, grace * 0.9);
  EXPECT_LT(took, grace + 5.0);
  for (int fd : held) ::close(fd);
  ::close(stream);
}

}  // namespace
}  // namespace astrai::serve
