#include "train/params.h"

#include <cstdlib>
#include <cstring>

#include "base/error.h"

namespace astrai::train {

ParamLayout::ParamLayout(const Arch& a) {
  const int64_t D = a.hidden_size, I = a.intermediate_size;
  add("model.embed_tokens.weight", {a.vocab_size, D}, false, true);
  for (int64_t l = 0; l < a.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {D}, false);
    add(p + "self_attn.q_proj.weight", {a.q_dim(), D}, true);
    if (a.qkv_bias) add(p + "self_attn.q_proj.bias", {a.q_dim()}, false);
    add(p + "self_attn.k_proj.weight", {a.kv_dim(), D}, true);
    if (a.qkv_bias) add(p + "self_attn.k_proj.bias", {a.kv_dim()}, false);
    add(p + "self_attn.v_proj.weight", {a.kv_dim(), D}, true);
    if (a.qkv_bias) add(p + "self_attn.v_proj.bias", {a.kv_dim()}, false);
    if (a.qk_norm) {
      add(p + "self_attn.q_norm.weight", {a.head_dim}, false);
      add(p + "self_attn.k_norm.weight", {a.head_dim}, false);
    }
    if (a.attn_gate) add(p + "self_attn.gate.weight", {a.q_dim(), D}, true);
    add(p + "self_attn.o_proj.weight", {D, a.q_dim()}, true);
    if (a.o_bias) add(p + "self_attn.o_proj.bias", {D}, false);
    add(p + "post_attention_layernorm.weight", {D}, false);
    add(p + "mlp.gate_proj.weight", {I, D}, true);
    add(p + "mlp.up_proj.weight", {I, D}, true);
    add(p + "mlp.down_proj.weight", {D, I}, true);
  }
  add("model.norm.weight", {D}, false);
  if (!a.tie_embeddings) add("lm_head.weight", {a.vocab_size, D}, true);
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

ModelTensors bind_tensors(const Arch& a, const ParamLayout& layout, float* base) {
  auto at = [&](const std::string& name) -> float* {
    const ParamSpec* s = layout.find(name);
    return s == nullptr ? nullptr : base + s->offset;
  };
  ModelTensors m;
  m.embed = at("model.embed_tokens.weight");
  m.final_norm = at("model.norm.weight");
  m.lm_head = a.tie_embeddings ? m.embed : at("lm_head.weight");
  for (int64_t l = 0; l < a.num_layers; ++l) {
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
    t.wo = at(p + "self_attn.o_proj.weight");
    t.bo = at(p + "self_attn.o_proj.bias");
    t.post_norm = at(p + "post_attention_layernorm.weight");
    t.w_gate = at(p + "mlp.gate_proj.weight");
    t.w_up = at(p + "mlp.up_proj.weight");
    t.w_down = at(p + "mlp.down_proj.weight");
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
