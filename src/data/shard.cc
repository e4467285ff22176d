#include "data/shard.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "base/error.h"
#include "base/files.h"

namespace astrai::data {

namespace fs = std::filesystem;

bool is_shard_dtype(DType t) {
  switch (t) {
    case DType::kI32:
    case DType::kI64:
    case DType::kU16:
    case DType::kU8:
    case DType::kI8:
    case DType::kBool:
    case DType::kF32:
      return true;
    default:
      return false;
  }
}

namespace {

bool is_integer_dtype(DType t) { return is_shard_dtype(t) && t != DType::kF32; }

// Value range a dtype can hold (for conversions on append).
void dtype_range(DType t, int64_t* lo, int64_t* hi) {
  switch (t) {
    case DType::kI32: *lo = std::numeric_limits<int32_t>::min(); *hi = std::numeric_limits<int32_t>::max(); return;
    case DType::kI64: *lo = std::numeric_limits<int64_t>::min(); *hi = std::numeric_limits<int64_t>::max(); return;
    case DType::kU16: *lo = 0; *hi = 65535; return;
    case DType::kU8: *lo = 0; *hi = 255; return;
    case DType::kI8: *lo = -128; *hi = 127; return;
    case DType::kBool: *lo = 0; *hi = 1; return;
    default: *lo = 0; *hi = 0; return;
  }
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: durability, not correctness
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

uint64_t shard_checksum(const uint8_t* data, size_t n) {
  uint64_t h = 0x243F6A8885A308D3ull ^ (static_cast<uint64_t>(n) * 0x9E3779B97F4A7C15ull);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, data + i, 8);
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  for (size_t k = 0; i + k < n; ++k) tail |= static_cast<uint64_t>(data[i + k]) << (8 * k);
  h = (h ^ tail) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  return h;
}

// ---------------------------------------------------------------------------------------
// Writer

struct ShardWriter::KeyState {
  std::string name;
  DType dtype = DType::kI32;
  bool token_ids = false;
  std::FILE* file = nullptr;
  int64_t length = 0;
  std::vector<int64_t> offsets{0};
  std::vector<uint8_t> buffer;  // conversion scratch
};

ShardWriter::ShardWriter(std::string dir, bool overwrite) : dir_(std::move(dir)), overwrite_(overwrite) {
  ASTRAI_CHECK(!dir_.empty(), "shard writer: empty output directory");
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  std::error_code ec;
  if (fs::exists(dir_, ec)) {
    ASTRAI_CHECK(fs::is_directory(dir_, ec), dir_, ": exists and is not a directory");
    const bool empty = fs::is_empty(dir_, ec);
    const bool dataset = fs::exists(fs::path(dir_) / "meta.json", ec);
    ASTRAI_CHECK(empty || (overwrite_ && dataset), dir_,
                 overwrite_ ? ": exists and is not a dataset directory (refusing to replace it)"
                            : ": already exists (use --overwrite to replace a dataset)");
  }
  const fs::path parent = fs::absolute(fs::path(dir_)).parent_path();
  fs::create_directories(parent, ec);
  ASTRAI_CHECK(!ec, "cannot create ", parent.string(), ": ", ec.message());
  tmp_dir_ = dir_ + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp_dir_, ec);
  fs::create_directory(tmp_dir_, ec);
  ASTRAI_CHECK(!ec, "cannot create ", tmp_dir_, ": ", ec.message());
}

ShardWriter::~ShardWriter() {
  if (!finished_) abandon();
}

void ShardWriter::abandon() noexcept {
  for (auto& [name, k] : keys_) {
    if (k->file) std::fclose(k->file);
    k->file = nullptr;
  }
  std::error_code ec;
  if (!tmp_dir_.empty()) fs::remove_all(tmp_dir_, ec);
}

void ShardWriter::add_key(const std::string& key, DType dtype, bool token_ids) {
  ASTRAI_CHECK(!finished_, "shard writer: add_key after finish");
  ASTRAI_CHECK(!key.empty() && key.find('/') == std::string::npos && key[0] != '.', "shard writer: invalid key name \"",
               key, "\"");
  ASTRAI_CHECK(!keys_.count(key), "shard writer: key \"", key, "\" declared twice");
  ASTRAI_CHECK(is_shard_dtype(dtype), "shard writer: key \"", key, "\": unsupported dtype ", dtype_name(dtype));
  ASTRAI_CHECK(!token_ids || is_integer_dtype(dtype), "shard writer: token key \"", key, "\" must be an integer dtype");
  auto state = std::make_unique<KeyState>();
  state->name = key;
  state->dtype = dtype;
  state->token_ids = token_ids;
  const std::string path = tmp_dir_ + "/" + key + ".bin";
  state->file = std::fopen(path.c_str(), "wb");
  ASTRAI_CHECK(state->file != nullptr, "cannot create ", path, ": ", std::strerror(errno));
  keys_[key] = std::move(state);
  key_order_.push_back(key);
}

bool ShardWriter::has_key(const std::string& key) const { return keys_.count(key) != 0; }

void ShardWriter::add_group(std::vector<std::string> keys) {
  for (const auto& k : keys) ASTRAI_CHECK(keys_.count(k), "shard writer: group names undeclared key \"", k, "\"");
  ASTRAI_CHECK(keys.size() >= 2, "shard writer: a group needs at least two keys");
  groups_.push_back(std::move(keys));
}

ShardWriter::KeyState& ShardWriter::key_state(const std::string& key) {
  auto it = keys_.find(key);
  if (it == keys_.end()) fail("shard writer: undeclared key \"", key, "\"");
  return *it->second;
}

const ShardWriter::KeyState& ShardWriter::key_state(const std::string& key) const {
  auto it = keys_.find(key);
  if (it == keys_.end()) fail("shard writer: undeclared key \"", key, "\"");
  return *it->second;
}

namespace {

template <typename Src>
void convert_into(const Src* src, size_t n, DType dtype, const std::string& key, std::vector<uint8_t>* out) {
  out->resize(n * dtype_size(dtype));
  uint8_t* dst = out->data();
  if (dtype == DType::kF32) {
    for (size_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(src[i]);
      std::memcpy(dst + 4 * i, &v, 4);
    }
    return;
  }
  int64_t lo, hi;
  dtype_range(dtype, &lo, &hi);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_floating_point_v<Src>) {
      ASTRAI_CHECK(src[i] == static_cast<Src>(static_cast<int64_t>(src[i])), "shard writer: key \"", key,
                   "\": non-integer value ", src[i], " for dtype ", dtype_name(dtype));
    }
    const int64_t v = static_cast<int64_t>(src[i]);
    ASTRAI_CHECK(v >= lo && v <= hi, "shard writer: key \"", key, "\": value ", v, " does not fit dtype ",
                 dtype_name(dtype));
    switch (dtype) {
      case DType::kI32: { const int32_t x = static_cast<int32_t>(v); std::memcpy(dst + 4 * i, &x, 4); break; }
      case DType::kI64: std::memcpy(dst + 8 * i, &v, 8); break;
      case DType::kU16: { const uint16_t x = static_cast<uint16_t>(v); std::memcpy(dst + 2 * i, &x, 2); break; }
      case DType::kU8:
      case DType::kBool: dst[i] = static_cast<uint8_t>(v); break;
      case DType::kI8: dst[i] = static_cast<uint8_t>(static_cast<int8_t>(v)); break;
      default: fail("unreachable dtype");
    }
  }
}

}  // namespace

