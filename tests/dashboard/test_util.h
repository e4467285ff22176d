// Helpers shared by the dashboard tests: tests/scratch_dir.h's, and appending to a file.
#pragma once

#include <fstream>
#include <string>

#include "../scratch_dir.h"

namespace astrai::dashboard::testing {

struct ScratchDir : testing_util::ScratchDir {
  ScratchDir() : testing_util::ScratchDir("astrai_dashboard") {}
};
using testing_util::error_of;

inline void append(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::app | std::ios::binary);
  out << text;
}

}  // namespace astrai::dashboard::testing
