// GGUF (llama.cpp's model file format, versions 2 and 3) read in place: the file is mapped and
// its header parsed into the metadata (key -> JSON value) and the tensor records (name, GGML
// type id, dimensions, where the bytes are). What the tensors mean is the model layer's business
// (model/gguf_checkpoint.h), what the tokenizer metadata means the tokenizer's (tokenizer/gguf_vocab.h).
//
// Layout (little-endian): "GGUF", u32 version, u64 tensor count, u64 key/value count, the key/value
// pairs (string key, u32 value type, value; arrays: u32 element type, u64 count, elements), the tensor
// records (string name, u32 dimension count, u64 dimensions fastest first, u32 GGML type, u64 offset),
// padding to `general.alignment` (default 32), then the tensor data (offsets relative to its start).
// Strings are a u64 byte length and the bytes. Every length and offset is checked against the file:
// a truncated or corrupt file is an astrai::Error naming the path and what is wrong.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/json.h"
#include "base/mapped_file.h"

namespace astrai {

struct GgufTensorRecord {
  std::string name;
  uint32_t ggml_type = 0;
  std::vector<int64_t> dims;  // as stored: dims[0] is the fastest-varying (the row length)
  uint64_t offset = 0;        // from the start of the file (already past the data section start)
};

struct GgufFile {
  std::shared_ptr<const MappedFile> file;
  uint32_t version = 0;
  Json metadata = Json::object();  // integers, floats, bools, strings and arrays of them
  std::vector<GgufTensorRecord> tensors;
  uint64_t data_begin = 0;  // where the tensor data section starts
};

// True when `path` is a regular file that starts with the GGUF magic.
bool is_gguf_file(const std::string& path);

// Maps and parses `path`; tensor bytes stay in the mapping.
GgufFile read_gguf(const std::string& path);

}  // namespace astrai
