// Bridges between the trainer and the model layer: inference views over the trainer's live
// parameters and HF checkpoints of them.
#pragma once

#include "model/config.h"
#include "model/safetensors.h"
#include "model/transformer.h"
#include "model/weights.h"
#include "train/model.h"

namespace astrai::train {

// ModelWeights over views of the trainer's weights (TrainModel::weights(), or LoRA's merged
// weights; no copy): a Transformer built on them sees every optimizer update (GRPO rollouts
// on live weights). The views keep the memory alive.
model::ModelWeights live_weights(const model::TensorMap& weights, const model::ModelConfig& config);

// Writes DIR/config.json + DIR/model.safetensors (f32) of the current parameters, loadable
// by model::load_checkpoint and every `astrai` command.
void save_hf_weights(const std::string& dir, const TrainModel& model, const model::ModelConfig& config);

}  // namespace astrai::train
