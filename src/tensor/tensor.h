// Tensor: a dtype, a shape, a device and a view into shared storage. Storage is either
// owned (64-byte aligned host memory) or borrowed from a memory-mapped file, which the
// storage keeps alive. Tensors are contiguous, row-major. Copying a Tensor shares storage.
//
// Devices: every tensor names its device; kernels dispatch on it. Only kCpu has an
// implementation today; a CUDA storage slots in behind the same interface.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace astrai {

class MappedFile;

enum class Device : uint8_t { kCpu, kCuda };

// "cpu" or "cuda", as --device spells them.
inline const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

class Storage {
 public:
  virtual ~Storage() = default;
  virtual void* data() = 0;
  virtual size_t bytes() const = 0;
  virtual Device device() const = 0;
  virtual bool is_mapped() const { return false; }
};

// Owned, zero-initialised, 64-byte aligned host memory.
std::shared_ptr<Storage> make_host_storage(size_t bytes);
// Read-only bytes [offset, offset + bytes) of a mapped file; keeps the mapping alive.
std::shared_ptr<Storage> make_mapped_storage(std::shared_ptr<const MappedFile> file, size_t offset, size_t bytes);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);  // "[2, 3]"
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, Shape shape, DType dtype);

  static Tensor empty(Shape shape, DType dtype = DType::kF32);  // zero-filled host tensor
  static Tensor zeros(Shape shape, DType dtype = DType::kF32) { return empty(std::move(shape), dtype); }

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::kCpu; }
  bool is_mapped() const { return storage_ && storage_->is_mapped(); }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + ndim() : i]; }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return dtype_bytes(dtype_, numel()); }

  void* raw() const { return static_cast<uint8_t*>(storage_->data()) + offset_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw());
  }

  // Same storage, new shape with the same number of elements.
  Tensor reshape(Shape shape) const;
  // The same bytes read as `dtype` with `shape` (which must need exactly nbytes()).
  Tensor view_as(DType dtype, Shape shape) const;
  // Rows [begin, end) along dimension 0 (shares storage).
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // A new host tensor holding these values converted to `dtype`.
  Tensor to(DType dtype) const;
  // A deep copy in owned host memory.
  Tensor clone() const { return to(dtype_); }

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
};

}  // namespace astrai
