// Tensor storage, views and the f32 <-> bf16/f16 conversions.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "base/error.h"
#include "base/mapped_file.h"
#include "tensor/tensor.h"

namespace astrai {
namespace {

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kU8, DType::kBool}) {
    DType back;
    ASSERT_TRUE(dtype_from_name(dtype_name(t), &back));
    EXPECT_EQ(back, t);
  }
  DType x;
  EXPECT_FALSE(dtype_from_name("F8_E4M3", &x));
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
}

TEST(DType, F16ConvertsExactlyRepresentableValuesAndRounds) {
  for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f /* min normal */, 5.960464477539063e-08f /* min subnormal */})
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + std::ldexp(1.0f, -11))), 1.0f);  // tie to even
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11))), 1.0f + std::ldexp(1.0f, -9));
  // Every f16 bit pattern survives f16 -> f32 -> f16 (NaNs stay NaN).
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << h;
  }
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::empty({4, 3});
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor rows = t.slice_rows(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(rows.data<float>()[0], 3.0f);
  rows.data<float>()[0] = 42.0f;
  EXPECT_EQ(t.data<float>()[3], 42.0f);
  EXPECT_EQ(t.reshape({12}).data<float>()[3], 42.0f);
  EXPECT_THROW(t.reshape({5}), Error);
  EXPECT_THROW(t.slice_rows(2, 5), Error);
  Tensor c = t.clone();
  c.data<float>()[0] = -1.0f;
  EXPECT_EQ(t.data<float>()[0], 0.0f);
  Tensor h = t.to(DType::kF16).to(DType::kBF16).to(DType::kF32);
  EXPECT_EQ(h.data<float>()[5], 5.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(Tensor::empty({3}).raw()) % 64, 0u);
}

TEST(Tensor, MappedStorageBorrowsTheFile) {
  const std::string path = std::filesystem::temp_directory_path() / ("astrai_tensor_" + std::to_string(::getpid()));
  {
    std::ofstream out(path, std::ios::binary);
    const float v[4] = {1, 2, 3, 4};
    out.write(reinterpret_cast<const char*>(v), sizeof v);
  }
  auto file = std::make_shared<const MappedFile>(path);
  Tensor t(make_mapped_storage(file, 4, 8), 0, {2}, DType::kF32);
  file.reset();  // the storage keeps the mapping alive
  EXPECT_TRUE(t.is_mapped());
  EXPECT_EQ(t.data<float>()[0], 2.0f);
  EXPECT_EQ(t.data<float>()[1], 3.0f);
  EXPECT_FALSE(t.clone().is_mapped());
  auto f2 = std::make_shared<const MappedFile>(path);
  EXPECT_THROW(make_mapped_storage(f2, 8, 16), Error);
  EXPECT_THROW(make_mapped_storage(f2, SIZE_MAX, 2), Error);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace astrai
