#include "infer/kv_storage.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "base/huge_buffer.h"

namespace astrai::infer {

void KvLayout::validate() const {
  ASTRAI_CHECK(num_layers > 0 && num_kv_heads > 0 && k_head_dim > 0 && v_head_dim > 0,
               "KV cache: bad model layout (", num_layers, " layers, ", num_kv_heads, " kv heads)");
  ASTRAI_CHECK(page_size >= 1 && page_size <= 4096, "KV cache: page size must be in [1, 4096], got ", page_size);
  ASTRAI_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "KV cache: elements must be F32 or BF16, not ",
               dtype_name(dtype));
}

namespace {

class HostKvStorage final : public KvStorage {
 public:
  HostKvStorage(const KvLayout& layout, int32_t pages) : layout_(layout) {
    layout.validate();
    ASTRAI_CHECK(pages >= 1, "KV cache: need at least one page, got ", pages);
    // HugeBuffer counts floats: the byte size of each layer's K (V) array, rounded up to floats.
    const size_t k_floats = (size_t(pages) * page_k_bytes() + 3) / 4;
    const size_t v_floats = (size_t(pages) * page_v_bytes() + 3) / 4;
    kv_.page_size = layout.page_size;
    kv_.dtype = layout.dtype;
    kv_.num_kv_heads = layout.num_kv_heads;
    kv_.k_head_dim = layout.k_head_dim;
    kv_.v_head_dim = layout.v_head_dim;
    k_.resize(layout.num_layers);
    v_.resize(layout.num_layers);
    for (int32_t l = 0; l < layout.num_layers; ++l) {
      k_[l] = HugeBuffer(k_floats);  // zero-filled
      v_[l] = HugeBuffer(v_floats);
      kv_.k_pages.push_back(k_[l].data());
      kv_.v_pages.push_back(v_[l].data());
    }
  }

  const model::PagedKv& paged_kv() const override { return kv_; }

  void copy_page(int32_t src, int32_t dst) override {
    const size_t kn = page_k_bytes(), vn = page_v_bytes();
    for (int32_t l = 0; l < layout_.num_layers; ++l) {
      char* k = static_cast<char*>(kv_.k_pages[l]);
      char* v = static_cast<char*>(kv_.v_pages[l]);
      std::memcpy(k + dst * kn, k + src * kn, kn);
      std::memcpy(v + dst * vn, v + src * vn, vn);
    }
  }

 private:
  // Bytes of one page of one layer's K (V).
  size_t page_k_bytes() const {
    return size_t(layout_.page_size) * layout_.num_kv_heads * layout_.k_head_dim * dtype_size(layout_.dtype);
  }
  size_t page_v_bytes() const {
    return size_t(layout_.page_size) * layout_.num_kv_heads * layout_.v_head_dim * dtype_size(layout_.dtype);
  }

  KvLayout layout_;
  std::vector<HugeBuffer> k_, v_;
  model::PagedKv kv_;
};

// One allocation per layer for K and one for V in a backend's memory.
class BackendKvStorage final : public KvStorage {
 public:
  BackendKvStorage(const backend::Ops& ops, const KvLayout& layout, int32_t pages) : ops_(ops), layout_(layout) {
    layout.validate();
    ASTRAI_CHECK(pages >= 1, "KV cache: need at least one page, got ", pages);
    kv_.page_size = layout.page_size;
    kv_.dtype = layout.dtype;
    kv_.num_kv_heads = layout.num_kv_heads;
    kv_.k_head_dim = layout.k_head_dim;
    kv_.v_head_dim = layout.v_head_dim;
    const size_t k_bytes = size_t(pages) * page_bytes(layout.k_head_dim);
    const size_t v_bytes = size_t(pages) * page_bytes(layout.v_head_dim);
    const std::vector<char> zeros(std::max(k_bytes, v_bytes), 0);
    for (int32_t l = 0; l < layout.num_layers; ++l) {
      kv_.k_pages.push_back(ops.alloc(k_bytes));
      kv_.v_pages.push_back(ops.alloc(v_bytes));
      ops.to_device(kv_.k_pages.back(), zeros.data(), k_bytes);
      ops.to_device(kv_.v_pages.back(), zeros.data(), v_bytes);
    }
  }
  ~BackendKvStorage() override {
    for (void* p : kv_.k_pages) ops_.release(p);
    for (void* p : kv_.v_pages) ops_.release(p);
  }

  const model::PagedKv& paged_kv() const override { return kv_; }

  void copy_page(int32_t src, int32_t dst) override {
    const size_t kn = page_bytes(layout_.k_head_dim), vn = page_bytes(layout_.v_head_dim);
    for (int32_t l = 0; l < layout_.num_layers; ++l) {
      char* k = static_cast<char*>(kv_.k_pages[l]);
      char* v = static_cast<char*>(kv_.v_pages[l]);
      ops_.copy_bytes(k + dst * kn, k + src * kn, kn);
      ops_.copy_bytes(v + dst * vn, v + src * vn, vn);
    }
  }

 private:
  size_t page_bytes(int32_t head_dim) const {
    return size_t(layout_.page_size) * layout_.num_kv_heads * head_dim * dtype_size(layout_.dtype);
  }

  const backend::Ops& ops_;
  KvLayout layout_;
  model::PagedKv kv_;
};

}  // namespace

std::unique_ptr<KvStorage> make_backend_kv_storage(const backend::Ops& ops, const KvLayout& layout, int32_t pages) {
  if (ops.device() == Device::kCpu) return make_host_kv_storage(layout, pages);
  return std::make_unique<BackendKvStorage>(ops, layout, pages);
}

std::unique_ptr<KvStorage> make_host_kv_storage(const KvLayout& layout, int32_t pages) {
  return std::make_unique<HostKvStorage>(layout, pages);
}

}  // namespace astrai::infer