void ShardWriter::append(const std::string& key, std::span<const int32_t> values) {
  KeyState& k = key_state(key);
  ASTRAI_CHECK(!finished_, "shard writer: append after finish");
  if (values.empty()) return;
  const void* bytes = values.data();
  size_t nbytes = values.size() * 4;
  if (k.dtype != DType::kI32) {
    convert_into(values.data(), values.size(), k.dtype, key, &k.buffer);
    bytes = k.buffer.data();
    nbytes = k.buffer.size();
  }
  ASTRAI_CHECK(std::fwrite(bytes, 1, nbytes, k.file) == nbytes, "cannot write ", tmp_dir_, "/", key,
               ".bin: ", std::strerror(errno));
  k.length += static_cast<int64_t>(values.size());
}

void ShardWriter::append(const std::string& key, std::span<const float> values) {
  KeyState& k = key_state(key);
  ASTRAI_CHECK(!finished_, "shard writer: append after finish");
  if (values.empty()) return;
  convert_into(values.data(), values.size(), k.dtype, key, &k.buffer);
  ASTRAI_CHECK(std::fwrite(k.buffer.data(), 1, k.buffer.size(), k.file) == k.buffer.size(), "cannot write ",
               tmp_dir_, "/", key, ".bin: ", std::strerror(errno));
  k.length += static_cast<int64_t>(values.size());
}

