// Minimal leveled logging to stderr; the level comes from ASTRAI_LOG (debug|info|warn|error).
#pragma once

#include <string_view>

#include "base/error.h"

namespace astrai {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_line(LogLevel level, std::string_view message);

template <typename... Args>
void log_debug(Args&&... args) {
  if (log_level() <= LogLevel::kDebug) log_line(LogLevel::kDebug, str_cat(std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(Args&&... args) {
  if (log_level() <= LogLevel::kInfo) log_line(LogLevel::kInfo, str_cat(std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(Args&&... args) {
  if (log_level() <= LogLevel::kWarn) log_line(LogLevel::kWarn, str_cat(std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(Args&&... args) {
  log_line(LogLevel::kError, str_cat(std::forward<Args>(args)...));
}

}  // namespace astrai
