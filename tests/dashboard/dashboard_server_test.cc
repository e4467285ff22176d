// The dashboard's HTTP API over a live metrics.jsonl: the page, the catalog, runs, records
// from an offset, records appended after start, a replaced file (new generation), errors.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "base/files.h"
#include "dashboard/dashboard_server.h"
#include "test_util.h"

namespace astrai::dashboard {
namespace {

using testing::append;
using testing::ScratchDir;

struct Reply {
  int status = 0;
  std::string body;
};

// One GET over a fresh connection (Connection: close), read to the end.
Reply http_get(int port, const std::string& target) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string req = "GET " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  EXPECT_EQ(::write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string raw;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) raw.append(buf, static_cast<size_t>(n));
  ::close(fd);
  Reply r;
  if (raw.size() > 12) r.status = std::stoi(raw.substr(9, 3));
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end != std::string::npos) r.body = raw.substr(head_end + 4);
  return r;
}

Json get_json(int port, const std::string& target) {
  const Reply r = http_get(port, target);
  EXPECT_EQ(r.status, 200) << target << ": " << r.body;
  return Json::parse(r.body);
}

// Polls /api/metrics until run 0 has `count` records (the reader thread's interval is 20 ms).
Json wait_for_records(int port, size_t count, const std::string& query) {
  for (int i = 0; i < 500; ++i) {
    Json m = get_json(port, "/api/metrics?run=0" + query);
    if (m["records"].size() >= count) return m;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "timed out waiting for " << count << " records";
  return Json();
}

TEST(DashboardServer, ServesThePageCatalogRunsAndRecords) {
  ScratchDir a, b;
  append(a.path("metrics.jsonl"), "{\"step\":1,\"loss\":2.5}\n{\"step\":2,\"loss\":2.25}\n{\"step\":3,\"lo");
  DashboardServer server({a.root(), b.root()}, {"127.0.0.1", 0, 0.02});
  server.start();
  const int port = server.port();
  ASSERT_GT(port, 0);
  EXPECT_EQ(server.url(), "http://127.0.0.1:" + std::to_string(port) + "/");

  const Reply page = http_get(port, "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("AstrAI training dashboard"), std::string::npos);
  EXPECT_EQ(get_json(port, "/api/panels")[0]["name"], "loss");

  const Json runs = get_json(port, "/api/runs")["runs"];
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0]["records"], 2);
  EXPECT_EQ(runs[0]["generation"], 1);
  EXPECT_EQ(runs[1]["exists"], false);  // not started yet

  Json m = get_json(port, "/api/metrics?run=0&from=0&generation=1");
  EXPECT_EQ(m["from"], 0);
  ASSERT_EQ(m["records"].size(), 2u);  // the partial third line is not served
  EXPECT_EQ(m["records"][1]["loss"], 2.25);

  // The rest of line 3 and a line 4 land; a client at 2 gets exactly those.
  append(a.path("metrics.jsonl"), "ss\":2.0}\n{\"step\":4,\"loss\":1.75}\n");
  m = wait_for_records(port, 2, "&from=2&generation=1");
  EXPECT_EQ(m["from"], 2);
  ASSERT_EQ(m["records"].size(), 2u);
  EXPECT_EQ(m["records"][0]["step"], 3);
  EXPECT_EQ(m["records"][1]["loss"], 1.75);

  // A new run in the directory replaces the file: a client of generation 1 gets everything anew.
  write_file_atomic(a.path("metrics.jsonl"), "{\"step\":1,\"loss\":9.0}\n");
  for (int i = 0; i < 500 && get_json(port, "/api/runs")["runs"][0]["generation"] != 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  m = get_json(port, "/api/metrics?run=0&from=4&generation=1");
  EXPECT_EQ(m["generation"], 2);
  EXPECT_EQ(m["from"], 0);
  ASSERT_EQ(m["records"].size(), 1u);
  EXPECT_EQ(m["records"][0]["loss"], 9.0);
  server.stop();
}

TEST(DashboardServer, ClearErrors) {
  ScratchDir a;
  DashboardServer server({a.root()}, {"127.0.0.1", 0, 0.05});
  server.start();
  EXPECT_EQ(http_get(server.port(), "/api/metrics?run=3").status, 404);
  EXPECT_EQ(http_get(server.port(), "/api/metrics?run=x").status, 400);
  EXPECT_EQ(http_get(server.port(), "/api/metrics").status, 400);
  EXPECT_EQ(http_get(server.port(), "/nothing").status, 404);
  // The port is taken: a second server fails with an error, not a crash.
  DashboardServer second({a.root()}, {"127.0.0.1", server.port(), 0.05});
  EXPECT_THROW(second.start(), Error);
}

}  // namespace
}  // namespace astrai::dashboard
