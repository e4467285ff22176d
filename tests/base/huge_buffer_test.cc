#include "base/huge_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

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

}  // namespace
}  // namespace astrai
