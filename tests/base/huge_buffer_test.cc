#include "base/huge_buffer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace astrai {
namespace {

TEST(HugeBuffer, ZeroFilledAlignedAndMovable) {
  HugeBuffer a(3'000'001);  // not a whole number of 2 MiB units
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(a.size(), 3'000'001u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % (uintptr_t{2} << 20), 0u);
  for (size_t i = 0; i < a.size(); i += 4099) ASSERT_EQ(a.data()[i], 0.0f) << i;
  a.data()[a.size() - 1] = 7.0f;  // the last element is writable

  HugeBuffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.data()[b.size() - 1], 7.0f);
  HugeBuffer c(16);
  c = std::move(b);  // releases c's own mapping
  EXPECT_EQ(c.size(), 3'000'001u);
  EXPECT_EQ(HugeBuffer(0).data(), nullptr);
}

// Pages of [p, p + bytes) the kernel reports resident (mincore).
size_t resident_pages(const void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((bytes + page - 1) / page);
  if (::mincore(const_cast<void*>(p), bytes, v.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

TEST(HugeBuffer, PrefaultMakesEveryPageResidentAndKeepsZeros) {
  const size_t floats = 5'000'000;  // 20 MB, not a whole number of 2 MiB units
  const size_t bytes = floats * sizeof(float);
  const size_t pages = (bytes + ::sysconf(_SC_PAGESIZE) - 1) / ::sysconf(_SC_PAGESIZE);
  HugeBuffer a(floats);
  EXPECT_LT(resident_pages(a.data(), bytes), pages) << "a fresh mapping is not all resident";
  a.prefault();
  EXPECT_EQ(resident_pages(a.data(), bytes), pages);
  for (size_t i = 0; i < floats; i += 1021) ASSERT_EQ(a.data()[i], 0.0f) << i;
  HugeBuffer(0).prefault();  // nothing mapped: nothing to do
}

}  // namespace
}  // namespace astrai
