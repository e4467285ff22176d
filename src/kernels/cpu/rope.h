// Rotary position embedding, forward and backward. The frequencies (and any scaling)
// are the model's business; this file fills cos/sin tables for given inverse frequencies
// and rotates heads in place.
#pragma once

#include <cstdint>

#include "kernels/rope_pairing.h"

namespace astrai::kernels {

// cos/sin[i, f] for token i (position positions[i]) and frequency f < half:
// angle = positions[i] * inv_freq[f], rounded to f32 first when f32_angle (what Hugging Face
// computes) or kept in double (the reference AstrAI's float64 table); cos/sin of that angle
// rounded to f32. Tables are [n, half].
void rope_sincos(const double* inv_freq, int64_t half, const int32_t* positions, int64_t n, bool f32_angle,
                 float* cos, float* sin);

// Rotates dims [rot_offset, rot_offset + 2 * half) of every head of x[tokens, heads, head_stride]
// in place, token i by cos/sin row i, features paired as `pairing` says. inverse rotates by the
// negated angle: the transpose, which is the backward (the rotation is linear in x).
void rope_rotate(float* x, int64_t tokens, int64_t heads, int64_t head_stride, int64_t rot_offset, int64_t half,
                 const float* cos, const float* sin, RopePairing pairing, bool inverse = false);

}  // namespace astrai::kernels
