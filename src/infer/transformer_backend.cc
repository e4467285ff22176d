// Adapters from the real model and tokenizer to the engine's interfaces (infer/backend.h),
// and the Engine constructor that uses them.
#include <algorithm>

#include "base/error.h"
#include "infer/engine_impl.h"
#include "model/transformer.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace astrai::infer {
namespace {

class TransformerBackend : public ForwardBackend {
 public:
  explicit TransformerBackend(std::shared_ptr<const model::Transformer> model) : model_(std::move(model)) {
    const model::ModelConfig& c = model_->config();
    const model::PagedKv g = model_->kv_geometry();
    info_.vocab_size = static_cast<int32_t>(c.vocab_size);
    info_.num_layers = static_cast<int32_t>(c.num_hidden_layers);
    info_.num_kv_heads = g.num_kv_heads;
    info_.k_head_dim = g.k_head_dim;
    info_.v_head_dim = g.v_head_dim;
    info_.max_context = static_cast<int32_t>(std::min<int64_t>(c.context_length(), 1 << 30));
    info_.eos_ids = c.eos_token_ids;
    info_.weight_dtype = model_->weights().embed_tokens.dtype();
    ws_.profile.enabled = true;  // two clock reads per operation: microseconds per step
  }
  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<KvStorage> make_kv_storage(const KvLayout& layout, int32_t pages) const override {
    return make_backend_kv_storage(backend::ops_for(model_->device()), layout, pages);
  }
  void forward(const model::Batch& batch, const KvStorage& kv, float* logits) override {
    model_->forward(batch, &kv.paged_kv(), ws_, logits);
  }
  bool can_sample() const override { return true; }
  void copy_logits(int64_t first, int64_t count, float* host) const override {
    model_->copy_logits(ws_, first, count, host);
  }
  void sample(const backend::SampleSpec* specs, int64_t n, backend::SampleResult* out) const override {
    model_->sample(ws_, specs, n, out);
  }
  model::ForwardProfile profile() const override { return ws_.profile; }

 private:
  std::shared_ptr<const model::Transformer> model_;
  model::ForwardWorkspace ws_;
  ModelInfo info_;
};

class StreamTokenDecoder : public TokenDecoder {
 public:
  explicit StreamTokenDecoder(const tokenizer::Tokenizer& tok) : dec_(tok, /*skip_special_tokens=*/true) {}
  std::string push(int32_t id) override { return dec_.step(id); }
  std::string flush() override { return dec_.flush(); }

 private:
  tokenizer::StreamDecoder dec_;
};

class TokenizerCodec : public TextCodec {
 public:
  explicit TokenizerCodec(std::shared_ptr<const tokenizer::Tokenizer> tok) : tok_(std::move(tok)) {
    // EOS and the end-of-turn markers of the common chat formats: generation stops there.
    for (const auto& e : tok_->end_of_turn_tokens()) stops_.push_back(e.id);
    const std::string& source = tok_->chat_template();
    if (!source.empty()) {
      std::map<std::string, std::string> special;
      if (!tok_->bos_token().empty()) special["bos_token"] = tok_->bos_token();
      if (!tok_->eos_token().empty()) special["eos_token"] = tok_->eos_token();
      if (!tok_->pad_token().empty()) special["pad_token"] = tok_->pad_token();
      template_ = std::make_unique<tokenizer::ChatTemplate>(source, std::move(special));
    }
  }
  std::vector<int32_t> encode(const std::string& text) const override { return tok_->encode(text, true); }
  std::vector<int32_t> encode_chat(const GenerationRequest& r) const override {
    ASTRAI_CHECK(template_, "the tokenizer has no chat template; send a plain prompt instead of messages");
    const Json kwargs = r.template_kwargs.is_null() ? Json::object() : r.template_kwargs;
    const std::string text = template_->render(r.messages, r.tools, r.add_generation_prompt, kwargs);
    // The template already holds the special tokens (BOS etc.), as in HF apply_chat_template.
    return tok_->encode(text, false);
  }
  std::vector<int32_t> stop_ids() const override { return stops_; }
  std::unique_ptr<TokenDecoder> decoder() const override { return std::make_unique<StreamTokenDecoder>(*tok_); }
  std::string decode(const std::vector<int32_t>& ids) const override { return tok_->decode(ids, true); }

 private:
  std::shared_ptr<const tokenizer::Tokenizer> tok_;
  std::unique_ptr<tokenizer::ChatTemplate> template_;
  std::vector<int32_t> stops_;
};

}  // namespace

void ForwardBackend::copy_logits(int64_t, int64_t, float*) const {
  throw Error("this model keeps no logits on its device (ForwardBackend::can_sample is false)");
}

void ForwardBackend::sample(const backend::SampleSpec*, int64_t, backend::SampleResult*) const {
  throw Error("this model does not sample on its device (ForwardBackend::can_sample is false)");
}

std::unique_ptr<ForwardBackend> make_transformer_backend(std::shared_ptr<const model::Transformer> model) {
  ASTRAI_CHECK(model, "engine: no model");
  return std::make_unique<TransformerBackend>(std::move(model));
}

std::unique_ptr<TextCodec> make_tokenizer_codec(std::shared_ptr<const tokenizer::Tokenizer> tokenizer) {
  if (!tokenizer) return nullptr;
  return std::make_unique<TokenizerCodec>(std::move(tokenizer));
}

Engine::Engine(std::shared_ptr<const model::Transformer> model, std::shared_ptr<const tokenizer::Tokenizer> tokenizer,
               EngineOptions options)
    : impl_(std::make_unique<Impl>(make_transformer_backend(model), make_tokenizer_codec(tokenizer), options, model,
                                   tokenizer)) {}

}  // namespace astrai::infer
