#include "tensor/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "base/error.h"
#include "base/huge_buffer.h"
#include "base/mapped_file.h"

namespace astrai {
namespace {

// Owned host memory, zero-filled. Large buffers (weights, optimizer state) come from
// HugeBuffer: 2 MiB-aligned and advised for huge pages, which streams weights faster than
// 4 KiB pages (fewer TLB misses; see base/huge_buffer.h).
class HostStorage final : public Storage {
 public:
  explicit HostStorage(size_t bytes) : bytes_(bytes) {
    if (bytes >= kHugeMin) {
      huge_ = HugeBuffer((bytes + sizeof(float) - 1) / sizeof(float));
      data_ = huge_.data();
      return;
    }
    const size_t rounded = (bytes + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (data_ == nullptr) fail("out of memory allocating ", bytes, " bytes");
    std::memset(data_, 0, rounded == 0 ? 64 : rounded);
  }
  ~HostStorage() override {
    if (!huge_.data()) std::free(data_);
  }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }
  Device device() const override { return Device::kCpu; }

 private:
  static constexpr size_t kHugeMin = size_t{4} << 20;
  HugeBuffer huge_;
  void* data_;
  size_t bytes_;
};

class MappedStorage final : public Storage {
 public:
  MappedStorage(std::shared_ptr<const MappedFile> file, size_t offset, size_t bytes)
      : file_(std::move(file)), offset_(offset), bytes_(bytes) {}
  // Mapped weights are read-only (PROT_READ); writers must copy first.
  void* data() override { return const_cast<uint8_t*>(file_->data()) + offset_; }
  size_t bytes() const override { return bytes_; }
  Device device() const override { return Device::kCpu; }
  bool is_mapped() const override { return true; }

 private:
  std::shared_ptr<const MappedFile> file_;
  size_t offset_;
  size_t bytes_;
};

}  // namespace

std::shared_ptr<Storage> make_host_storage(size_t bytes) { return std::make_shared<HostStorage>(bytes); }

std::shared_ptr<Storage> make_mapped_storage(std::shared_ptr<const MappedFile> file, size_t offset, size_t bytes) {
  // Written so that offset + bytes cannot wrap around.
  ASTRAI_CHECK(offset <= file->size() && bytes <= file->size() - offset, file->path(), ": range of ", bytes,
               " bytes at offset ", offset, " is outside the file (", file->size(), " bytes)");
  return std::make_shared<MappedStorage>(std::move(file), offset, bytes);
}

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, Shape shape, DType dtype)
    : storage_(std::move(storage)), offset_(byte_offset), shape_(std::move(shape)), dtype_(dtype) {
  ASTRAI_CHECK(offset_ + nbytes() <= storage_->bytes(), "tensor of shape ", shape_str(shape_),
               " does not fit its storage");
}

Tensor Tensor::empty(Shape shape, DType dtype) {
  const size_t bytes = dtype_bytes(dtype, shape_numel(shape));
  return Tensor(make_host_storage(bytes), 0, std::move(shape), dtype);
}

Tensor Tensor::reshape(Shape shape) const {
  ASTRAI_CHECK(shape_numel(shape) == numel(), "cannot reshape ", shape_str(shape_), " to ", shape_str(shape));
  return Tensor(storage_, offset_, std::move(shape), dtype_);
}

Tensor Tensor::view_as(DType dtype, Shape shape) const {
  ASTRAI_CHECK(dtype_bytes(dtype, shape_numel(shape)) == nbytes(), "cannot view ", shape_str(shape_), " ",
               dtype_name(dtype_), " as ", shape_str(shape), " ", dtype_name(dtype));
  return Tensor(storage_, offset_, std::move(shape), dtype);
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  ASTRAI_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= dim(0), "bad row slice [", begin, ", ", end,
               ") of ", shape_str(shape_));
  Shape s = shape_;
  s[0] = end - begin;
  const size_t row_bytes = dtype_bytes(dtype_, numel() / (dim(0) == 0 ? 1 : dim(0)));
  return Tensor(storage_, offset_ + static_cast<size_t>(begin) * row_bytes, std::move(s), dtype_);
}

Tensor Tensor::to(DType dtype) const {
  Tensor out = empty(shape_, dtype);
  const size_t n = static_cast<size_t>(numel());
  if (dtype == dtype_) {
    std::memcpy(out.raw(), raw(), nbytes());
  } else if (dtype == DType::kF32) {
    convert_to_f32(dtype_, raw(), out.data<float>(), n);
  } else if (dtype_ == DType::kF32) {
    convert_from_f32(data<float>(), dtype, out.raw(), n);
  } else {
    Tensor tmp = to(DType::kF32);
    convert_from_f32(tmp.data<float>(), dtype, out.raw(), n);
  }
  return out;
}

}  // namespace astrai
