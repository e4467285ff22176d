#include "train/live_model.h"

namespace astrai::train {

model::ModelWeights live_weights(const TrainModel& m, const model::ModelConfig& config) {
  const auto views = tensor_views(m.layout(), m.params());
  model::TensorMap map(views.begin(), views.end());
  return model::ModelWeights::from_tensors(config, map, "trainer parameters");
}

void save_hf_weights(const std::string& dir, const TrainModel& m, const model::ModelConfig& config) {
  model::save_checkpoint(dir, config, live_weights(m, config), DType::kF32);
}

}  // namespace astrai::train
