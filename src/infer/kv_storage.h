// The memory of the paged KV cache, owned by the backend that reads and writes it (host memory
// for the CPU backend, device memory for a GPU one). The engine's KvPool keeps only page ids,
// reference counts and the prefix index; it never touches K/V bytes (the split of nano-vllm's
// BlockManager and ModelRunner).
#pragma once

#include <cstdint>
#include <memory>

#include "backend/ops.h"
#include "model/batch.h"
#include "tensor/dtype.h"

namespace astrai::infer {

struct KvLayout {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t k_head_dim = 0;
  int32_t v_head_dim = 0;
  int32_t page_size = 16;
  DType dtype = DType::kF32;  // of the stored K/V elements: kF32 or kBF16
  // Bytes one page takes over all layers (K and V).
  int64_t page_bytes() const {
    return static_cast<int64_t>(dtype_size(dtype)) * num_layers * page_size * num_kv_heads * (k_head_dim + v_head_dim);
  }
  // Throws astrai::Error describing the first bad field.
  void validate() const;
};

// The layout of `num_layers` layers of pages with a model's geometry
// (model::Transformer::kv_geometry: page size, dtype, kv heads, head dims).
KvLayout kv_layout(const model::PagedKv& geometry, int64_t num_layers);

class KvStorage {
 public:
  virtual ~KvStorage() = default;
  // The pages in model::PagedKv layout (model/batch.h), as the backend's forward reads them.
  virtual const model::PagedKv& paged_kv() const = 0;
  // Copies every layer's K/V of page src to page dst (forking a partial page).
  virtual void copy_page(int32_t src, int32_t dst) = 0;
  // Faults every page of host memory in now (device memory is written when allocated), so the
  // first requests do not pay for it; commits the memory.
  virtual void prefault() {}
};

// `pages` zero-filled pages in host memory, one block per layer for K and one for V, on 2 MiB
// huge pages where possible.
std::unique_ptr<KvStorage> make_host_kv_storage(const KvLayout& layout, int32_t pages);

// The same pages in the memory of a backend's device (backend/ops.h), zero-filled.
std::unique_ptr<KvStorage> make_backend_kv_storage(const backend::Ops& ops, const KvLayout& layout, int32_t pages);

}  // namespace astrai::infer
