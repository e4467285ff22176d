#include "base/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace astrai {
namespace {

LogLevel level_from_env() {
  const char* env = std::getenv("ASTRAI_LOG");
  if (env == nullptr) return LogLevel::kInfo;
  if (std::strcmp(env, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(env, "warn") == 0) return LogLevel::kWarn;
  if (std::strcmp(env, "error") == 0) return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<LogLevel>& level_ref() {
  static std::atomic<LogLevel> level{level_from_env()};
  return level;
}

}  // namespace

LogLevel log_level() { return level_ref().load(std::memory_order_relaxed); }
void set_log_level(LogLevel level) { level_ref().store(level); }

void log_line(LogLevel level, std::string_view message) {
  static std::mutex mutex;
  static const char* kNames[] = {"debug", "info", "warn", "error"};
  const auto now = std::chrono::system_clock::now();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  std::lock_guard lock(mutex);
  std::fprintf(stderr, "[%lld.%03lld %s] %.*s\n", static_cast<long long>(ms / 1000),
               static_cast<long long>(ms % 1000), kNames[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace astrai
