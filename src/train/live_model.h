// Bridges between the trainer and the model layer: the trainer's Arch from a
// model::ModelConfig, and inference views over the trainer's live parameters.
#pragma once

#include "model/config.h"
#include "model/transformer.h"
#include "model/weights.h"
#include "train/arch.h"
#include "train/model.h"

namespace astrai::train {

// Rejects what the training backward does not implement (MLA, mlp_bias, dynamic RoPE scaling).
Arch arch_from_model_config(const model::ModelConfig& config);

// ModelWeights whose tensors are views of the trainer's parameter buffer (no copy): a
// Transformer built on them sees every optimizer update (GRPO rollouts on live weights).
// The views keep the buffer alive.
model::ModelWeights live_weights(const TrainModel& model, const model::ModelConfig& config);

// Writes DIR/config.json + DIR/model.safetensors (f32) of the current parameters, loadable
// by model::load_checkpoint and every `astrai` command.
void save_hf_weights(const std::string& dir, const TrainModel& model, const model::ModelConfig& config);

}  // namespace astrai::train
