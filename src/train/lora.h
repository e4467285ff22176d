// LoRA training (Hu et al. 2021): the base model is frozen (train/model.h: no gradient
// buffer, its weights read where they lie, an f32 checkpoint memory-mapped) and every adapted
// projection gains out += s·B·A·dropout(x) in the layers themselves (model/layer.h's
// ProjectionLora), s = alpha / r. The backward forms the factors' gradients and the
// activations' only. B is kept pre-scaled (B̃ = s·B, rebuilt by refresh() after each update),
// so the layers add u·B̃ᵀ and accumulate dL/dB̃; finish_grads() turns that into dL/dB = s·dL/dB̃.
// A starts as PEFT's default (uniform ±1/√in, seeded), B at zero, so the first forward is the
// base model's, bit for bit. Adapters are saved in the PEFT layout (model/lora.h reads them
// back, merges them, and `--lora DIR` loads them for inference).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/layer.h"
#include "train/model.h"
#include "train/params.h"

namespace astrai::train {

struct LoraOptions {
  int64_t rank = 0;  // 0: no LoRA (full fine-tuning)
  double alpha = 16;
  double dropout = 0;  // on each adapter's input, in training forwards only
  std::vector<std::string> targets = {"q", "k", "v", "o", "gate", "up", "down"};
};

// "q,k,v" -> {"q", "k", "v"}; every name must be one of q k v o gate up down (an error names it).
std::vector<std::string> parse_lora_targets(const std::string& list);

class LoraAdapters {
 public:
  // Adapters for every projection of `base` whose module is in options.targets. `base` must
  // outlive them (the merged weights read its memory). Errors when a target matches nothing.
  LoraAdapters(const TrainModel& base, const LoraOptions& options, uint64_t seed);

  double scale() const { return options_.alpha / static_cast<double>(options_.rank); }
  const std::vector<ParamSpec>& specs() const { return specs_; }  // lora_A / lora_B in buffer order
  FloatBuffer& params() { return params_; }
  FloatBuffer& grads() { return grads_; }
  size_t num_params() const { return params_.size(); }

  // The per-layer adapters to give TrainModel::set_adapters.
  std::vector<model::LayerLora> layer_adapters() const;
  void zero_grads();
  // After the backward of every micro-batch: dL/dB = s·dL/dB̃ in grads() (of layer `layer`'s
  // adapters only when >= 0: the overlapped all-reduce finishes a layer at a time).
  void finish_grads(int64_t layer = -1);
  // After params() changed (an update, a load): B̃ = s·B, and the merged weights if any.
  void refresh();

  // The base's weights with W + s·B·A in place of each adapted projection (f32, owned by
  // these adapters and kept current by refresh()): what GRPO's engine generates with.
  std::map<std::string, Tensor> merged_weights();

  // DIR/adapter_model.safetensors + DIR/adapter_config.json (PEFT layout; base_model, when
  // given, as base_model_name_or_path).
  void save(const std::string& dir, const std::string& base_model = "") const;
  // Reads factors saved by save() (resume) through model::load_lora; rank, alpha and the
  // adapted projections must match. Call refresh() after.
  void load(const std::string& dir);

 private:
  struct Target {
    int64_t layer, projection;  // kLoraProjections index
    int64_t out, in;
    size_t a_offset, b_offset;  // into params_/grads_/scaled_b_
    Tensor base;                // the frozen weight [out, in] (any float dtype)
    std::string module;         // e.g. model.layers.0.self_attn.q_proj
  };
  void merge();

  LoraOptions options_;
  int64_t num_layers_;
  std::map<std::string, Tensor> base_weights_;
  std::vector<Target> targets_;
  std::vector<ParamSpec> specs_;
  FloatBuffer params_, grads_, scaled_b_;
  FloatBuffer merged_;  // allocated by merged_weights()
  std::vector<size_t> merged_offsets_;
};

}  // namespace astrai::train
