#include "train/live_model.h"

namespace astrai::train {

model::ModelWeights live_weights(const model::TensorMap& weights, const model::ModelConfig& config) {
  return model::ModelWeights::from_tensors(config, weights, "trainer parameters");
}

void save_hf_weights(const std::string& dir, const TrainModel& m, const model::ModelConfig& config) {
  model::save_checkpoint(dir, config, live_weights(m.weights(), config), DType::kF32);
}

}  // namespace astrai::train
