// What the engine needs from a model and a tokenizer, as two small interfaces. The engine is
// built on these so it can be tested with deterministic fakes (tests/infer) and so model and
// tokenizer adapters stay in one file each (transformer_backend.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/sampling.h"
#include "infer/engine.h"
#include "infer/kv_storage.h"
#include "model/batch.h"
#include "model/forward_profile.h"

namespace astrai::infer {

struct ModelInfo {
  int32_t vocab_size = 0;
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t k_head_dim = 0;
  int32_t v_head_dim = 0;
  int32_t max_context = 0;          // max_position_embeddings
  std::vector<int32_t> eos_ids;     // from the model config
  DType weight_dtype = DType::kF32; // of the weight matrices: picks the KV cache dtype under "auto"
};

// A model on a device. make_kv_storage gives the KV cache's page memory on that device (the
// engine keeps it; the pool hands out its page ids); forward runs one pass over a packed ragged
// batch: writes the new tokens' K/V into their page slots, attends through the page tables, and
// writes vocab_size logits for every row in batch.logit_rows (in that order). Called from the
// engine thread only.
class ForwardBackend {
 public:
  virtual ~ForwardBackend() = default;
  virtual const ModelInfo& info() const = 0;
  virtual std::unique_ptr<KvStorage> make_kv_storage(const KvLayout& layout, int32_t pages) const = 0;
  virtual void forward(const model::Batch& batch, const KvStorage& kv, float* logits) = 0;
  // Sampling next to the logits (EngineOptions::sample_on), for a backend that offers it
  // (can_sample): forward with logits == nullptr leaves them in the backend's memory; then
  // copy_logits brings rows [first, first + count) of them to the host, and sample draws
  // tokens from rows of them (backend/sampling.h), so only the tokens leave the device.
  virtual bool can_sample() const { return false; }
  virtual void copy_logits(int64_t first, int64_t count, float* host) const;
  virtual void sample(const backend::SampleSpec* specs, int64_t n, backend::SampleResult* out) const;
  // Seconds per forward operation since construction (all zero if the model does not measure
  // them).
  virtual model::ForwardProfile profile() const { return {}; }
};

// Incremental detokenizer of one choice: raw bytes each token adds (may end inside a UTF-8
// character; the engine holds those bytes). Special tokens add nothing.
class TokenDecoder {
 public:
  virtual ~TokenDecoder() = default;
  virtual std::string push(int32_t id) = 0;
  // End of the choice: bytes still held by the decoder.
  virtual std::string flush() { return {}; }
};

// Text side of the engine; its const methods are called from any thread.
class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // Renders request.messages (+ tools, kwargs, add_generation_prompt) and tokenizes it.
  virtual std::vector<int32_t> encode_chat(const GenerationRequest& request) const = 0;
  // EOS and end-of-turn ids that end a choice (unless ignore_eos).
  virtual std::vector<int32_t> stop_ids() const = 0;
  virtual std::unique_ptr<TokenDecoder> decoder() const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
};

// Adapters to the real model::Transformer and tokenizer::Tokenizer (transformer_backend.cc).
std::unique_ptr<ForwardBackend> make_transformer_backend(std::shared_ptr<const model::Transformer> model);
std::unique_ptr<TextCodec> make_tokenizer_codec(std::shared_ptr<const tokenizer::Tokenizer> tokenizer);

}  // namespace astrai::infer
