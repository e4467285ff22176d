// Helpers shared by the unit tests of several layers: a scratch directory removed at the end of
// each test, and the message of the astrai::Error a call throws.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "base/error.h"

namespace astrai::testing_util {

class ScratchDir {
 public:
  // A fresh directory under gtest's temp dir, named PREFIX_XXXXXX.
  explicit ScratchDir(const std::string& prefix = "astrai_test") {
    std::string tmpl = std::string(::testing::TempDir()) + prefix + "_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) fail("mkdtemp failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string path(const std::string& name) const { return path_ + "/" + name; }
  const std::string& root() const { return path_; }

 private:
  std::string path_;
};

// Runs fn and returns the astrai::Error message it throws ("" and a test failure if none).
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

}  // namespace astrai::testing_util
