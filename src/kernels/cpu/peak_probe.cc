// The timing of the arithmetic peak probe (peak.h): the active level's loops on every thread at
// once. Compiled once, for the baseline; the loops themselves are the level's (peak.cc).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/gemm_mode.h"
#include "kernels/cpu/peak.h"

namespace astrai::kernels {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Operations per second of `loop` on `threads` threads together: iterations doubled until one
// run takes about a third of `seconds`, then the best of three runs.
double rate(const PeakLoop& loop, int threads, double seconds) {
  int64_t iters = 1 << 12;
  double best = 0;
  int timed = 0;
  while (timed < 3) {
    double ops = 0, check = 0;  // the check is for the tests; here only written
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : ops, check)
    ops += loop.run(iters, &check);
    const double s = seconds_since(t0);
    if (s < seconds / 3 && iters < (int64_t{1} << 40)) {
      iters *= 2;
      continue;
    }
    best = std::max(best, ops / s);
    ++timed;
  }
  return best;
}

}  // namespace

PeakRates peak_rates(int threads, double seconds) {
  const PeakLoops& loops = kernel_table(active_isa()).peak;
  PeakRates p;
  p.threads = threads;
  p.f32_flops = rate(loops.f32, threads, seconds);
  p.f32_instruction = loops.f32.instruction;
  const PeakLoop& int8 = *vnni_in_use() && loops.int8_vnni.run ? loops.int8_vnni : loops.int8;
  if (int8.run) {
    p.int8_ops = rate(int8, threads, seconds);
    p.int8_instruction = int8.instruction;
  }
  if (loops.bf16_dot.run && bf16_dot_native()) {
    p.bf16_flops = rate(loops.bf16_dot, threads, seconds);
    p.bf16_instruction = loops.bf16_dot.instruction;
  }
  return p;
}

std::string peak_summary(const PeakRates& p) {
  char line[256];
  int n = std::snprintf(line, sizeof line, "f32 FMA %.0f GFLOP/s (%s)", p.f32_flops / 1e9, p.f32_instruction.c_str());
  if (p.int8_ops > 0)
    n += std::snprintf(line + n, sizeof line - static_cast<size_t>(n), ", int8 dot %.0f GOP/s (%s)", p.int8_ops / 1e9,
                       p.int8_instruction.c_str());
  if (p.bf16_flops > 0)
    n += std::snprintf(line + n, sizeof line - static_cast<size_t>(n), ", bf16 dot %.0f GFLOP/s (%s)",
                       p.bf16_flops / 1e9, p.bf16_instruction.c_str());
  std::snprintf(line + n, sizeof line - static_cast<size_t>(n), ", %d thread%s", p.threads, p.threads == 1 ? "" : "s");
  return line;
}

}  // namespace astrai::kernels
