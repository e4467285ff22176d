// bf16 weights times the activations rounded to bf16: the arithmetic of AVX512_BF16's
// VDPBF16PS, which llama.cpp uses for bf16 weights on CPUs that have it (the bf16-dot mode,
// kernels/cpu/gemm_mode.h; off by default). The definition, the same on every level:
//
// Activations. Each x rounded to bf16 (nearest, ties to even: f32_to_bf16).
// Operands. A bf16 denormal (weight or activation) counts as a zero of its sign (DAZ).
// Products. K is cut into linear()'s blocks (kKb, kernels/cpu/linear_tile.h). For every output
// y[i, j] and block: 16 lane sums from +0; lane l takes the block's pairs (k, k + 1) for
// k = 32c + 2l, c = 0, 1, ... in increasing c (the K tail zero-padded):
//   a = fma(x[k + 1], w[k + 1], a); a = fma(x[k], w[k], a)
// each result, if denormal, flushed to a zero of its sign (FTZ). A product of two bf16 is
// exact in f32, so each step is one rounding of a + x w. The 16 lanes are then summed by
// linear()'s tree (lane i + i+8, then i+4, i+2, i+1), the blocks in order (s = p0, s + p1, ...),
// and y = s + bias[j].
//
// Where the CPU has AVX512_BF16 (v4) one VDPBF16PS computes a step of 16 lanes: Intel's manual
// defines the instruction so, and a check at first use compares it with the definition on fixed
// inputs (bf16_dot_native). Elsewhere the steps are emulated with f32 fused multiply-adds:
// the same bits, slower than the default mode's exact widening.
#pragma once

#include <cstdint>

#include "kernels/cpu/level.h"
#include "kernels/cpu/matmul.h"

ASTRAI_KERNELS_BEGIN

// w.dtype is BF16. Multithreaded like linear(); batch-invariant.
void linear_bf16_dot(const float* x, int64_t m, const WeightView& w, const float* bias, float* y);

// Whether this level computes linear_bf16_dot with VDPBF16PS on this CPU (v4 with AVX512_BF16
// whose results equal the definition); false: emulated.
bool bf16_dot_native();

ASTRAI_KERNELS_END
