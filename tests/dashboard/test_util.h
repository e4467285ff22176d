// Helpers shared by the dashboard tests: a scratch directory, file appends, error messages.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/error.h"

namespace astrai::dashboard::testing {

class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = std::string(::testing::TempDir()) + "astrai_dashboard_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) fail("mkdtemp failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string path(const std::string& name) const { return path_ + "/" + name; }
  const std::string& root() const { return path_; }

 private:
  std::string path_;
};

inline void append(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::app | std::ios::binary);
  out << text;
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an astrai::Error";
  return "";
}

}  // namespace astrai::dashboard::testing
