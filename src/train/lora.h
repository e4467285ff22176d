// LoRA training (Hu et al. 2021) by gradient projection: the trainer's parameter buffer holds
// the merged weights W' = W + s·B·A of every adapted projection, so the forward and backward
// run unchanged (the same layers, the same bits as inference on the merged model), and the
// full gradient G = dL/dW' the backward accumulates is projected onto the factors:
//   dL/dA = s·Bᵀ·G,   dL/dB = s·G·Aᵀ      (s = alpha / r)
// which is exactly the gradient of the unmerged forward x·Wᵀ + s·(x·Aᵀ)·Bᵀ. Only A and B are
// optimized (AdamW moments for the factors alone); after each update W' is rebuilt from the
// frozen base W, kept for the adapted projections only. A starts as PEFT's default
// (uniform ±1/√in, seeded), B at zero, so the first forward is the base model's.
// Adapters are saved in the PEFT layout (model/lora.h reads them back, merges them, and
// `--lora DIR` loads them for inference). Dropout on the adapter input is not supported: it
// has no merged form.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/model.h"
#include "train/params.h"

namespace astrai::train {

struct LoraOptions {
  int64_t rank = 0;  // 0: no LoRA (full fine-tuning)
  double alpha = 16;
  std::vector<std::string> targets = {"q", "k", "v", "o", "gate", "up", "down"};
};

// "q,k,v" -> {"q", "k", "v"}; every name must be one of q k v o gate up down (an error names it).
std::vector<std::string> parse_lora_targets(const std::string& list);

class LoraAdapters {
 public:
  // Adapters for every projection of `model` whose module is in options.targets; the current
  // weights of those projections become the frozen base. Errors when a target matches nothing.
  LoraAdapters(const TrainModel& model, const LoraOptions& options, uint64_t seed);

  double scale() const { return options_.alpha / static_cast<double>(options_.rank); }
  const std::vector<ParamSpec>& specs() const { return specs_; }  // lora_A / lora_B in buffer order
  FloatBuffer& params() { return params_; }
  FloatBuffer& grads() { return grads_; }
  size_t num_params() const { return params_.size(); }

  // W' = W + s·B·A for every adapted projection, into model.params().
  void merge_into(TrainModel& model) const;
  // grads() = the projection of model.grads() onto the factors (overwrites).
  void project_grads(const TrainModel& model);

  // DIR/adapter_model.safetensors + DIR/adapter_config.json (PEFT layout; base_model, when
  // given, as base_model_name_or_path).
  void save(const std::string& dir, const std::string& base_model = "") const;
  // Reads factors saved by save() (resume) through model::load_lora; rank, alpha and the
  // adapted projections must match.
  void load(const std::string& dir);

 private:
  struct Target {
    size_t weight_offset;  // into the model's buffers
    int64_t out, in;
    size_t a_offset, b_offset;  // into params_/grads_
    size_t base_offset;         // into base_
    std::string module;         // e.g. model.layers.0.self_attn.q_proj
  };
  LoraOptions options_;
  std::vector<Target> targets_;
  std::vector<ParamSpec> specs_;
  FloatBuffer params_, grads_;
  std::vector<float> base_;
};

}  // namespace astrai::train
