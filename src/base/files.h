// Whole-file helpers. Writes are atomic: a temporary file in the same directory is
// fsynced and renamed over the target, so a crash never leaves a half-written file.
#pragma once

#include <string>
#include <string_view>

namespace astrai {

std::string read_file(const std::string& path);
void write_file_atomic(const std::string& path, std::string_view data);
bool file_exists(const std::string& path);

}  // namespace astrai
