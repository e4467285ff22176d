// The training model: owned f32 master parameters and gradients (one allocation each, see
// params.h), a forward that saves the activations the backward needs, and the backward. The
// layers are model/layer.h's, the same code the inference forward runs (so the training
// forward has its bits), over the backend's operations; this class owns the buffers, the
// embedding, the final norm and the LM head, and RoPE tables per packed document (dynamic NTK
// scaling rescales per document, as the inference forward does per sequence).
// With `recompute`, only each layer's input is kept and the rest is recomputed in the
// backward (one layer's activations live at a time).
// A frozen model (trainable = false) has no gradient buffer and may read its weights where
// they lie (view_weights: a memory-mapped f32 checkpoint, or another model's parameters).
// LoRA (train/lora.h) attaches adapters to a frozen model: the backward then forms the
// adapters' gradients and the activations' only, none of the base weights'.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/dropout_mask.h"
#include "backend/memory.h"
#include "backend/ops.h"
#include "model/config.h"
#include "model/layer.h"
#include "train/params.h"
#include "tensor/tensor.h"
#include "train/train_batch.h"

namespace astrai::train {

// The projections a LoRA adapter may sit on, in the order of their dropout seeds.
inline constexpr std::array<model::ProjectionLora model::LayerLora::*, 7> kLoraProjections = {
    &model::LayerLora::q,         &model::LayerLora::k,       &model::LayerLora::v,        &model::LayerLora::o,
    &model::LayerLora::gate_proj, &model::LayerLora::up_proj, &model::LayerLora::down_proj};

// The dropout seed of projection k (kLoraProjections order) of layer l for a forward's seed
// (tests/train/oracle_train.py draws the same masks).
inline uint64_t lora_dropout_seed(uint64_t seed, int64_t layer, int64_t k) {
  return backend::splitmix64(seed ^ static_cast<uint64_t>(layer * 8 + k));
}

class TrainModel {
 public:
  // trainable = false: a frozen model (reference policies, a LoRA base) with no gradient
  // buffer; its weights come from init_weights, load_weights, copy_parameters_from or
  // view_weights. `device`: where the parameters, gradients and activations live and the
  // operations run (backend::ops_for; view_weights and LoRA adapters are for the CPU only).
  explicit TrainModel(const model::ModelConfig& config, bool recompute = false, bool trainable = true,
                      Device device = Device::kCpu);
  TrainModel(const TrainModel&) = delete;
  TrainModel& operator=(const TrainModel&) = delete;

  const model::ModelConfig& config() const { return cfg_; }
  const backend::Ops& ops() const { return ops_; }
  Device device() const { return ops_.device(); }
  bool trainable() const { return trainable_; }
  const ParamLayout& layout() const { return layout_; }
  FloatBuffer& params() { return params_; }
  const FloatBuffer& params() const { return params_; }
  FloatBuffer& grads() { return grads_; }
  const FloatBuffer& grads() const { return grads_; }
  size_t num_params() const;  // distinct parameters (tied lm_head counted once)

  // GPT-2 style init: matrices and embeddings ~ N(0, std) from a seeded generator, norm
  // weights 1, biases 0. Deterministic for a seed.
  void init_weights(uint64_t seed, float std = 0.02f);
  // Copies named tensors (any dtype, HF names) into the parameters; every parameter must be
  // present with its exact shape.
  void load_weights(const std::map<std::string, Tensor>& tensors, const std::string& where);
  // A frozen copy (for DPO/GRPO reference policies): same config, parameters copied, no grads used.
  void copy_parameters_from(const TrainModel& other);
  // Frozen models only: reads the tensors in place (they stay alive with this model: a
  // memory-mapped checkpoint is not copied), f32 ones and bf16/f16 matrices; converts the
  // rest (bf16/f16 norms and biases) to f32 once, each into a buffer of its own. No buffer of
  // the whole model is allocated. Same checks as load_weights.
  void view_weights(const std::map<std::string, Tensor>& tensors, const std::string& where);
  // The parameters as named tensors: views that keep the memory alive (they see later
  // updates), or on a device a host copy taken now.
  std::map<std::string, Tensor> weights() const;

