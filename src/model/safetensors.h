// safetensors I/O. A file is an 8-byte little-endian header length N, N bytes of JSON
// header {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the raw little-endian tensor bytes (offsets relative to the end of the header).
//
// Reading maps the file and returns tensors that borrow the mapping (zero copy: an f32
// model costs its size once, in page cache). Every header field is validated; errors name
// the file and the tensor.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "base/json.h"
#include "tensor/tensor.h"

namespace astrai::model {

using TensorMap = std::map<std::string, Tensor>;

struct SafetensorsContents {
  TensorMap tensors;
  Json metadata = Json::object();  // "__metadata__" (string -> string), empty if absent
  size_t mapped_bytes = 0;         // size of the mapped file(s)
};

// Reads one .safetensors file.
SafetensorsContents read_safetensors(const std::string& path);

// Reads the weights of a checkpoint directory: DIR/model.safetensors, or the shards named
// by DIR/model.safetensors.index.json ("weight_map": tensor -> shard file).
SafetensorsContents read_checkpoint_tensors(const std::string& dir);

// Writes tensors (any dtype, any device memory readable on the host) to one file in the
// layout above, atomically (temporary file, fsync, rename). The data section starts on a
// 64-byte boundary (the header padded with spaces); tensors whose size is a multiple of 64
// bytes come first, in the given order, so each starts on a 64-byte boundary too, then the
// others in the given order; no holes between them.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const Json& metadata = Json::object());

}  // namespace astrai::model
