// Rotary position embedding for training, forward and backward over a packed batch.
// Two pairings: kHalf rotates (i, i + rot/2) (HF rotate_half, Llama/Qwen/Mistral), kInterleaved
// rotates (2i, 2i + 1) (GPT-J, Meta's original Llama). The rotation is linear in x, so the
// backward is the same rotation with the angle negated.
#pragma once

#include <cstdint>
#include <vector>

namespace astrai::kernels {

enum class RopePairing { kHalf, kInterleaved };

// cos/sin rows [rows, rot_dim / 2], filled by the caller (the trainer: kernels::rope_sincos over
// model::rope_inv_freq_into, per document); rope_apply reads row positions[t] for token t.
struct RopeTable {
  int64_t half = 0;
  std::vector<float> cos, sin;
};

// Rotates the first rot_dim features of each head of x[tokens, heads, head_dim] in place by
// the position of its token; inverse = true applies the transpose (the backward).
void rope_apply(float* x, const int32_t* positions, int64_t tokens, int64_t heads,
                int64_t head_dim, int64_t rot_dim, RopePairing pairing, const RopeTable& table,
                bool inverse);

}  // namespace astrai::kernels
