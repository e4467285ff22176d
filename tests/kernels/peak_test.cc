// The arithmetic peak probe (kernels/cpu/peak.h) runs the work it counts: on every level this
// CPU runs, each loop's chains end where the same recurrence computed one lane at a time ends,
// and the operations it reports are its chains x lanes x iterations. A loop the compiler had
// folded, shortened or merged would end elsewhere. The rates themselves are not asserted on.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/peak.h"

namespace astrai::kernels {
namespace {

constexpr int64_t kIters = 1000;

// Sum over chains and lanes of where the f32 chains end, in the loops' order.
double f32_expected(const PeakLoop& loop) {
  double s = 0;
  for (int c = 0; c < loop.chains; ++c) {
    float a = peak_f32_start(c);
    for (int64_t i = 0; i < kIters; ++i) a = std::fma(kPeakF32X, kPeakF32Y, a);
    for (int l = 0; l < loop.lanes; ++l) s += a;
  }
  return s;
}

// The counting loops (8-bit, bf16): chain c from c, per_iter added each iteration.
double counted_expected(const PeakLoop& loop) {
  double s = 0;
  for (int c = 0; c < loop.chains; ++c) s += loop.lanes * (c + static_cast<double>(loop.per_iter) * kIters);
  return s;
}

void expect_counting_loop(const PeakLoop& loop, const char* level) {
  double check = 0;
  const double ops = loop.run(kIters, &check);
  EXPECT_EQ(check, counted_expected(loop)) << level << " " << loop.instruction;
  EXPECT_EQ(ops, 2.0 * loop.per_iter * loop.lanes * loop.chains * kIters) << level << " " << loop.instruction;
}

TEST(PeakProbe, EveryLevelsLoopsDoTheWorkTheyCount) {
  for (Isa isa : cpu_info().supported) {
    const std::string level(isa_name(isa));
    const PeakLoops& loops = kernel_table(isa).peak;
    ASSERT_NE(loops.f32.run, nullptr) << level;
    double check = 0;
    const double ops = loops.f32.run(kIters, &check);
    EXPECT_EQ(check, f32_expected(loops.f32)) << level;
    EXPECT_EQ(ops, 2.0 * loops.f32.lanes * loops.f32.chains * kIters) << level;
    if (loops.int8.run) expect_counting_loop(loops.int8, level.c_str());
    const char* feature = vnni_feature(isa);
    if (loops.int8_vnni.run && feature && cpu_has(feature)) expect_counting_loop(loops.int8_vnni, level.c_str());
    if (loops.bf16_dot.run && kernel_table(isa).bf16_dot_native()) expect_counting_loop(loops.bf16_dot, level.c_str());
  }
}

TEST(PeakProbe, RatesAndInstructionsOfTheActiveLevel) {
  const PeakRates p = peak_rates(1, 0.01);
  EXPECT_GT(p.f32_flops, 0);
  EXPECT_FALSE(p.f32_instruction.empty());
  EXPECT_EQ(p.int8_ops > 0, !p.int8_instruction.empty());
  const std::string summary = peak_summary(p);
  EXPECT_NE(summary.find(p.f32_instruction), std::string::npos) << summary;
  EXPECT_NE(summary.find("1 thread"), std::string::npos) << summary;
}

}  // namespace
}  // namespace astrai::kernels
