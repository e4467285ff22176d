// Helpers shared by the data tests: a scratch directory removed at the end of each test.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "base/error.h"

namespace astrai::data::testing {

class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = std::string(::testing::TempDir()) + "astrai_data_XXXXXX";
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

}  // namespace astrai::data::testing
