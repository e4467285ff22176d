// Read-only memory-mapped file. Owns the mapping; movable, not copyable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace astrai {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps the whole file read-only; throws astrai::Error naming the path on failure.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace astrai
