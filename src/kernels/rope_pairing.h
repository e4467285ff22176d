// Which features rotary position embedding rotates together: one type for the model config,
// every backend's kernels, inference and training.
#pragma once

namespace astrai::kernels {

// kHalf: pairs (f, f + rot/2) (Hugging Face rotate_half: Llama, Qwen, Mistral).
// kAdjacent: pairs (2f, 2f + 1) (GPT-J, Meta's original Llama, the reference AstrAI).
enum class RopePairing { kHalf, kAdjacent };

}  // namespace astrai::kernels
