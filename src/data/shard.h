// Token shards: the on-disk dataset format every training job reads.
//
// A dataset is a directory:
//   meta.json     format name, version, keys (dtype, element count, record count, checksum),
//                 aligned key groups, which keys hold token ids, tokenizer info, packing info
//   <key>.bin     the key's elements, a raw little-endian array of its dtype
//   <key>.idx     its record boundaries: records + 1 little-endian int64 offsets, 0 ... length
//
// A "record" is one entry of the key's list: a packed row, a document, one preference pair
// (the reference's HDF5 layout is exactly "a list of 1-D tensors per key"). Keys of one
// aligned group (e.g. sequence / loss_mask / position_ids) have identical lengths and record
// boundaries, so element i of each describes the same token.
//
// Writing is atomic: everything goes to a sibling temporary directory that is renamed into
// place once meta.json (written last) is complete, so a crash never leaves a dataset that
// looks valid. Reading memory-maps the .bin/.idx files and validates sizes, offsets and
// checksums before anything is handed to a trainer.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/json.h"
#include "base/mapped_file.h"
#include "tensor/dtype.h"

namespace astrai::data {

inline constexpr const char* kShardFormat = "astrai.shards";
inline constexpr int kShardVersion = 1;

// Dtypes a shard key may have (safetensors spelling in meta.json).
bool is_shard_dtype(DType t);

// 64-bit checksum of a byte range (word-wise multiply-xorshift; detects corruption, not an
// adversary). Stored per key in meta.json as 16 hex digits.
uint64_t shard_checksum(const uint8_t* data, size_t n);

// Streams keys into a new dataset directory. Usage:
//   ShardWriter w(dir, /*overwrite=*/true);
//   w.add_key("sequence", DType::kI32, /*token_ids=*/true);
//   ... w.append("sequence", ids); w.end_record("sequence"); ...
//   w.add_group({"sequence", "loss_mask", "position_ids"});
//   w.finish(extra_meta);
// Nothing appears at `dir` until finish() succeeds. A writer destroyed without finish()
// removes its temporary directory.
class ShardWriter {
 public:
  ShardWriter(std::string dir, bool overwrite = false);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Declares a key. token_ids marks keys checked against the vocabulary size on load.
  void add_key(const std::string& key, DType dtype, bool token_ids = false);
  bool has_key(const std::string& key) const;
  // Declares keys that must have identical lengths and record boundaries (checked at finish
  // and on every load).
  void add_group(std::vector<std::string> keys);

  // Appends elements to the current (open) record of `key`; values are converted to the
  // key's dtype, and out-of-range values (e.g. 70000 into U16) are an error.
  void append(const std::string& key, std::span<const int32_t> values);
  void append(const std::string& key, std::span<const float> values);
  // Closes the key's current record (an empty record is allowed).
  void end_record(const std::string& key);
  // Appends one whole record.
  void add_record(const std::string& key, std::span<const int32_t> values) {
    append(key, values);
    end_record(key);
  }
  void add_record(const std::string& key, std::span<const float> values) {
    append(key, values);
    end_record(key);
  }

  int64_t length(const std::string& key) const;
  int64_t records(const std::string& key) const;

  // Writes the index files and meta.json (with `extra` merged in at the top level: tokenizer,
  // packing, stats...) and renames the directory into place.
  void finish(const Json& extra = Json::object());

 private:
  struct KeyState;
  KeyState& key_state(const std::string& key);
  const KeyState& key_state(const std::string& key) const;
  void abandon() noexcept;

  std::string dir_;
  std::string tmp_dir_;
  bool overwrite_ = false;
  bool finished_ = false;
  std::map<std::string, std::unique_ptr<KeyState>> keys_;
  std::vector<std::string> key_order_;
  std::vector<std::vector<std::string>> groups_;
};

// Read-only view of one key: memory-mapped elements plus record offsets.
struct ShardKey {
  std::string name;
  DType dtype = DType::kI32;
  int64_t length = 0;
  bool token_ids = false;
  std::shared_ptr<const MappedFile> data;   // length * dtype_size bytes
  std::shared_ptr<const MappedFile> index;  // (records + 1) int64

  int64_t records() const { return index ? static_cast<int64_t>(index->size() / 8) - 1 : 0; }
  const int64_t* offsets() const { return reinterpret_cast<const int64_t*>(index->data()); }
  int64_t record_begin(int64_t r) const { return offsets()[r]; }
  int64_t record_end(int64_t r) const { return offsets()[r + 1]; }
  // Typed pointer to the elements; T must match dtype (checked).
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data->data());
  }
  // Copies elements [begin, end) converted to int32 (integer dtypes) into out.
  void read_i32(int64_t begin, int64_t end, int32_t* out) const;
  // Copies elements [begin, end) converted to float into out.
  void read_f32(int64_t begin, int64_t end, float* out) const;
  int32_t at_i32(int64_t i) const;
  int64_t at_i64(int64_t i) const;  // exact for every integer dtype
};

struct ShardOpenOptions {
  // Recompute every key's checksum (one pass over the data; catches bit rot and partial copies).
  bool verify_checksums = true;
};

// An opened, validated dataset directory.
class Shards {
 public:
  // Opens and validates: format/version, every declared file present with the exact size,
  // offsets non-decreasing from 0 to length, aligned groups identical, checksums.
  // Every failure is an astrai::Error naming the directory, key and problem.
  static Shards open(const std::string& dir, const ShardOpenOptions& options = {});

  const std::string& dir() const { return dir_; }
  const Json& meta() const { return meta_; }
  // meta.json's "kind" (preprocess: "lm", "preference", "prompt"; HDF5 import: "imported");
  // "lm" when absent (datasets written before kinds existed).
  std::string kind() const { return meta_.value("kind", std::string("lm")); }
  bool has(const std::string& key) const { return keys_.count(key) != 0; }
  const ShardKey& key(const std::string& key) const;
  std::vector<std::string> key_names() const;
  const std::vector<std::vector<std::string>>& groups() const { return groups_; }

  // Throws astrai::Error if any token-id key holds an id < 0 or >= vocab_size (naming key,
  // element index and value), or if meta.json records a tokenizer vocabulary larger than
  // vocab_size. Call before training starts.
  void check_vocab(int64_t vocab_size) const;
  // Largest token id over all token-id keys (-1 when there are none).
  int64_t max_token_id() const;

 private:
  std::string dir_;
  Json meta_;
  std::map<std::string, ShardKey> keys_;
  std::vector<std::vector<std::string>> groups_;
};

}  // namespace astrai::data
