// The decoder-only transformer forward pass over a packed ragged batch (model/batch.h).
//
//   Transformer model = Transformer::load("path/to/hf_checkpoint");
//   Batch b; b.add_sequence({1, 2, 3}); b.add_sequence({4, 5});
//   ForwardWorkspace ws;                      // reused across steps: no allocation once warm
//   std::vector<float> logits(b.num_tokens() * model.config().vocab_size);
//   model.forward(b, nullptr, ws, logits.data());
//
// Semantics per family are in docs/model.md. Every row's result depends only on its own
// sequence (batch invariance): the same prompt alone, batched with others, or prefilled in
// chunks through the paged cache gives bit-identical logits.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/forward_profile.h"
#include "model/weights.h"

namespace astrai::model {

// Caller-owned scratch of the forward pass; buffers only grow, so a workspace reused for
// steps of similar size allocates nothing.
class ForwardWorkspace {
 public:
  ForwardWorkspace() = default;

  ForwardProfile profile;  // off unless enabled; accumulates per-operation time

 private:
  friend class Transformer;
  // In the model's backend memory.
  backend::Buffer x_, xn_, q_, k_, v_, attn_, gate_, mlp_gate_, mlp_up_, latent_, kvb_, out_rows_, logits_;
  backend::Buffer cos_, sin_;
  int64_t kept_rows_ = 0;  // rows of logits_ the last forward left there (logits == nullptr)
  std::vector<double> inv_freq_;
  std::vector<backend::SeqRange> seqs_;
};

class Transformer {
 public:
  // Validates that `weights` match `config` (shapes, dtypes). Weights are host tensors, mapped
  // or owned (any float dtype); on the CPU, f32 tensors are used in place (a trainer's updates
  // to them are seen by the next forward) and small vectors in other dtypes are converted once.
  // On another device (its backend must be in the program: backend::ops_for), every weight is
  // copied to that device's memory once.
  Transformer(ModelConfig config, ModelWeights weights, Device device = Device::kCpu);
  // Loads DIR/config.json + model.safetensors (or sharded index), memory-mapped or copied
  // into memory (model/weights.h), onto `device`; with `lora_dir`, a PEFT LoRA adapter is
  // merged into the weights first (model/lora.h).
  static Transformer load(const std::string& dir, WeightPlacement placement = WeightPlacement::kMapped,
                          Device device = Device::kCpu, const std::string& lora_dir = "");

  Device device() const { return ops_->device(); }
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  int64_t vocab_size() const { return config_.vocab_size; }
  int64_t num_parameters() const { return weights_.num_parameters(config_); }
  size_t weight_bytes() const { return weights_.bytes(config_); }
  size_t mapped_bytes() const { return mapped_bytes_; }

  // The PagedKv geometry this model needs (the engine allocates the pages):
  // num_kv_heads, k_head_dim, v_head_dim; page_size, element dtype and pointers are the caller's.
  PagedKv kv_geometry(int32_t page_size = 16, DType dtype = DType::kF32) const;
  // Bytes of K+V per token over all layers, with `dtype` elements.
  int64_t kv_bytes_per_token(DType dtype = DType::kF32) const;
  // Multiply-adds of the matrix products: per token through the layers (every 2-D weight but
  // the embedding and the LM head), and per row of logits (the LM head). Benchmarks turn
  // product times into rates against the arithmetic peak (kernels/cpu/peak.h).
  int64_t layer_macs_per_token() const;
  int64_t lm_head_macs_per_row() const { return config_.vocab_size * config_.hidden_size; }

  // Computes logits [rows, vocab] (host memory) where rows are batch.logit_rows (in that order)
  // or every token; with logits == nullptr they stay in the workspace, in the backend's memory
  // (copy_logits, sample). Without kv every sequence must have context_len == 0 and attends to its own new
  // tokens. With kv, each new token's K/V is written to its page slot for every layer, and
  // attention reads positions [0, context_len + j] through the sequence's page table.
  // Throws astrai::Error for an invalid batch (ids outside the vocabulary, short page tables,
  // ...). Not thread-safe per workspace; one Transformer may serve several workspaces.
  void forward(const Batch& batch, const PagedKv* kv, ForwardWorkspace& ws, float* logits) const;

  // After forward(..., ws, nullptr): rows [first, first + count) of its logits into host.
  void copy_logits(const ForwardWorkspace& ws, int64_t first, int64_t count, float* host) const;
  // After forward(..., ws, nullptr): a token drawn from each spec's row of its logits, by the
  // backend next to them (backend::Ops::sample).
  void sample(const ForwardWorkspace& ws, const backend::SampleSpec* specs, int64_t n,
              backend::SampleResult* out) const;

  // Throws astrai::Error describing the first problem of the batch, if any.
  void validate_batch(const Batch& batch, const PagedKv* kv) const;

 private:
  void rope_tables(const Batch& batch, ForwardWorkspace& ws) const;
  // What a recorded decode step holds fixed (Ops::run_cached's key): the batch's shape and the
  // address of every buffer, page and weight the step's operations use.
  uint64_t decode_step_key(const Batch& batch, const PagedKv& kv, const ForwardWorkspace& ws,
                           const float* logits) const;

  ModelConfig config_;
  ModelWeights weights_;
  const backend::Ops* ops_ = nullptr;  // the backend of the weights' device
  ModelParams<backend::Weight> view_;  // what the backend reads: weights_ with vectors in f32
  std::vector<Tensor> owned_;          // f32 copies of non-f32 vectors; device copies of weights
  size_t mapped_bytes_ = 0;
  uint64_t weights_key_ = 0;  // a hash of each parameter's address, dtype and shape in the backend
};

// The inverse RoPE frequencies [rope_dim / 2] this config uses for a sequence whose
// longest position so far is seq_len - 1 (only dynamic scaling depends on seq_len).
std::vector<double> rope_inv_freq(const ModelConfig& config, int64_t seq_len);
// The same into a reused vector (no allocation once sized).
void rope_inv_freq_into(const ModelConfig& config, int64_t seq_len, std::vector<double>& out);
// What the cos/sin tables are multiplied by: YaRN's attention factor, else 1.
float rope_attention_factor(const ModelConfig& config);

}  // namespace astrai::model
