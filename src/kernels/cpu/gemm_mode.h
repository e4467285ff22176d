// Process-wide choice between the batch-invariant linear kernel and the BLAS.
//
// On (the default): kernels::linear reduces every output over K in one fixed order for every M
// (see matmul.cc), so a row's result never depends on the batch it was computed in. The
// inference engine relies on this (greedy output identical alone, batched or chunked).
// Off: rows beyond a few per call go through cblas_sgemm, whose blocking and kernels change
// with the shape; results may differ in the last bits between batch shapes. Small M (decode)
// always uses our own kernel, which streams the weights faster than the BLAS GEMV.
#pragma once

namespace astrai::kernels {

void set_batch_invariant(bool on);
bool batch_invariant();

// What quantized weights (Q8_0, Q4_0, Q4_K, Q6_K) multiply, process-wide:
//   kF32: the f32 activations, each weight widened exactly (the weights' exact product);
//   kQ8:  the activations quantized to 8 bits per block, integer dot products (as llama.cpp
//         computes; kernels/cpu/linear_int8.h defines the arithmetic).
// Both are batch-invariant and give the same bits on every CPU level; they differ from each
// other by the activations' rounding. The first call reads ASTRAI_ACTIVATIONS (f32|q8); the
// default is q8 on x86-64 (the faster there), f32 on AArch64 (no NEON integer kernel yet).
enum class Activations { kF32, kQ8 };
void set_activations(Activations a);
Activations activations();
// "f32" or "q8" to the enum; throws astrai::Error for anything else.
Activations parse_activations(const char* name);
const char* activations_name(Activations a);

// Whether bf16 weights multiply the activations rounded to bf16, with VDPBF16PS's arithmetic
// (kernels/cpu/linear_bf16.h: pairs of exact products per f32 lane, denormals flushed), as
// llama.cpp does on CPUs with AVX512_BF16, about twice the products per instruction of the
// default; off by default: bf16 weights are widened exactly and multiply the f32 activations.
// Batch-invariant and the same bits on every level either way (emulated where the CPU lacks
// AVX512_BF16, slower than the default there). The first call reads ASTRAI_BF16_DOT (0|1).
void set_bf16_dot(bool on);
bool bf16_dot();
// Whether the level in use computes that mode with VDPBF16PS on this CPU (false: emulated).
bool bf16_dot_native();
// The mode as reported: "off", "vdpbf16ps" or "emulated".
const char* bf16_dot_name();

// Whether the integer kernels (kQ8) use the CPU's 8-bit dot-product instructions where the level
// in use and this CPU have them: VNNI's vpdpbusd (AVX-VNNI under v3, AVX-512 VNNI under v4) or
// ARMv8.2's sdot under neon ("asimddp"; never under generic). On by default;
// ASTRAI_CPU_VNNI=0 (read on first use) or set_vnni(false) turns it off. The integer sums are
// exact either way, so this changes speed, never bits (the kernel tests compare both).
void set_vnni(bool on);
bool vnni_allowed();
// The feature the active level's integer kernels use now ("avx512_vnni", "avx_vnni", "asimddp"), or "".
const char* vnni_in_use();

}  // namespace astrai::kernels