void ShardWriter::end_record(const std::string& key) {
  KeyState& k = key_state(key);
  k.offsets.push_back(k.length);
}

int64_t ShardWriter::length(const std::string& key) const { return key_state(key).length; }
int64_t ShardWriter::records(const std::string& key) const {
  return static_cast<int64_t>(key_state(key).offsets.size()) - 1;
}

void ShardWriter::finish(const Json& extra) {
  ASTRAI_CHECK(!finished_, "shard writer: finish called twice");
  try {
    for (const auto& group : groups_) {
      const KeyState& first = key_state(group[0]);
      for (const auto& name : group) {
        const KeyState& k = key_state(name);
        ASTRAI_CHECK(k.offsets == first.offsets, "shard writer: keys \"", group[0], "\" and \"", name,
                     "\" are grouped but have different record boundaries (", first.length, " vs ", k.length,
                     " elements, ", first.offsets.size() - 1, " vs ", k.offsets.size() - 1, " records)");
      }
    }
    Json keys = Json::object();
    Json token_keys = Json::array();
    for (const auto& name : key_order_) {
      KeyState& k = *keys_[name];
      ASTRAI_CHECK(k.offsets.back() == k.length, "shard writer: key \"", name, "\" has ",
                   k.length - k.offsets.back(), " elements after its last end_record()");
      const std::string bin = tmp_dir_ + "/" + name + ".bin";
      ASTRAI_CHECK(std::fflush(k.file) == 0, "cannot write ", bin, ": ", std::strerror(errno));
      ::fsync(::fileno(k.file));
      ASTRAI_CHECK(std::fclose(k.file) == 0, "cannot close ", bin, ": ", std::strerror(errno));
      k.file = nullptr;
      write_file_atomic(tmp_dir_ + "/" + name + ".idx",
                        std::string_view(reinterpret_cast<const char*>(k.offsets.data()), k.offsets.size() * 8));
      const MappedFile mapped(bin);
      ASTRAI_CHECK(static_cast<int64_t>(mapped.size()) == k.length * static_cast<int64_t>(dtype_size(k.dtype)),
                   "shard writer: ", bin, " has an unexpected size");
      Json entry = {{"dtype", std::string(dtype_name(k.dtype))},
                    {"length", k.length},
                    {"records", static_cast<int64_t>(k.offsets.size()) - 1},
                    {"file", name + ".bin"},
                    {"index", name + ".idx"},
                    {"checksum", hex64(shard_checksum(mapped.data(), mapped.size()))}};
      if (k.token_ids) {
        entry["token_ids"] = true;
        token_keys.push_back(name);
      }
      keys[name] = entry;
    }
    Json meta = Json::object();
    meta["format"] = kShardFormat;
    meta["version"] = kShardVersion;
    meta["keys"] = keys;
    meta["groups"] = groups_;
    meta["token_keys"] = token_keys;
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      ASTRAI_CHECK(!meta.contains(it.key()), "shard writer: extra metadata may not override \"", it.key(), "\"");
      meta[it.key()] = it.value();
    }
    write_file_atomic(tmp_dir_ + "/meta.json", meta.dump(2) + "\n");
    fsync_path(tmp_dir_);

    std::error_code ec;
    std::string old;
    if (fs::exists(dir_, ec)) {
      old = dir_ + ".old." + std::to_string(::getpid());
      fs::remove_all(old, ec);
      fs::rename(dir_, old, ec);
      ASTRAI_CHECK(!ec, "cannot move the old dataset ", dir_, " aside: ", ec.message());
    }
    fs::rename(tmp_dir_, dir_, ec);
    if (ec) {
      const std::string msg = ec.message();
      if (!old.empty()) fs::rename(old, dir_, ec);
      fail("cannot rename ", tmp_dir_, " to ", dir_, ": ", msg);
    }
    fsync_path(fs::absolute(fs::path(dir_)).parent_path().string());
    if (!old.empty()) fs::remove_all(old, ec);
    finished_ = true;
  } catch (...) {
    abandon();
    finished_ = true;
    throw;
  }
}

