// Errors: every failure at an API edge (files, configs, requests) throws astrai::Error
// with what failed and why. Hot loops assume validated input and do not throw.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace astrai {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// str_cat("a", 1, 'b') == "a1b": builds messages without <format> (GCC 12 lacks it).
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(str_cat(std::forward<Args>(args)...));
}

}  // namespace astrai

// ASTRAI_CHECK(cond, message parts...): throws astrai::Error when cond is false.
#define ASTRAI_CHECK(cond, ...)            \
  do {                                     \
    if (!(cond)) ::astrai::fail(__VA_ARGS__); \
  } while (0)
