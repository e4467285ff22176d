// Server load benchmark: N concurrent clients run the same workload (a distribution of prompt
// and output lengths) twice in one process on one engine: first through the Engine API
// directly, then through `astrai serve`'s HTTP server (streaming /v1/completions over loopback
// sockets). The difference is the server's overhead: HTTP, JSON, SSE formatting, threads.
//
//   serve_load_bench --model DIR [--clients 32] [--requests 128] [--prompt 16:256]
//                    [--output 16:128] [--max-running 64] [--threads 0] [--json]
//
// Every request asks for logprobs 0 in both runs so each streamed chunk says exactly how many
// tokens it carries (inter-token latency per token, not per chunk). Numbers, never pass/fail.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "base/json.h"
#include "base/parallel.h"
#include "infer/engine.h"
#include "model/transformer.h"
#include "serve/server.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Work {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 0;
  uint64_t seed = 0;
};

struct Sample {
  double ttft = 0, e2e = 0;
  std::vector<double> itl;
  int64_t tokens = 0;
};

struct Report {
  double wall = 0;
  int64_t tokens = 0;
  std::vector<double> ttft, itl, e2e;
};

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

Report collect(const std::vector<Sample>& samples, double wall) {
  Report r;
  r.wall = wall;
  for (const auto& s : samples) {
    r.tokens += s.tokens;
    r.ttft.push_back(s.ttft);
    r.e2e.push_back(s.e2e);
    r.itl.insert(r.itl.end(), s.itl.begin(), s.itl.end());
  }
  return r;
}

// N client threads pull request indices until the workload is done.
template <typename Fn>
double run_clients(int clients, size_t n, Fn&& one) {
  std::atomic<size_t> next{0};
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      for (size_t i = next++; i < n; i = next++) one(i);
    });
  }
  for (auto& t : threads) t.join();
  return since(t0);
}

Sample engine_request(astrai::infer::Engine& engine, const Work& w) {
  astrai::infer::GenerationRequest req;
  req.prompt_ids = w.prompt;
  req.sampling.max_tokens = w.max_tokens;
  req.sampling.ignore_eos = true;
  req.sampling.seed = w.seed;
  req.sampling.logprobs = 0;
  Sample s;
  std::mutex mu;
  auto t0 = Clock::now();
  double last = -1;
  auto handle = engine.submit(req, [&](const astrai::infer::ChoiceDelta& d) {
    if (d.token_ids.empty()) return;
    double now = since(t0);
    std::lock_guard lock(mu);
    if (last < 0) s.ttft = now;
    else for (size_t k = 0; k < d.token_ids.size(); ++k) s.itl.push_back((now - last) / static_cast<double>(d.token_ids.size()));
    last = now;
  });
  auto result = handle.wait();
  std::lock_guard lock(mu);
  s.e2e = since(t0);
  s.tokens = result.completion_tokens;
  return s;
}