// ---------------------------------------------------------------------------------------
// Reader

void ShardKey::read_i32(int64_t begin, int64_t end, int32_t* out) const {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const uint8_t* base = data->data();
  switch (dtype) {
    case DType::kI32: std::memcpy(out, base + 4 * begin, static_cast<size_t>(n) * 4); return;
    case DType::kU16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(base) + begin;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      return;
    }
    case DType::kI64: {
      const int64_t* p = reinterpret_cast<const int64_t*>(base) + begin;
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(p[i]);
      return;
    }
    case DType::kU8:
    case DType::kBool:
      for (int64_t i = 0; i < n; ++i) out[i] = base[begin + i];
      return;
    case DType::kI8:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int8_t>(base[begin + i]);
      return;
    default: fail("key \"", name, "\" has dtype ", dtype_name(dtype), ", not an integer dtype");
  }
}

void ShardKey::read_f32(int64_t begin, int64_t end, float* out) const {
  const int64_t n = end - begin;
  if (n <= 0) return;
  if (dtype == DType::kF32) {
    std::memcpy(out, data->data() + 4 * begin, static_cast<size_t>(n) * 4);
    return;
  }
  std::vector<int32_t> tmp(static_cast<size_t>(n));
  read_i32(begin, end, tmp.data());
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(tmp[i]);
}

int32_t ShardKey::at_i32(int64_t i) const {
  int32_t v = 0;
  read_i32(i, i + 1, &v);
  return v;
}

int64_t ShardKey::at_i64(int64_t i) const {
  if (dtype == DType::kI64) return as<int64_t>()[i];
  return at_i32(i);
}