  // LoRA adapters per layer (model/layer.h; a, b, da, db and dropout set by the owner; this
  // model fills u, the scratch and the seeds). Empty: none.
  void set_adapters(std::vector<model::LayerLora> adapters, int64_t rank);
  // The dropout masks of the next forward (and its backward) derive from `seed`; with
  // training off (evaluation, reference scores) there is no dropout.
  void set_dropout_seed(uint64_t seed) { dropout_seed_ = seed; }
  void set_training(bool on) { training_ = on; }
  bool training() const { return training_; }

  // Runs the forward and returns logits [num_tokens, vocab] (in the device's memory), valid
  // until the next forward.
  float* forward(const TrainBatch& batch);
  // Accumulates d(loss)/d(params) into grads() (and the adapters' gradients) given dlogits
  // (may be the logits buffer).
  void backward(const TrainBatch& batch, float* dlogits);
  // Called by backward() as soon as a group of gradients is complete (the trainer starts their
  // all-reduce while the backward goes on): num_hidden_layers after the LM head and the final
  // norm, l after layer l (its parameters and adapters), -1 after the embedding (last; with
  // tied embeddings the LM head's gradient is the embedding's). Empty: none.
  void set_grad_hook(std::function<void(int64_t)> hook) { grad_hook_ = std::move(hook); }
  void zero_grads();

 private:
  void ensure_buffers(int64_t tokens);
  // RoPE tables and attention sequences of a batch.
  void prepare(const TrainBatch& batch);
  model::LayerInput layer_input(const TrainBatch& batch) const;
  // Points layer l's output at the next layer's input (or x_final_).
  model::LayerActs& acts_of(int64_t l);
  // The adapters of layer l for this forward (null without LoRA): seeds and dropout set.
  const model::LayerLora* lora_of(int64_t l);
  // p_ and view_ (each parameter f32 unless `dtypes` names it: a bf16/f16 matrix read in place).
  void bind_params(const ModelTensors& p, const std::map<std::string, DType>& dtypes = {});
  void bind_lora_acts(int64_t tokens);      // u of every adapter and their scratch
  float* owned_params();                    // params_, allocated on first use

  // The parameters, gradients and activations are buffers in the memory of ops_'s device.
  const backend::Ops& ops_;
  model::ModelConfig cfg_;
  bool recompute_;
  bool trainable_;
  ParamLayout layout_;
  FloatBuffer params_, grads_;
  std::map<std::string, Tensor> held_;  // view_weights: every parameter (in place or converted)
  ModelTensors p_, g_;                  // g_: null slots when frozen
  model::ModelParams<backend::Weight> view_;  // p_ as the backend reads it
  std::vector<double> inv_freq_;  // static scaling: computed once; dynamic: per document
  backend::Buffer rope_cos_, rope_sin_;     // per token [tokens, rope_dim / 2]
  std::vector<backend::SeqRange> seqs_;     // the batch's documents
  model::ForwardProfile profile_;           // off: the layers' clock marks cost nothing

  int64_t capacity_ = 0;  // tokens the activation buffers hold
  FloatBuffer acts_, scratch_;
  std::vector<model::LayerActs> layer_acts_;
  float *x_final_ = nullptr, *xf_ = nullptr, *rstd_f_ = nullptr, *logits_ = nullptr;
  float *kvb_ = nullptr;  // MLA: kv_b_proj output in the forward, its gradient in the backward
  float* d_res_ = nullptr;
  model::LayerGradScratch grad_scratch_;

  std::vector<model::LayerLora> lora_;  // per layer; empty without LoRA
  int64_t lora_rank_ = 0;
  FloatBuffer lora_acts_;  // u per adapter and the adapters' scratch
  std::vector<float> lora_dropout_;  // each adapter's dropout (in lora_ order: 7 per layer)
  uint64_t dropout_seed_ = 0;
  bool training_ = true;
  std::function<void(int64_t)> grad_hook_;
};

// A reference policy (DPO, GRPO) for `policy`: a frozen copy of its weights, or, when the
// policy is a frozen LoRA base, a view of that base (the adapters are the policy's own).
std::unique_ptr<TrainModel> make_reference(const TrainModel& policy);

// Evaluation forwards (no dropout) for the guard's lifetime, then the former mode again.
class EvalMode {
 public:
  explicit EvalMode(TrainModel& model) : model_(model), was_training_(model.training()) { model.set_training(false); }
  ~EvalMode() { model_.set_training(was_training_); }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  TrainModel& model_;
  bool was_training_;
};

}  // namespace astrai::train