Sample http_request(int port, const Work& w) {
  astrai::Json body = {{"prompt", w.prompt}, {"max_tokens", w.max_tokens}, {"ignore_eos", true},
                       {"seed", w.seed},     {"logprobs", 0},            {"stream", true}};
  std::string b = body.dump();
  std::string req = "POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(b.size()) + "\r\n\r\n" + b;
  Sample s;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto t0 = Clock::now();
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return s;
  }
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string buf;
  char tmp[16384];
  size_t scan = 0;
  double last = -1;
  bool done = false;
  while (!done) {
    ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) break;
    double now = since(t0);
    buf.append(tmp, static_cast<size_t>(n));
    // Events are "data: {...}\n\n" inside chunked framing; find complete ones.
    size_t pos;
    while ((pos = buf.find("data: ", scan)) != std::string::npos) {
      size_t end = buf.find("\n\n", pos);
      if (end == std::string::npos) break;
      std::string_view data(buf.data() + pos + 6, end - pos - 6);
      scan = end + 2;
      if (data == "[DONE]") {
        done = true;
        break;
      }
      astrai::Json j = astrai::Json::parse(data, nullptr, false);
      if (j.is_discarded() || !j.contains("choices") || j["choices"].empty()) continue;
      const auto& lp = j["choices"][0]["logprobs"];
      size_t k = lp.is_object() ? lp["tokens"].size() : 0;
      if (k == 0) continue;
      if (last < 0) s.ttft = now;
      else for (size_t i = 0; i < k; ++i) s.itl.push_back((now - last) / static_cast<double>(k));
      last = now;
      s.tokens += static_cast<int64_t>(k);
    }
  }
  s.e2e = since(t0);
  ::close(fd);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Server load benchmark: the same workload through the Engine API and through HTTP"};
  std::string model_dir, prompt_range = "16:256", output_range = "16:128";
  int clients = 32, requests = 128, max_running = 64, threads = 0, http_threads = 4;
  bool json = false, http_first = false;
  app.add_option("--model", model_dir, "Model directory (with tokenizer files)")->required();
  app.add_option("--clients", clients, "Concurrent clients")->capture_default_str();
  app.add_option("--requests", requests, "Requests per run")->capture_default_str();
  app.add_option("--prompt", prompt_range, "Prompt tokens, uniform MIN:MAX")->capture_default_str();
  app.add_option("--output", output_range, "Output tokens, uniform MIN:MAX")->capture_default_str();
  app.add_option("--max-running", max_running, "Engine running batch cap")->capture_default_str();
  app.add_option("--threads", threads, "Compute threads (0 = all)")->capture_default_str();
  app.add_option("--http-threads", http_threads, "Server request workers")->capture_default_str();
  app.add_flag("--json", json, "Print one JSON object");
  app.add_flag("--http-first", http_first, "Run the HTTP pass before the Engine API pass");
  CLI11_PARSE(app, argc, argv);
  auto range = [](const std::string& s) {
    size_t c = s.find(':');
    return std::make_pair(std::stoi(s.substr(0, c)), std::stoi(s.substr(c + 1)));
  };
  auto [pmin, pmax] = range(prompt_range);
  auto [omin, omax] = range(output_range);
  if (threads > 0) astrai::set_num_threads(threads);

  auto tok = std::make_shared<astrai::tokenizer::Tokenizer>(astrai::tokenizer::Tokenizer::load(model_dir));
  auto model = std::make_shared<astrai::model::Transformer>(astrai::model::Transformer::load(model_dir));
  astrai::infer::EngineOptions eo;
  eo.max_running = max_running;
  eo.kv_cache_bytes = 1ll << 30;
  auto engine = std::make_shared<astrai::infer::Engine>(model, tok, eo);

  // The same workload shape for both runs (prompt and output lengths, seeds), but different
  // random prompt ids per run: the second run must not be served from the prefix cache.
  auto make_work = [&](uint64_t ids_seed) {
    std::mt19937_64 shape(1234), ids(ids_seed);
    std::vector<Work> work(static_cast<size_t>(requests));
    for (size_t i = 0; i < work.size(); ++i) {
      int plen = std::uniform_int_distribution<int>(pmin, pmax)(shape);
      for (int k = 0; k < plen; ++k) work[i].prompt.push_back(std::uniform_int_distribution<int32_t>(1000, 100000)(ids));
      work[i].max_tokens = std::uniform_int_distribution<int>(omin, omax)(shape);
      work[i].seed = i;
    }
    return work;
  };
  const std::vector<Work> engine_work = make_work(1), http_work = make_work(2);
  std::vector<Sample> engine_samples(engine_work.size()), http_samples(http_work.size());
  // Warm-up (page faults of the mapped weights, thread pools).
  engine_request(*engine, make_work(3)[0]);

  astrai::Json engine_time, http_time;
  auto step_time = [&](const astrai::infer::EngineStats& a, const astrai::infer::EngineStats& b) {
    return astrai::Json{{"steps", b.steps - a.steps},
                        {"schedule_s", b.schedule_seconds - a.schedule_seconds},
                        {"forward_s", b.forward_seconds - a.forward_seconds},
                        {"sample_s", b.sample_seconds - a.sample_seconds},
                        {"step_tokens", b.step_tokens_total - a.step_tokens_total}};
  };
  auto run_engine = [&] {
    auto before = engine->stats();
    struct Done {
      std::function<void()> fn;
      ~Done() { fn(); }
    } done{[&] { engine_time = step_time(before, engine->stats()); }};
    return run_clients(clients, engine_work.size(), [&](size_t i) { engine_samples[i] = engine_request(*engine, engine_work[i]); });
  };
  double engine_wall = http_first ? 0 : run_engine();

  astrai::serve::ServerOptions so;
  so.port = 0;
  so.threads = http_threads;
  so.model_name = "bench";
  astrai::serve::Server server(so, [tok](int32_t id) { return tok->decode(std::vector<int32_t>{id}, false); }, nullptr);
  server.start();
  server.set_engine(engine);
  auto http_before = engine->stats();
  double http_wall = run_clients(clients, http_work.size(), [&](size_t i) { http_samples[i] = http_request(server.port(), http_work[i]); });
  http_time = step_time(http_before, engine->stats());
  if (http_first) engine_wall = run_engine();
  server.shutdown(5);

  Report e = collect(engine_samples, engine_wall), h = collect(http_samples, http_wall);
  auto row = [](const Report& r) {
    return astrai::Json{{"wall_s", r.wall},
                        {"tokens", r.tokens},
                        {"tokens_per_s", static_cast<double>(r.tokens) / r.wall},
                        {"requests_per_s", static_cast<double>(r.e2e.size()) / r.wall},
                        {"ttft_p50_ms", pct(r.ttft, 0.5) * 1e3},
                        {"ttft_p99_ms", pct(r.ttft, 0.99) * 1e3},
                        {"itl_p50_ms", pct(r.itl, 0.5) * 1e3},
                        {"itl_p99_ms", pct(r.itl, 0.99) * 1e3},
                        {"e2e_p50_ms", pct(r.e2e, 0.5) * 1e3}};
  };
  astrai::Json out = {{"clients", clients}, {"requests", requests}, {"prompt_tokens", prompt_range},
                      {"output_tokens", output_range}, {"compute_threads", astrai::num_threads()},
                      {"engine_api", row(e)}, {"http", row(h)}};
  out["engine_api"]["engine_thread"] = engine_time;
  out["http"]["engine_thread"] = http_time;
  if (json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("%d clients, %d requests, prompt %s tokens, output %s tokens, %d compute threads\n", clients, requests,
              prompt_range.c_str(), output_range.c_str(), astrai::num_threads());
  std::printf("%-10s %10s %12s %12s %12s %12s %12s %12s\n", "path", "tok/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms",
              "ITL p99 ms", "e2e p50 ms", "tokens");
  for (const char* k : {"engine_api", "http"}) {
    const auto& r = out[k];
    std::printf("%-10s %10.1f %12.1f %12.1f %12.2f %12.2f %12.1f %12lld\n", k, r["tokens_per_s"].get<double>(),
                r["ttft_p50_ms"].get<double>(), r["ttft_p99_ms"].get<double>(), r["itl_p50_ms"].get<double>(),
                r["itl_p99_ms"].get<double>(), r["e2e_p50_ms"].get<double>(), r["tokens"].get<long long>());
  }
  for (const char* k : {"engine_api", "http"}) std::printf("%-10s engine thread: %s\n", k, out[k]["engine_thread"].dump().c_str());
  double overhead = 1.0 - out["http"]["tokens_per_s"].get<double>() / out["engine_api"]["tokens_per_s"].get<double>();
  std::printf("server throughput overhead: %.1f%%\n", overhead * 100);
  return 0;
}
