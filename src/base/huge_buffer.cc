#include "base/huge_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "base/error.h"

namespace astrai {

namespace {
constexpr size_t kHuge = size_t{2} << 20;
}

HugeBuffer::HugeBuffer(size_t floats) : floats_(floats) {
  if (floats == 0) return;
  mapped_ = (floats * sizeof(float) + kHuge - 1) / kHuge * kHuge;
  // Map one extra huge page so a 2 MiB-aligned start can be carved out, then trim.
  void* raw = ::mmap(nullptr, mapped_ + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) fail("cannot map ", mapped_, " bytes: ", std::strerror(errno));
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (base + kHuge - 1) / kHuge * kHuge;
  if (aligned > base) ::munmap(raw, aligned - base);
  const uintptr_t end = base + mapped_ + kHuge;
  if (end > aligned + mapped_) ::munmap(reinterpret_cast<void*>(aligned + mapped_), end - aligned - mapped_);
  data_ = reinterpret_cast<float*>(aligned);
  ::madvise(data_, mapped_, MADV_HUGEPAGE);  // advice only: ignored where THP is off
}

void HugeBuffer::prefault() {
  volatile char* p = reinterpret_cast<volatile char*>(data_);
  for (size_t off = 0; off < mapped_; off += 4096) p[off] = 0;  // zero already: the write only faults the page in
}

HugeBuffer::~HugeBuffer() { release(); }

HugeBuffer::HugeBuffer(HugeBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), floats_(std::exchange(o.floats_, 0)), mapped_(std::exchange(o.mapped_, 0)) {}

HugeBuffer& HugeBuffer::operator=(HugeBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    floats_ = std::exchange(o.floats_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
  }
  return *this;
}

void HugeBuffer::release() {
  if (data_ != nullptr) ::munmap(data_, mapped_);
  data_ = nullptr;
  floats_ = mapped_ = 0;
}

}  // namespace astrai
