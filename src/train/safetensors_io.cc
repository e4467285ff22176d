#include "train/safetensors_io.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "base/files.h"
#include "base/mapped_file.h"

namespace astrai::train {

void write_safetensors_f32(const std::string& path, const std::vector<NamedBlob>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  size_t offset = 0;
  for (const auto& t : tensors) {
    const size_t bytes = static_cast<size_t>(shape_numel(t.shape)) * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string h = header.dump();
  while ((8 + h.size()) % 64 != 0) h.push_back(' ');  // the data on a cache line, as model::write_safetensors
  std::string out;
  out.reserve(8 + h.size() + offset);
  const uint64_t hlen = h.size();
  out.append(reinterpret_cast<const char*>(&hlen), 8);
  out += h;
  for (const auto& t : tensors)
    out.append(reinterpret_cast<const char*>(t.data), static_cast<size_t>(shape_numel(t.shape)) * sizeof(float));
  write_file_atomic(path, out);
}

std::map<std::string, Tensor> read_safetensors(const std::string& path) {
  auto file = std::make_shared<const MappedFile>(path);
  ASTRAI_CHECK(file->size() >= 8, path, ": not a safetensors file (too short)");
  uint64_t hlen;
  std::memcpy(&hlen, file->data(), 8);
  ASTRAI_CHECK(hlen <= file->size() - 8, path, ": safetensors header length ", hlen, " exceeds the file");
  Json header;
  try {
    header = Json::parse(std::string_view(reinterpret_cast<const char*>(file->data()) + 8, hlen));
  } catch (const Json::exception& e) {
    fail(path, ": bad safetensors header: ", e.what());
  }
  const size_t base = 8 + hlen;
  std::map<std::string, Tensor> out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string where = path + ": tensor " + it.key();
    DType dt;
    ASTRAI_CHECK(dtype_from_name(json_required<std::string>(*it, "dtype", where), &dt), where, ": unknown dtype");
    const auto shape = json_required<Shape>(*it, "shape", where);
    const auto offs = json_required<std::vector<size_t>>(*it, "data_offsets", where);
    ASTRAI_CHECK(offs.size() == 2 && offs[0] <= offs[1], where, ": bad data_offsets");
    ASTRAI_CHECK(offs[1] - offs[0] == static_cast<size_t>(shape_numel(shape)) * dtype_size(dt), where,
                 ": byte size does not match shape and dtype");
    ASTRAI_CHECK(base + offs[1] <= file->size(), where, ": data beyond the end of the file");
    out.emplace(it.key(), Tensor(make_mapped_storage(file, base + offs[0], offs[1] - offs[0]), 0, shape, dt));
  }
  return out;
}

std::map<std::string, Tensor> read_safetensors_dir(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  ASTRAI_CHECK(!ec, dir, ": cannot list directory: ", ec.message());
  ASTRAI_CHECK(!files.empty(), dir, ": no .safetensors files");
  std::sort(files.begin(), files.end());
  std::map<std::string, Tensor> all;
  for (const auto& f : files)
    for (auto& [k, v] : read_safetensors(f)) all.emplace(k, v);
  return all;
}

}  // namespace astrai::train
