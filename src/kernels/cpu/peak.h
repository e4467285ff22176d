// The arithmetic ceilings of this CPU for the kernel level in use, measured the way the copy
// probe measures memory: each thread runs independent chains of one instruction held in
// registers (no loads, no stores), so the rate is what the cores can issue. Benchmarks print a
// kernel's rate as a share of it (docs/performance.md, "Against llama.cpp").
//   f32:  the fused multiply-add of the level's widest vector (2 flops a lane);
//   int8: the 8-bit dot product the quantized products are built from (2 ops per multiply-add):
//         VNNI's vpdpbusd where the level uses it (kernels::vnni_in_use()), else AVX2's
//         vpmaddubsw + vpmaddwd + vpaddd, neon's sdot; none for neon without it;
//   bf16: AVX512_BF16's vdpbf16ps, which the bf16-dot mode runs (v4, where bf16_dot_native()).
#pragma once

#include <cstdint>
#include <string>

namespace astrai::kernels {

// One loop of a level: `run(iters, check)` runs `iters` iterations on each of `chains` chains
// of `lanes` lanes, returns the operations done and adds every lane's final value into *check,
// so no chain can be optimized away. What they compute, for the tests: an f32 chain c starts at
// peak_f32_start(c) and runs a = a + kPeakF32X * kPeakF32Y, rounded once (every level's f32
// instruction is a fused multiply-add; the chain is the addend, as FMLA and vfmadd231ps
// accumulate in place);
// an 8-bit (or bf16) chain c starts at c and each iteration adds `per_iter` to every lane (its
// `per_iter` products of 1 x 1 in each lane).
struct PeakLoop {
  double (*run)(int64_t iters, double* check) = nullptr;  // null: the level has no such loop
  const char* instruction = "";                           // e.g. "vfmadd231ps zmm"
  int chains = 0, lanes = 0, per_iter = 0;
};

struct PeakLoops {
  PeakLoop f32;
  PeakLoop int8;       // the 8-bit product without the VNNI extension
  PeakLoop int8_vnni;  // with it (where the CPU has it: kernels::vnni_in_use())
  PeakLoop bf16_dot;   // vdpbf16ps (v4 only; run where kernels::bf16_dot_native())
};

constexpr float kPeakF32X = 0.999999f, kPeakF32Y = 1e-3f;
inline float peak_f32_start(int chain) { return 1.0f + 0.125f * static_cast<float>(chain); }

struct PeakRates {
  double f32_flops = 0;  // per second, all threads together
  double int8_ops = 0;   // per second; 0 where the level has no 8-bit product
  double bf16_flops = 0;  // per second; 0 where the level does not run vdpbf16ps
  std::string f32_instruction, int8_instruction, bf16_instruction;
  int threads = 0;
};

// The loops on `threads` OpenMP threads at once, each timed for about `seconds` (best of three
// runs) on the active level.
PeakRates peak_rates(int threads, double seconds = 0.1);

// "f32 FMA 475 GFLOP/s (vfmadd231ps zmm), int8 dot 1918 GOP/s (vpdpbusd zmm), bf16 dot 950
// GFLOP/s (vdpbf16ps zmm), 2 threads".
std::string peak_summary(const PeakRates& p);

}  // namespace astrai::kernels
