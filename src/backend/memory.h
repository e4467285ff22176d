// Memory on a backend's device: a reusable scratch buffer, tensor storage, and copying a host
// tensor to the device.
#pragma once

#include <cstddef>
#include <memory>

#include "backend/ops.h"
#include "tensor/tensor.h"

namespace astrai::backend {

// Floats in a backend's memory that only grow (contents are not kept when they do), so a
// buffer reused for steps of similar size allocates nothing.
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  ~Buffer() { reset(); }

  // At least n floats on `ops`'s device (a buffer moves to another backend when asked).
  float* grow(const Ops& ops, size_t n);
  float* data() const { return data_; }
  size_t size() const { return size_; }
  void reset();

 private:
  const Ops* ops_ = nullptr;
  float* data_ = nullptr;
  size_t size_ = 0;
};

// `bytes` of storage on `ops`'s device, freed with the last Tensor that uses it.
std::shared_ptr<Storage> make_storage(const Ops& ops, size_t bytes);

// The tensor's bytes in `ops`'s memory: the tensor itself when it is already there.
Tensor to_backend(const Ops& ops, const Tensor& t);

}  // namespace astrai::backend
