#include "model/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>

#include "base/error.h"
#include "base/files.h"
#include "base/mapped_file.h"

namespace astrai::model {

namespace {

// The format's own cap on header size (the Rust reference rejects larger headers too).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Error text may quote bytes of a corrupt header; keep it printable ASCII.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) {
    if (ch >= 0x20 && ch < 0x7f) {
      out.push_back(static_cast<char>(ch));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", ch);
      out += buf;
    }
  }
  return out;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

SafetensorsContents read_safetensors(const std::string& path) {
  auto file = std::make_shared<const MappedFile>(path);
  const size_t size = file->size();
  if (size < 8) fail(path, ": truncated safetensors file (", size, " bytes, need at least 8)");
  const uint64_t header_len = read_u64_le(file->data());
  if (header_len > kMaxHeaderBytes)
    fail(path, ": safetensors header length ", header_len, " exceeds the ", kMaxHeaderBytes, "-byte limit");
  if (header_len > size - 8)
    fail(path, ": safetensors header length ", header_len, " exceeds the file (", size, " bytes): truncated file?");
  Json header;
  try {
    header = Json::parse(reinterpret_cast<const char*>(file->data()) + 8,
                         reinterpret_cast<const char*>(file->data()) + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": safetensors header is not valid JSON: ", printable(e.what()));
  }
  if (!header.is_object()) fail(path, ": safetensors header must be a JSON object");
  const size_t data_begin = 8 + header_len;
  const uint64_t data_size = size - data_begin;

  SafetensorsContents out;
  out.mapped_bytes = size;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const Json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) fail(path, ": __metadata__ must be an object");
      out.metadata = e;
      continue;
    }
    const std::string where = path + ": tensor \"" + name + "\"";
    if (!e.is_object()) fail(where, ": header entry must be an object");
    const std::string dtype_str = json_required<std::string>(e, "dtype", where);
    DType dtype;
    if (!dtype_from_name(dtype_str, &dtype)) fail(where, ": unsupported dtype \"", dtype_str, "\"");
    const Json& shape_j = e.contains("shape") ? e["shape"] : Json();
    if (!shape_j.is_array()) fail(where, ": \"shape\" must be an array");
    Shape shape;
    uint64_t numel = 1;
    for (const auto& d : shape_j) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) fail(where, ": shape entries must be non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      if (mul_overflows(numel, dim, &numel)) fail(where, ": shape ", shape_j.dump(), " overflows");
      shape.push_back(static_cast<int64_t>(dim));
    }
    const Json& off = e.contains("data_offsets") ? e["data_offsets"] : Json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(where, ": \"data_offsets\" must be two non-negative integers");
    const uint64_t begin = off[0].get<uint64_t>();
    const uint64_t end = off[1].get<uint64_t>();
    if (begin > end || end > data_size)
      fail(where, ": data_offsets [", begin, ", ", end, ") are outside the data section (", data_size,
           " bytes): truncated or corrupt file");
    uint64_t nbytes;
    if (mul_overflows(numel, dtype_size(dtype), &nbytes) || nbytes != end - begin)
      fail(where, ": shape ", shape_str(shape), " of ", dtype_str, " needs ", numel * dtype_size(dtype),
           " bytes but data_offsets hold ", end - begin);
    const size_t abs = data_begin + begin;
    Tensor t(make_mapped_storage(file, abs, nbytes), 0, shape, dtype);
    // Kernels read elements with aligned loads only when aligned; a tensor whose offset is
    // not a multiple of its element size is copied out of the mapping instead.
    if (reinterpret_cast<uintptr_t>(file->data() + abs) % dtype_size(dtype) != 0) t = t.clone();
    out.tensors.emplace(name, std::move(t));
  }
  return out;
}

SafetensorsContents read_checkpoint_tensors(const std::string& dir) {
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (file_exists(single)) return read_safetensors(single);
  if (!file_exists(index_path))
    fail(dir, ": no model.safetensors or model.safetensors.index.json");
  const Json index = read_json_file(index_path);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    fail(index_path, ": missing \"weight_map\" object");
  std::map<std::string, std::vector<std::string>> by_shard;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string()) fail(index_path, ": weight_map entry \"", it.key(), "\" must name a file");
    const std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos)
      fail(index_path, ": weight_map entry \"", it.key(), "\" names a bad shard \"", shard, "\"");
    by_shard[shard].push_back(it.key());
  }
  if (by_shard.empty()) fail(index_path, ": empty weight_map");
  SafetensorsContents out;
  for (const auto& [shard, names] : by_shard) {
    SafetensorsContents part = read_safetensors(dir + "/" + shard);
    out.mapped_bytes += part.mapped_bytes;
    for (const auto& name : names) {
      auto t = part.tensors.find(name);
      if (t == part.tensors.end())
        fail(index_path, ": tensor \"", name, "\" is listed in shard ", shard, " but that file does not hold it");
      out.tensors[name] = t->second;
    }
    if (out.metadata.empty()) out.metadata = part.metadata;
  }
  return out;
}

namespace {
constexpr uint64_t kDataAlign = 64;  // a cache line, and the widest vector load (zmm)
}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const Json& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  // Tensors whose size is a multiple of 64 bytes go first, so that with the data section
  // starting on a 64-byte boundary each of them does too (vector loads of a mapped weight
  // never split a cache line); the rest follow in the given order. The offsets leave no holes,
  // as the format asks.
  std::vector<const std::pair<std::string, Tensor>*> order;
  for (const auto& e : tensors)
    if (e.second.defined() && e.second.nbytes() % kDataAlign == 0) order.push_back(&e);
  for (const auto& e : tensors)
    if (!e.second.defined() || e.second.nbytes() % kDataAlign != 0) order.push_back(&e);
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  std::set<std::string> seen;
  for (const auto* entry : order) {
    const auto& [name, t] = *entry;
    ASTRAI_CHECK(t.defined(), path, ": tensor \"", name, "\" is undefined");
    ASTRAI_CHECK(t.device() == Device::kCpu, path, ": tensor \"", name, "\" is not in host memory");
    ASTRAI_CHECK(seen.insert(name).second, path, ": duplicate tensor name \"", name, "\"");
    ASTRAI_CHECK(name != "__metadata__", path, ": reserved tensor name");
    offsets.push_back(offset);
    // A block type (Q8_0) has no safetensors dtype: it is stored as U8, the last dimension in
    // bytes (docs/quantization.md).
    Shape shape = t.shape();
    const bool blocks = dtype_block(t.dtype()) > 1;
    if (blocks) shape.back() = static_cast<int64_t>(dtype_bytes(t.dtype(), shape.back()));
    header[name] = {{"dtype", std::string(dtype_name(blocks ? DType::kU8 : t.dtype()))},
                    {"shape", shape},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string head = header.dump();
  while ((8 + head.size()) % kDataAlign != 0) head.push_back(' ');  // the format allows trailing spaces

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create ", tmp, ": ", std::strerror(errno));
  auto write_all = [&](const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        fail("cannot write ", tmp, ": ", std::strerror(err));
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  };
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>((head.size() >> (8 * i)) & 0xff);
  write_all(len, 8);
  write_all(head.data(), head.size());
  for (const auto* entry : order) write_all(entry->second.raw(), entry->second.nbytes());
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail("cannot flush ", tmp, ": ", std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail("cannot rename ", tmp, " to ", path, ": ", std::strerror(err));
  }
}

}  // namespace astrai::model