Shards Shards::open(const std::string& dir, const ShardOpenOptions& options) {
  Shards s;
  s.dir_ = dir;
  const std::string meta_path = dir + "/meta.json";
  ASTRAI_CHECK(file_exists(dir), "dataset ", dir, ": no such directory");
  ASTRAI_CHECK(file_exists(meta_path), "dataset ", dir,
               ": no meta.json (not a dataset directory, or an interrupted write)");
  s.meta_ = read_json_file(meta_path);
  const Json& meta = s.meta_;
  ASTRAI_CHECK(meta.is_object(), meta_path, ": not a JSON object");
  const auto format = json_required<std::string>(meta, "format", meta_path);
  ASTRAI_CHECK(format == kShardFormat, meta_path, ": format is \"", format, "\", expected \"", kShardFormat, "\"");
  const auto version = json_required<int>(meta, "version", meta_path);
  ASTRAI_CHECK(version == kShardVersion, meta_path, ": version ", version, " is not supported (this build reads ",
               kShardVersion, ")");
  auto keys_it = meta.find("keys");
  ASTRAI_CHECK(keys_it != meta.end() && keys_it->is_object() && !keys_it->empty(), meta_path,
               ": \"keys\" must be a non-empty object");
  for (auto it = keys_it->begin(); it != keys_it->end(); ++it) {
    const std::string& name = it.key();
    const std::string where = meta_path + " key \"" + name + "\"";
    ShardKey k;
    k.name = name;
    const auto dtype_str = json_required<std::string>(*it, "dtype", where);
    ASTRAI_CHECK(dtype_from_name(dtype_str, &k.dtype) && is_shard_dtype(k.dtype), where, ": unsupported dtype \"",
                 dtype_str, "\"");
    k.length = json_required<int64_t>(*it, "length", where);
    ASTRAI_CHECK(k.length >= 0, where, ": negative length");
    const auto records = json_required<int64_t>(*it, "records", where);
    ASTRAI_CHECK(records >= 0, where, ": negative record count");
    k.token_ids = json_optional<bool>(*it, "token_ids", false, where);
    const auto file = json_required<std::string>(*it, "file", where);
    const auto index = json_required<std::string>(*it, "index", where);
    ASTRAI_CHECK(file.find('/') == std::string::npos && index.find('/') == std::string::npos, where,
                 ": file names must be plain names inside the dataset directory");
    const std::string bin_path = dir + "/" + file;
    const std::string idx_path = dir + "/" + index;
    ASTRAI_CHECK(file_exists(bin_path), where, ": missing data file ", bin_path);
    ASTRAI_CHECK(file_exists(idx_path), where, ": missing index file ", idx_path);
    k.data = std::make_shared<const MappedFile>(bin_path);
    k.index = std::make_shared<const MappedFile>(idx_path);
    const uint64_t want = static_cast<uint64_t>(k.length) * dtype_size(k.dtype);
    ASTRAI_CHECK(k.data->size() == want, "dataset ", dir, ": ", file, " is ", k.data->size(), " bytes, expected ",
                 want, " (", k.length, " x ", dtype_str, "): truncated or corrupt shard");
    ASTRAI_CHECK(k.index->size() == static_cast<size_t>(records + 1) * 8, "dataset ", dir, ": ", index, " is ",
                 k.index->size(), " bytes, expected ", (records + 1) * 8, " (", records,
                 " records): truncated or corrupt index");
    const int64_t* off = k.offsets();
    ASTRAI_CHECK(off[0] == 0, "dataset ", dir, ": ", index, " does not start at 0");
    for (int64_t r = 0; r < records; ++r) {
      ASTRAI_CHECK(off[r + 1] >= off[r], "dataset ", dir, ": ", index, ": record ", r, " ends before it begins (",
                   off[r], " > ", off[r + 1], ")");
    }
    ASTRAI_CHECK(off[records] == k.length, "dataset ", dir, ": ", index, " ends at ", off[records],
                 " but the key has ", k.length, " elements");
    if (options.verify_checksums) {
      if (auto c = it->find("checksum"); c != it->end()) {
        const std::string got = hex64(shard_checksum(k.data->data(), k.data->size()));
        ASTRAI_CHECK(c->is_string() && c->get<std::string>() == got, "dataset ", dir, ": ", file,
                     " fails its checksum (stored ", c->dump(), ", computed \"", got, "\"): corrupt shard");
      }
    }
    s.keys_.emplace(name, std::move(k));
  }
  if (auto g = meta.find("groups"); g != meta.end()) {
    ASTRAI_CHECK(g->is_array(), meta_path, ": \"groups\" must be an array");
    for (const auto& group : *g) {
      ASTRAI_CHECK(group.is_array() && !group.empty(), meta_path, ": each group must be a non-empty array of keys");
      std::vector<std::string> names;
      for (const auto& n : group) {
        ASTRAI_CHECK(n.is_string() && s.keys_.count(n.get<std::string>()), meta_path, ": group names unknown key ",
                     n.dump());
        names.push_back(n.get<std::string>());
      }
      const ShardKey& first = s.keys_.at(names[0]);
      for (const auto& n : names) {
        const ShardKey& k = s.keys_.at(n);
        ASTRAI_CHECK(k.length == first.length, "dataset ", dir, ": aligned keys \"", names[0], "\" (", first.length,
                     " elements) and \"", n, "\" (", k.length, " elements) have mismatched lengths");
        ASTRAI_CHECK(k.index->size() == first.index->size() &&
                         std::memcmp(k.index->data(), first.index->data(), k.index->size()) == 0,
                     "dataset ", dir, ": aligned keys \"", names[0], "\" and \"", n,
                     "\" have different record boundaries");
      }
      s.groups_.push_back(std::move(names));
    }
  }
  return s;
}

