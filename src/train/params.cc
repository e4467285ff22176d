#include "train/params.h"

#include <cstdlib>
#include <cstring>

#include "base/error.h"

namespace astrai::train {

ParamLayout::ParamLayout(const model::ModelConfig& c) {
  const int64_t D = c.hidden_size, I = c.intermediate_size, H = c.num_attention_heads,
                KV = c.num_key_value_heads, hd = c.head_dim, qkd = c.qk_head_dim(), vd = c.v_dim();
  add("model.embed_tokens.weight", {c.vocab_size, D}, false, true);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {D}, false);
    if (c.is_mla()) {
      add(p + "self_attn.q_proj.weight", {H * qkd, D}, true);
      add(p + "self_attn.kv_a_proj.weight", {c.kv_lora_rank, D}, true);
      add(p + "self_attn.kv_norm.weight", {c.kv_lora_rank}, false);
      add(p + "self_attn.kv_b_proj.weight", {KV * (qkd + vd), c.kv_lora_rank}, true);
    } else {
      add(p + "self_attn.q_proj.weight", {H * hd, D}, true);
      if (c.qkv_bias) add(p + "self_attn.q_proj.bias", {H * hd}, false);
      add(p + "self_attn.k_proj.weight", {KV * hd, D}, true);
      if (c.qkv_bias) add(p + "self_attn.k_proj.bias", {KV * hd}, false);
      add(p + "self_attn.v_proj.weight", {KV * hd, D}, true);
      if (c.qkv_bias) add(p + "self_attn.v_proj.bias", {KV * hd}, false);
      if (c.qk_norm) {
        add(p + "self_attn.q_norm.weight", {hd}, false);
        add(p + "self_attn.k_norm.weight", {hd}, false);
      }
    }
    if (c.gated_attention) add(p + "self_attn.gate.weight", {H * vd, D}, true);
    add(p + "self_attn.o_proj.weight", {D, H * vd}, true);
    if (c.o_bias) add(p + "self_attn.o_proj.bias", {D}, false);
    add(p + "post_attention_layernorm.weight", {D}, false);
    add(p + "mlp.gate_proj.weight", {I, D}, true);
    if (c.mlp_bias) add(p + "mlp.gate_proj.bias", {I}, false);
    add(p + "mlp.up_proj.weight", {I, D}, true);
    if (c.mlp_bias) add(p + "mlp.up_proj.bias", {I}, false);
    add(p + "mlp.down_proj.weight", {D, I}, true);
    if (c.mlp_bias) add(p + "mlp.down_proj.bias", {D}, false);
  }
  add("model.norm.weight", {D}, false);
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, D}, true);
}

size_t ParamLayout::add(const std::string& name, Shape shape, bool matrix, bool embedding) {
  ParamSpec s;
  s.name = name;
  s.numel = static_cast<size_t>(shape_numel(shape));
  s.shape = std::move(shape);
  s.offset = total_;
  s.is_matrix = matrix;
  s.is_embedding = embedding;
  // Every tensor starts on a 64-byte boundary so SIMD loads of any tensor are aligned.
  total_ += (s.numel + 15) / 16 * 16;
  index_[name] = specs_.size();
  specs_.push_back(std::move(s));
  return specs_.back().offset;
}

const ParamSpec* ParamLayout::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &specs_[it->second];
}

FloatBuffer::FloatBuffer(size_t n) : size_(n) {
  const size_t bytes = (std::max<size_t>(n, 1) * sizeof(float) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) fail("out of memory allocating ", bytes, " bytes for training buffers");
  std::memset(p, 0, bytes);
  data_ = std::shared_ptr<float>(static_cast<float*>(p), [](float* q) { std::free(q); });
}

ModelTensors bind_tensors(const model::ModelConfig& c, const ParamLayout& layout, float* base) {
  auto at = [&](const std::string& name) -> float* {
    const ParamSpec* s = layout.find(name);
    return s == nullptr ? nullptr : base + s->offset;
  };
  ModelTensors m;
  m.embed = at("model.embed_tokens.weight");
  m.final_norm = at("model.norm.weight");
  m.lm_head = c.tie_word_embeddings ? m.embed : at("lm_head.weight");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerTensors t;
    t.input_norm = at(p + "input_layernorm.weight");
    t.wq = at(p + "self_attn.q_proj.weight");
    t.bq = at(p + "self_attn.q_proj.bias");
    t.wk = at(p + "self_attn.k_proj.weight");
    t.bk = at(p + "self_attn.k_proj.bias");
    t.wv = at(p + "self_attn.v_proj.weight");
    t.bv = at(p + "self_attn.v_proj.bias");
    t.q_norm = at(p + "self_attn.q_norm.weight");
    t.k_norm = at(p + "self_attn.k_norm.weight");
    t.wgate_attn = at(p + "self_attn.gate.weight");
    t.w_kv_a = at(p + "self_attn.kv_a_proj.weight");
    t.kv_norm = at(p + "self_attn.kv_norm.weight");
    t.w_kv_b = at(p + "self_attn.kv_b_proj.weight");
    t.wo = at(p + "self_attn.o_proj.weight");
    t.bo = at(p + "self_attn.o_proj.bias");
    t.post_norm = at(p + "post_attention_layernorm.weight");
    t.w_gate = at(p + "mlp.gate_proj.weight");
    t.w_up = at(p + "mlp.up_proj.weight");
    t.w_down = at(p + "mlp.down_proj.weight");
    t.b_gate = at(p + "mlp.gate_proj.bias");
    t.b_up = at(p + "mlp.up_proj.bias");
    t.b_down = at(p + "mlp.down_proj.bias");
    m.layers.push_back(t);
  }
  return m;
}

namespace {
// Borrowed view of a FloatBuffer that keeps it alive.
class BufferStorage final : public Storage {
 public:
  explicit BufferStorage(std::shared_ptr<float> p, size_t n) : p_(std::move(p)), n_(n) {}
  void* data() override { return p_.get(); }
  size_t bytes() const override { return n_ * sizeof(float); }
  Device device() const override { return Device::kCpu; }

 private:
  std::shared_ptr<float> p_;
  size_t n_;
};
}  // namespace

std::map<std::string, Tensor> tensor_views(const ParamLayout& layout, const FloatBuffer& buffer) {
  auto storage = std::make_shared<BufferStorage>(buffer.shared(), buffer.size());
  std::map<std::string, Tensor> out;
  for (const auto& s : layout.specs())
    out.emplace(s.name, Tensor(storage, s.offset * sizeof(float), s.shape, DType::kF32));
  return out;
}

}  // namespace astrai::train
