#include "backend/memory.h"

#include <algorithm>
#include <utility>

#include "base/error.h"

namespace astrai::backend {

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    ops_ = std::exchange(o.ops_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

float* Buffer::grow(const Ops& ops, size_t n) {
  if (ops_ == &ops && n <= size_) return data_;
  reset();
  data_ = static_cast<float*>(ops.alloc(std::max<size_t>(n, 1) * sizeof(float)));
  ops_ = &ops;
  size_ = std::max<size_t>(n, 1);
  return data_;
}

void Buffer::reset() {
  if (ops_ != nullptr) ops_->release(data_);
  ops_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

namespace {

class BackendStorage final : public Storage {
 public:
  BackendStorage(const Ops& ops, size_t bytes) : ops_(ops), data_(ops.alloc(bytes)), bytes_(bytes) {}
  ~BackendStorage() override { ops_.release(data_); }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }
  Device device() const override { return ops_.device(); }

 private:
  const Ops& ops_;
  void* data_;
  size_t bytes_;
};

}  // namespace

std::shared_ptr<Storage> make_storage(const Ops& ops, size_t bytes) {
  return std::make_shared<BackendStorage>(ops, bytes);
}

Tensor to_backend(const Ops& ops, const Tensor& t) {
  if (!t.defined() || t.device() == ops.device()) return t;
  ASTRAI_CHECK(t.device() == Device::kCpu, "to_backend: only host tensors can be copied to a device");
  Tensor out(make_storage(ops, t.nbytes()), 0, t.shape(), t.dtype());
  ops.to_device(out.raw(), t.raw(), t.nbytes());
  return out;
}

}  // namespace astrai::backend
