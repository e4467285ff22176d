// Rotary position embedding for training, forward and backward over a packed batch.
// Two pairings: kHalf rotates (i, i + rot/2) (HF rotate_half, Llama/Qwen/Mistral), kInterleaved
// rotates (2i, 2i + 1) (GPT-J, Meta's original Llama). The rotation is linear in x, so the
// backward is the same rotation with the angle negated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace astrai::kernels {

enum class RopePairing { kHalf, kInterleaved };

struct RopeScaling {
  std::string type;  // "" / "default", "linear", "llama3", "yarn"
  double factor = 1.0;
  double low_freq_factor = 1.0;    // llama3
  double high_freq_factor = 4.0;   // llama3
  double original_max_position = 8192;  // llama3, yarn
  double beta_fast = 32.0, beta_slow = 1.0;  // yarn
  double attention_factor = 0.0;   // yarn; 0 = 0.1·ln(factor) + 1
};

// inv_freq[i] for i < rot_dim/2 (HF `_compute_*_parameters`), and the factor that scales
// cos and sin (yarn's attention factor; 1 otherwise).
std::vector<float> rope_inv_freq(int64_t rot_dim, double theta, const RopeScaling& scaling,
                                 float* attention_scale);

// cos/sin tables [max_position + 1, rot_dim / 2], angles computed as HF does (f32 pos · inv_freq).
struct RopeTable {
  int64_t half = 0;
  std::vector<float> cos, sin;
  void build(const std::vector<float>& inv_freq, float attention_scale, int32_t max_position);
};

// Rotates the first rot_dim features of each head of x[tokens, heads, head_dim] in place by
// the position of its token; inverse = true applies the transpose (the backward).
void rope_apply(float* x, const int32_t* positions, int64_t tokens, int64_t heads,
                int64_t head_dim, int64_t rot_dim, RopePairing pairing, const RopeTable& table,
                bool inverse);

}  // namespace astrai::kernels
