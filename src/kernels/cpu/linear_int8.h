// Quantized weights times 8-bit activations: y = x · W^T (+ bias) with integer block dot
// products, the arithmetic llama.cpp uses for its quantized formats (the q8 activation mode,
// kernels/cpu/gemm_mode.h). The definition, the same on every level:
//
// Activations. Each row of x is quantized per block of B elements (B = 32 for Q8_0 and Q4_0
// weights, 256 for the k-quants): amax = max |x|, inv = 127 / amax, d = amax / 127 (each one
// f32 rounding), q = x * inv rounded to nearest (ties to even), within [-127, 127]. A block with
// amax below 1e-30 is all zero (d = 0); one holding an infinity or a NaN gets d = NaN.
// Weights. Q8_0 q, Q4_0 nibble - 8, Q4_K nibble, Q5_K 5-bit value and Q6_K 6-bit value - 32
// (tensor/dtype.h).
// Products. Integer sums (exact) per weight block, then one sequential f32 chain per output:
//   Q8_0, Q4_0, per block b: I = sum q_w q_x; acc = fma(d_w * d_x, float(I), acc)
//   Q4_K, Q5_K, per super-block: A = sum_j sc_j * (sum over sub-block j of q_w q_x),
//                            B = sum_j m_j * (sum over sub-block j of q_x);
//                            acc = fma(d * d_x, float(A), acc); acc = fma(dmin * d_x, -float(B), acc)
//   Q6_K, per super-block:   A = sum_g sc_g * (sum over group g of (q_w - 32) q_x);
//                            acc = fma(d * d_x, float(A), acc)
// from acc = +0 in increasing block order, then y = acc + bias. The integer sums may be formed
// in any order (they are exact), so every level and every batch shape gives the same bits.
#pragma once

#include <cstdint>

#include "kernels/cpu/level.h"
#include "kernels/cpu/matmul.h"

ASTRAI_KERNELS_BEGIN

// w.dtype is Q8_0, Q4_0, Q4_K, Q5_K or Q6_K with whole blocks per row. Multithreaded like linear().
void linear_int8(const float* x, int64_t m, const WeightView& w, const float* bias, float* y);

// The products of several quantized matrices of x in one parallel job (x quantized once):
// every out's weights quantized, the same cols, and one block size for all (x is quantized in
// blocks of its weights' block_elems: 32 for Q8_0 and Q4_0, 256 for the k-quants).
void linear_int8_group(const float* x, int64_t m, const LinearOut* outs, int64_t n);

ASTRAI_KERNELS_END
