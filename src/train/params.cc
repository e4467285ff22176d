#include "train/params.h"

#include <cstdlib>
#include <cstring>

#include "base/error.h"

namespace astrai::train {

ParamLayout::ParamLayout(const model::ModelConfig& c) {
  for (const model::ParamInfo& info : model::param_infos(c)) {
    ParamSpec s;
    s.name = info.name;
    s.numel = static_cast<size_t>(shape_numel(info.shape));
    s.shape = info.shape;
    s.kind = info.kind;
    s.offset = total_;
    // Every tensor starts on a 64-byte boundary so SIMD loads of any tensor are aligned.
    total_ += (s.numel + 15) / 16 * 16;
    specs_.push_back(std::move(s));
  }
}

FloatBuffer::FloatBuffer(size_t n, const backend::Ops& ops) : size_(n), ops_(&ops) {
  const size_t floats = (std::max<size_t>(n, 1) + 15) / 16 * 16;  // whole 64-byte lines
  float* p = static_cast<float*>(ops.alloc(floats * sizeof(float)));  // fails with "out of memory ..."
  data_ = std::shared_ptr<float>(p, [o = &ops](float* q) { o->release(q); });
  ops.zero(p, floats);
}

FloatBuffer on_host(const FloatBuffer& buffer) {
  if (buffer.size() == 0 || buffer.device() == Device::kCpu) return buffer;
  FloatBuffer host(buffer.size());
  buffer.ops().to_host(host.data(), buffer.data(), buffer.size() * sizeof(float));
  return host;
}

ModelTensors bind_tensors(const model::ModelConfig& c, const ParamLayout& layout, float* base) {
  ModelTensors m;
  size_t i = 0;  // the layout lists the parameters in the schema's order
  model::for_each_param(c, m, [&](const model::ParamInfo& info, float*& slot) {
    const ParamSpec& s = layout.specs()[i++];
    ASTRAI_CHECK(s.name == info.name, "parameter layout does not match the config at \"", info.name, "\"");
    slot = base + s.offset;
  });
  if (c.tie_word_embeddings) m.lm_head = m.embed_tokens;
  return m;
}

namespace {
// Borrowed view of a FloatBuffer that keeps it alive.
class BufferStorage final : public Storage {
 public:
  BufferStorage(std::shared_ptr<float> p, size_t n, Device device) : p_(std::move(p)), n_(n), device_(device) {}
  void* data() override { return p_.get(); }
  size_t bytes() const override { return n_ * sizeof(float); }
  Device device() const override { return device_; }

 private:
  std::shared_ptr<float> p_;
  size_t n_;
  Device device_;
};
}  // namespace

Tensor buffer_view(const FloatBuffer& buffer, size_t offset, const Shape& shape) {
  ASTRAI_CHECK(offset + static_cast<size_t>(shape_numel(shape)) <= buffer.size(), "buffer_view out of range");
  return Tensor(std::make_shared<BufferStorage>(buffer.shared(), buffer.size(), buffer.device()), offset * sizeof(float), shape,
                DType::kF32);
}

Tensor buffer_view(const FloatBuffer& buffer) {
  return buffer_view(buffer, 0, {static_cast<int64_t>(buffer.size())});
}

std::map<std::string, Tensor> tensor_views(const ParamLayout& layout, const FloatBuffer& buffer) {
  auto storage = std::make_shared<BufferStorage>(buffer.shared(), buffer.size(), buffer.device());
  std::map<std::string, Tensor> out;
  for (const auto& s : layout.specs())
    out.emplace(s.name, Tensor(storage, s.offset * sizeof(float), s.shape, DType::kF32));
  return out;
}

}  // namespace astrai::train
