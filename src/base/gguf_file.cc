#include "base/gguf_file.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <set>

#include "base/error.h"

namespace astrai {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kMaxDims = 4;         // GGML_MAX_DIMS
constexpr uint64_t kMaxStringBytes = uint64_t{1} << 30;

enum ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// A bounds-checked little-endian reader over the mapped header.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, const std::string& path) : data_(data), size_(size), path_(path) {}

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + at_, sizeof(T));  // x86-64 and AArch64 are little-endian, as GGUF is
    at_ += sizeof(T);
    return v;
  }

  std::string string(const char* what) {
    const auto n = read<uint64_t>(what);
    if (n > kMaxStringBytes) fail(path_, ": GGUF ", what, " claims ", n, " bytes at offset ", at_ - 8, ": corrupt file?");
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data_ + at_), n);
    at_ += n;
    return s;
  }

  void need(uint64_t n, const char* what) const {
    if (n > size_ - at_)
      fail(path_, ": truncated GGUF file: ", what, " needs ", n, " bytes at offset ", at_, " of ", size_);
  }
  uint64_t at() const { return at_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t at_ = 0;
  const std::string& path_;
};

Json read_scalar(Cursor& c, uint32_t type, const std::string& key) {
  switch (type) {
    case kU8: return c.read<uint8_t>("a u8 value");
    case kI8: return c.read<int8_t>("an i8 value");
    case kU16: return c.read<uint16_t>("a u16 value");
    case kI16: return c.read<int16_t>("an i16 value");
    case kU32: return c.read<uint32_t>("a u32 value");
    case kI32: return c.read<int32_t>("an i32 value");
    case kF32: return c.read<float>("an f32 value");
    case kBool: {
      const auto b = c.read<uint8_t>("a bool value");
      if (b > 1) fail(c.path(), ": GGUF key \"", key, "\": bool value ", int{b}, " is neither 0 nor 1");
      return b == 1;
    }
    case kString: return c.string("a string value");
    case kU64: return c.read<uint64_t>("a u64 value");
    case kI64: return c.read<int64_t>("an i64 value");
    case kF64: return c.read<double>("an f64 value");
    default: fail(c.path(), ": GGUF key \"", key, "\" has unknown value type ", type);
  }
}

Json read_value(Cursor& c, uint32_t type, const std::string& key) {
  if (type != kArray) return read_scalar(c, type, key);
  const auto element = c.read<uint32_t>("an array element type");
  const auto count = c.read<uint64_t>("an array length");
  if (element == kArray) fail(c.path(), ": GGUF key \"", key, "\": nested arrays are not supported");
  // Every element takes at least one byte: a count beyond the file is corruption, not a huge array.
  c.need(count, "an array's elements");
  Json out = Json::array();
  out.get_ref<Json::array_t&>().reserve(count);
  for (uint64_t i = 0; i < count; ++i) out.push_back(read_scalar(c, element, key));
  return out;
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  uint32_t magic = 0;
  const bool ok = std::fread(&magic, sizeof magic, 1, f) == 1 && magic == kMagic;
  std::fclose(f);
  return ok;
}

GgufFile read_gguf(const std::string& path) {
  GgufFile g;
  g.file = std::make_shared<const MappedFile>(path);
  Cursor c(g.file->data(), g.file->size(), path);
  if (c.read<uint32_t>("the magic") != kMagic) fail(path, ": not a GGUF file (no \"GGUF\" magic)");
  g.version = c.read<uint32_t>("the version");
  if (g.version != 2 && g.version != 3)
    fail(path, ": GGUF version ", g.version, " is not supported (2 and 3 are; a big-endian file reads as a huge number)");
  const auto n_tensors = c.read<uint64_t>("the tensor count");
  const auto n_kv = c.read<uint64_t>("the key/value count");
  c.need(n_kv, "the key/value pairs");
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.string("a metadata key");
    const auto type = c.read<uint32_t>("a value type");
    if (g.metadata.contains(key)) fail(path, ": GGUF key \"", key, "\" appears twice");
    g.metadata[key] = read_value(c, type, key);
  }
  uint64_t alignment = 32;
  if (auto it = g.metadata.find("general.alignment"); it != g.metadata.end()) {
    if (!it->is_number_unsigned() || it->get<uint64_t>() == 0 || (it->get<uint64_t>() & (it->get<uint64_t>() - 1)))
      fail(path, ": general.alignment must be a power of two");
    alignment = it->get<uint64_t>();
  }
  c.need(n_tensors, "the tensor records");
  std::set<std::string> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorRecord t;
    t.name = c.string("a tensor name");
    const auto n_dims = c.read<uint32_t>("a tensor's dimension count");
    if (n_dims == 0 || n_dims > kMaxDims) fail(path, ": tensor \"", t.name, "\" has ", n_dims, " dimensions (1 to 4)");
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto n = c.read<uint64_t>("a tensor dimension");
      if (n == 0 || n > (uint64_t{1} << 40)) fail(path, ": tensor \"", t.name, "\" has dimension ", n);
      t.dims.push_back(static_cast<int64_t>(n));
    }
    t.ggml_type = c.read<uint32_t>("a tensor type");
    t.offset = c.read<uint64_t>("a tensor offset");
    if (t.offset % alignment != 0)
      fail(path, ": tensor \"", t.name, "\" starts at data offset ", t.offset, ", not a multiple of ", alignment);
    if (!names.insert(t.name).second) fail(path, ": tensor \"", t.name, "\" appears twice");
    g.tensors.push_back(std::move(t));
  }
  g.data_begin = (c.at() + alignment - 1) / alignment * alignment;
  if (g.data_begin > g.file->size() && n_tensors > 0)
    fail(path, ": truncated GGUF file: the tensor data would start at ", g.data_begin, " of ", g.file->size(), " bytes");
  for (auto& t : g.tensors) {
    if (t.offset > g.file->size() - std::min<uint64_t>(g.data_begin, g.file->size()))
      fail(path, ": tensor \"", t.name, "\" starts past the end of the file: truncated?");
    t.offset += g.data_begin;
  }
  return g;
}

}  // namespace astrai