const ShardKey& Shards::key(const std::string& key) const {
  auto it = keys_.find(key);
  if (it == keys_.end()) {
    std::string have;
    for (const auto& [n, k] : keys_) have += (have.empty() ? "" : ", ") + n;
    fail("dataset ", dir_, ": no key \"", key, "\" (has: ", have, ")");
  }
  return it->second;
}

std::vector<std::string> Shards::key_names() const {
  std::vector<std::string> names;
  for (const auto& [n, k] : keys_) names.push_back(n);
  return names;
}

namespace {

template <typename T>
void scan_minmax(const T* p, int64_t n, int64_t* mn, int64_t* mx) {
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
#pragma omp parallel for reduction(min : lo) reduction(max : hi) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = static_cast<int64_t>(p[i]);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  *mn = lo;
  *mx = hi;
}

void key_minmax(const ShardKey& k, int64_t* mn, int64_t* mx) {
  *mn = 0;
  *mx = -1;
  if (k.length == 0) return;
  switch (k.dtype) {
    case DType::kI32: scan_minmax(k.as<int32_t>(), k.length, mn, mx); return;
    case DType::kI64: scan_minmax(k.as<int64_t>(), k.length, mn, mx); return;
    case DType::kU16: scan_minmax(k.as<uint16_t>(), k.length, mn, mx); return;
    case DType::kU8:
    case DType::kBool: scan_minmax(k.as<uint8_t>(), k.length, mn, mx); return;
    case DType::kI8: scan_minmax(k.as<int8_t>(), k.length, mn, mx); return;
    default: fail("key \"", k.name, "\" holds token ids but has dtype ", dtype_name(k.dtype));
  }
}

}  // namespace

int64_t Shards::max_token_id() const {
  int64_t best = -1;
  for (const auto& [n, k] : keys_) {
    if (!k.token_ids) continue;
    int64_t mn, mx;
    key_minmax(k, &mn, &mx);
    best = std::max(best, mx);
  }
  return best;
}

void Shards::check_vocab(int64_t vocab_size) const {
  ASTRAI_CHECK(vocab_size > 0, "check_vocab: vocab size must be positive, got ", vocab_size);
  if (auto t = meta_.find("tokenizer"); t != meta_.end() && t->is_object()) {
    if (auto v = t->find("vocab_size"); v != t->end() && v->is_number_integer()) {
      ASTRAI_CHECK(v->get<int64_t>() <= vocab_size, "dataset ", dir_, " was tokenized with a vocabulary of ",
                   v->get<int64_t>(), " tokens but the model has only ", vocab_size,
                   " (mismatched tokenizer and model)");
    }
  }
  for (const auto& [name, k] : keys_) {
    if (!k.token_ids) continue;
    int64_t mn, mx;
    key_minmax(k, &mn, &mx);
    if (mn >= 0 && mx < vocab_size) continue;
    // Name the first offender so the user can find the record.
    for (int64_t i = 0; i < k.length; ++i) {
      const int64_t v = k.at_i64(i);
      if (v < 0 || v >= vocab_size) {
        int64_t r = std::upper_bound(k.offsets(), k.offsets() + k.records() + 1, i) - k.offsets() - 1;
        fail("dataset ", dir_, ": key \"", name, "\" element ", i, " (record ", r, ") is token id ", v,
             ", outside the vocabulary [0, ", vocab_size, ")");
      }
    }
  }
}

}  // namespace astrai::data
