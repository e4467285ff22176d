// LoRA adapters in the PEFT layout, merged into a model's weights at load.
//
// An adapter directory holds adapter_config.json ("r", "lora_alpha", "target_modules",
// optional "use_rslora") and adapter_model.safetensors with, for each adapted projection,
//   base_model.model.<param>.lora_A.weight   [r, in]
//   base_model.model.<param>.lora_B.weight   [out, r]
// where <param> is the projection's name without ".weight" (e.g.
// model.layers.0.self_attn.q_proj). Merging replaces each adapted weight W [out, in] by
//   W + s·B·A,   s = lora_alpha / r   (rsLoRA: lora_alpha / sqrt(r)),
// computed in double and stored as an owned f32 tensor (other weights stay mapped). PEFT
// features that change the forward in other ways are rejected with a clear error: bias
// training ("bias" other than "none"), "modules_to_save", DoRA ("use_dora"), fan_in_fan_out.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "model/config.h"
#include "model/weights.h"
#include "tensor/tensor.h"

namespace astrai::model {

struct LoraAdapter {
  int64_t rank = 0;
  double alpha = 0;
  bool rslora = false;
  std::map<std::string, std::pair<Tensor, Tensor>> factors;  // weight name -> (A, B)

  double scale() const;
};

// Reads and validates an adapter directory (files, config fields, names, shapes, ranks).
LoraAdapter load_lora(const std::string& dir);

// dst = base + s·B·A for one [out, in] matrix (A [r, in], B [out, r]): each element's sum in
// double, rounded once. dst may be base. The one merge both inference (merge_lora) and LoRA
// training (train/lora.h) use, so both see the same bits.
void lora_merge_matrix(const float* base, const float* A, const float* B, int64_t out, int64_t in, int64_t r,
                       double s, float* dst);

// Merges the adapter into `weights`; every adapted name must be a weight of `config` with
// shape [out, in] matching B·A, else astrai::Error naming the tensor. Returns the number of
// weights merged.
int merge_lora(const ModelConfig& config, ModelWeights* weights, const LoraAdapter& adapter, const std::string& where);

}  // namespace astrai::model
