#include "dashboard/stop_signal.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace astrai::dashboard {

namespace {

std::atomic<int> g_received{0};
struct sigaction g_old_int {}, g_old_term {};

void on_signal(int sig) { g_received.store(sig); }

}  // namespace

StopSignal::StopSignal() {
  g_received.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

StopSignal::~StopSignal() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

int StopSignal::wait() {
  while (g_received.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return g_received.load();
}

int StopSignal::received() const { return g_received.load(); }

}  // namespace astrai::dashboard
