// The parameters of a model, defined once: which tensors a config has, their Hugging Face
// names, shapes and kinds, in checkpoint order. Every holder of parameters is a ModelParams<T>
// over its own slot type (Tensor for loaded weights, float* for the trainer's parameters,
// gradients and optimizer moments), and every whole-model operation (load, save, copy, bind a
// flat buffer, decay groups) visits it with for_each_param (the idea of gemma.cpp's
// ForEachTensor).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "tensor/tensor.h"

namespace astrai::model {

enum class ParamKind {
  kEmbedding,  // [vocab, hidden]
  kMatrix,     // a projection [out, in]
  kNorm,       // an RMSNorm weight
  kBias,
};

// Slots of one layer; a slot the config lacks stays value-initialised (an undefined Tensor, a
// null pointer): biases (qkv_bias, o_bias, mlp_bias), qk-norm, the attention gate, MLA's or
// the plain k/v projections.
template <typename T>
struct LayerParams {
  T input_layernorm{};           // [hidden]
  T post_attention_layernorm{};  // [hidden]
  // GQA: q [heads * head_dim, hidden], k/v [kv_heads * head_dim, hidden].
  // MLA: q [heads * (nope + rope), hidden]; k/v come from kv_a_proj/kv_b_proj.
  T q_proj{}, k_proj{}, v_proj{}, o_proj{};  // o [hidden, heads * v_dim]
  T q_bias{}, k_bias{}, v_bias{}, o_bias{};
  T q_norm{}, k_norm{};  // [head_dim] (qk-norm)
  T gate{};              // [heads * v_dim, hidden] (gated attention)
  T kv_a_proj{};         // MLA [kv_lora_rank, hidden]
  T kv_norm{};           // MLA [kv_lora_rank]
  T kv_b_proj{};         // MLA [kv_heads * (nope + rope + v), kv_lora_rank], per head (k_nope, k_rope, v)
  T gate_proj{}, up_proj{};  // [intermediate, hidden]
  T down_proj{};             // [hidden, intermediate]
  T gate_proj_bias{}, up_proj_bias{}, down_proj_bias{};
};

template <typename T>
struct ModelParams {
  T embed_tokens{};  // [vocab, hidden]
  std::vector<LayerParams<T>> layers;
  T norm{};     // [hidden]
  T lm_head{};  // [vocab, hidden]; the same slot value as embed_tokens when tied
};

// What for_each_param tells the visitor about each parameter.
struct ParamInfo {
  std::string name;  // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  Shape shape;
  ParamKind kind;
};

// Calls f(const ParamInfo&, T& slot) for every parameter `c` has, in checkpoint order, after
// sizing p.layers to the config. A tied lm_head is not visited (it is embed_tokens).
template <typename T, typename F>
void for_each_param(const ModelConfig& c, ModelParams<T>& p, F&& f) {
  auto visit = [&](std::string name, Shape shape, ParamKind kind, T& slot) {
    f(ParamInfo{std::move(name), std::move(shape), kind}, slot);
  };
  const int64_t h = c.hidden_size, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t ff = c.intermediate_size;
  const auto M = ParamKind::kMatrix, N = ParamKind::kNorm, B = ParamKind::kBias;
  visit("model.embed_tokens.weight", {c.vocab_size, h}, ParamKind::kEmbedding, p.embed_tokens);
  p.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerParams<T>& l = p.layers[static_cast<size_t>(i)];
    const std::string pre = "model.layers." + std::to_string(i) + ".";
    const std::string a = pre + "self_attn.";
    visit(pre + "input_layernorm.weight", {h}, N, l.input_layernorm);
    if (c.is_mla()) {
      visit(a + "q_proj.weight", {nh * c.qk_head_dim(), h}, M, l.q_proj);
      visit(a + "kv_a_proj.weight", {c.kv_lora_rank, h}, M, l.kv_a_proj);
      visit(a + "kv_norm.weight", {c.kv_lora_rank}, N, l.kv_norm);
      visit(a + "kv_b_proj.weight", {nkv * (c.qk_head_dim() + c.v_dim()), c.kv_lora_rank}, M, l.kv_b_proj);
    } else {
      const int64_t hd = c.head_dim;
      visit(a + "q_proj.weight", {nh * hd, h}, M, l.q_proj);
      if (c.qkv_bias) visit(a + "q_proj.bias", {nh * hd}, B, l.q_bias);
      visit(a + "k_proj.weight", {nkv * hd, h}, M, l.k_proj);
      if (c.qkv_bias) visit(a + "k_proj.bias", {nkv * hd}, B, l.k_bias);
      visit(a + "v_proj.weight", {nkv * hd, h}, M, l.v_proj);
      if (c.qkv_bias) visit(a + "v_proj.bias", {nkv * hd}, B, l.v_bias);
      if (c.qk_norm) {
        visit(a + "q_norm.weight", {hd}, N, l.q_norm);
        visit(a + "k_norm.weight", {hd}, N, l.k_norm);
      }
    }
    if (c.gated_attention) visit(a + "gate.weight", {nh * c.v_dim(), h}, M, l.gate);
    visit(a + "o_proj.weight", {h, nh * c.v_dim()}, M, l.o_proj);
    if (c.o_bias) visit(a + "o_proj.bias", {h}, B, l.o_bias);
    visit(pre + "post_attention_layernorm.weight", {h}, N, l.post_attention_layernorm);
    visit(pre + "mlp.gate_proj.weight", {ff, h}, M, l.gate_proj);
    if (c.mlp_bias) visit(pre + "mlp.gate_proj.bias", {ff}, B, l.gate_proj_bias);
    visit(pre + "mlp.up_proj.weight", {ff, h}, M, l.up_proj);
    if (c.mlp_bias) visit(pre + "mlp.up_proj.bias", {ff}, B, l.up_proj_bias);
    visit(pre + "mlp.down_proj.weight", {h, ff}, M, l.down_proj);
    if (c.mlp_bias) visit(pre + "mlp.down_proj.bias", {h}, B, l.down_proj_bias);
  }
  visit("model.norm.weight", {h}, N, p.norm);
  if (!c.tie_word_embeddings) visit("lm_head.weight", {c.vocab_size, h}, M, p.lm_head);
}

// A ModelParams<U> whose every slot is f(info, the same slot of `src`), in checkpoint order; a
// tied lm_head is the embedding's (as in `src`).
template <typename U, typename T, typename F>
ModelParams<U> map_params(const ModelConfig& c, ModelParams<T>& src, F&& f) {
  std::vector<T*> slots;
  for_each_param(c, src, [&](const ParamInfo&, T& slot) { slots.push_back(&slot); });
  ModelParams<U> dst;
  size_t next = 0;
  for_each_param(c, dst, [&](const ParamInfo& info, U& slot) { slot = f(info, *slots[next++]); });
  if (c.tie_word_embeddings) dst.lm_head = dst.embed_tokens;
  return dst;
}

// The parameter list alone (names, shapes, kinds), in the same order.
inline std::vector<ParamInfo> param_infos(const ModelConfig& c) {
  ModelParams<char> dummy;
  std::vector<ParamInfo> out;
  for_each_param(c, dummy, [&](const ParamInfo& info, char&) { out.push_back(info); });
  return out;
}

}  // namespace astrai::model
