#include "infer/kv_storage.h"

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

KvLayout kv_layout(const model::PagedKv& g, int64_t num_layers) {
  KvLayout l;
  l.num_layers = static_cast<int32_t>(num_layers);
  l.num_kv_heads = g.num_kv_heads;
  l.k_head_dim = g.k_head_dim;
  l.v_head_dim = g.v_head_dim;
  l.page_size = g.page_size;
  l.dtype = g.dtype;
  return l;
}

namespace {

// One array per layer for K and one for V, zero-filled: 2 MiB huge pages in host memory for the
// CPU backend, the backend's own memory otherwise. Page copies go through the backend.
class PagedKvStorage final : public KvStorage {
 public:
  PagedKvStorage(const backend::Ops& ops, const KvLayout& layout, int32_t pages) : ops_(ops), layout_(layout) {
    layout.validate();
    ASTRAI_CHECK(pages >= 1, "KV cache: need at least one page, got ", pages);
    kv_.page_size = layout.page_size;
    kv_.dtype = layout.dtype;
    kv_.num_kv_heads = layout.num_kv_heads;
    kv_.k_head_dim = layout.k_head_dim;
    kv_.v_head_dim = layout.v_head_dim;
    const size_t k_bytes = size_t(pages) * page_bytes(layout.k_head_dim);
    const size_t v_bytes = size_t(pages) * page_bytes(layout.v_head_dim);
    for (int32_t l = 0; l < layout.num_layers; ++l) {
      kv_.k_pages.push_back(allocate_zeroed(k_bytes));
      kv_.v_pages.push_back(allocate_zeroed(v_bytes));
    }
  }
  ~PagedKvStorage() override {
    for (void* p : device_) ops_.release(p);
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
  // Bytes of one page of one layer's K (head_dim = k_head_dim) or V.
  size_t page_bytes(int32_t head_dim) const {
    return size_t(layout_.page_size) * layout_.num_kv_heads * head_dim * dtype_size(layout_.dtype);
  }

  void prefault() override {
    for (HugeBuffer& b : host_) b.prefault();
  }

  void* allocate_zeroed(size_t bytes) {
    if (ops_.device() == Device::kCpu) {
      host_.emplace_back((bytes + 3) / 4);  // HugeBuffer counts floats; zero-filled
      return host_.back().data();
    }
    void* p = ops_.alloc(bytes);
    device_.push_back(p);
    if (zeros_.size() < bytes) zeros_.assign(bytes, 0);
    ops_.to_device(p, zeros_.data(), bytes);
    return p;
  }

  const backend::Ops& ops_;
  KvLayout layout_;
  model::PagedKv kv_;
  std::vector<HugeBuffer> host_;
  std::vector<void*> device_;
  std::vector<char> zeros_;  // the source of a device array's zero fill
};

}  // namespace

std::unique_ptr<KvStorage> make_backend_kv_storage(const backend::Ops& ops, const KvLayout& layout, int32_t pages) {
  return std::make_unique<PagedKvStorage>(ops, layout, pages);
}

std::unique_ptr<KvStorage> make_host_kv_storage(const KvLayout& layout, int32_t pages) {
  return make_backend_kv_storage(backend::cpu_ops(), layout, pages);
}

}  // namespace astrai::infer
