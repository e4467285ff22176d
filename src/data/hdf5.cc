#include "data/hdf5.h"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "base/error.h"

namespace astrai::data {

namespace fs = std::filesystem;

namespace {

// Silences HDF5's own error-stack printing once per process: every failure is turned into
// an astrai::Error naming the file and object instead.
void quiet_hdf5() {
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

// Owns one HDF5 identifier and closes it with the right function.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

std::vector<std::string> member_names(hid_t group, const std::string& where) {
  H5G_info_t info;
  ASTRAI_CHECK(H5Gget_info(group, &info) >= 0, where, ": cannot list group members");
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    ASTRAI_CHECK(len >= 0, where, ": cannot read member name ", i);
    std::string name(static_cast<size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(static_cast<size_t>(len));
    names.push_back(name);
  }
  return names;
}

// "data_10" sorts after "data_9": compare the non-digit prefix, then the trailing number.
bool natural_less(const std::string& a, const std::string& b) {
  auto split = [](const std::string& s) {
    size_t i = s.size();
    while (i > 0 && std::isdigit(static_cast<unsigned char>(s[i - 1]))) --i;
    return std::make_pair(s.substr(0, i), s.substr(i));
  };
  const auto [pa, na] = split(a);
  const auto [pb, nb] = split(b);
  if (pa != pb) return a < b;
  if (na.size() != nb.size()) return na.size() < nb.size();
  return na < nb;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_mask_key(const std::string& key) { return ends_with(key, "mask") || ends_with(key, "masks"); }

struct Column {
  bool is_float = false;
  std::vector<int64_t> ints;
  std::vector<float> floats;
};

// Reads a 1-D dataset (a scalar counts as one element) into ints or floats.
Column read_column(hid_t file, const std::string& path, const std::string& where) {
  Handle ds(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  ASTRAI_CHECK(ds.valid(), where, ": cannot open dataset");
  Handle space(H5Dget_space(ds.get()), H5Sclose);
  ASTRAI_CHECK(space.valid(), where, ": cannot read the dataspace");
  const int rank = H5Sget_simple_extent_ndims(space.get());
  ASTRAI_CHECK(rank == 0 || rank == 1, where, ": expected a 1-D tensor, found ", rank, " dimensions");
  hsize_t n = 1;
  if (rank == 1) H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  Handle ftype(H5Dget_type(ds.get()), H5Tclose);
  ASTRAI_CHECK(ftype.valid(), where, ": cannot read the element type");
  const H5T_class_t cls = H5Tget_class(ftype.get());
  Column col;
  if (n == 0) {
    col.is_float = cls == H5T_FLOAT;
    return col;
  }
  if (cls == H5T_FLOAT) {
    col.is_float = true;
    col.floats.resize(n);
    ASTRAI_CHECK(H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, col.floats.data()) >= 0, where,
                 ": cannot read (corrupt data or missing filter)");
    return col;
  }
  if (cls == H5T_INTEGER) {
    col.ints.resize(n);
    ASTRAI_CHECK(H5Dread(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, col.ints.data()) >= 0, where,
                 ": cannot read (corrupt data or missing filter)");
    return col;
  }
  if (cls == H5T_ENUM) {
    // numpy/h5py bool is an enum over int8; HDF5 cannot convert enum -> integer, so read the
    // enum in its native form and interpret the raw base integers.
    Handle mtype(H5Tget_native_type(ftype.get(), H5T_DIR_ASCEND), H5Tclose);
    Handle base(H5Tget_super(ftype.get()), H5Tclose);
    ASTRAI_CHECK(mtype.valid() && base.valid(), where, ": cannot read the enum type");
    const size_t size = H5Tget_size(mtype.get());
    const bool is_signed = H5Tget_sign(base.get()) == H5T_SGN_2;
    ASTRAI_CHECK(size == 1 || size == 2 || size == 4 || size == 8, where, ": unsupported enum size ", size);
    std::vector<uint8_t> raw(n * size);
    ASTRAI_CHECK(H5Dread(ds.get(), mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()) >= 0, where,
                 ": cannot read (corrupt data or missing filter)");
    col.ints.resize(n);
    for (hsize_t i = 0; i < n; ++i) {
      const uint8_t* p = raw.data() + i * size;
      int64_t v = 0;
      switch (size) {
        case 1: v = is_signed ? static_cast<int8_t>(*p) : *p; break;
        case 2: { int16_t s; uint16_t u; std::memcpy(&s, p, 2); std::memcpy(&u, p, 2); v = is_signed ? s : u; break; }
        case 4: { int32_t s; uint32_t u; std::memcpy(&s, p, 4); std::memcpy(&u, p, 4); v = is_signed ? s : static_cast<int64_t>(u); break; }
        default: std::memcpy(&v, p, 8); break;
      }
      col.ints[i] = v;
    }
    return col;
  }
  fail(where, ": unsupported element type (class ", static_cast<int>(cls), "); expected integer, float or bool");
}

std::vector<std::string> collect_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    ASTRAI_CHECK(fs::exists(in, ec), "HDF5 import: ", in, ": no such file or directory");
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::recursive_directory_iterator(in)) {
        const std::string ext = e.path().extension().string();
        if (e.is_regular_file() && (ext == ".h5" || ext == ".hdf5")) found.push_back(e.path().string());
      }
      std::sort(found.begin(), found.end());
      ASTRAI_CHECK(!found.empty(), "HDF5 import: ", in, ": no .h5 or .hdf5 files");
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(in);
    }
  }
  return files;
}

}  // namespace

Json import_hdf5(const std::vector<std::string>& inputs, const std::string& out_dir, const Hdf5ImportOptions& options) {
  quiet_hdf5();
  ASTRAI_CHECK(!inputs.empty(), "HDF5 import: no input files");
  const std::vector<std::string> files = collect_files(inputs);
  std::set<std::string> token_keys{"sequence", "chosen", "rejected", "prompt", "prompts", "response",
                                   "responses", "input_ids", "tokens"};
  token_keys.insert(options.token_keys.begin(), options.token_keys.end());

  ShardWriter writer(out_dir, options.overwrite);
  std::map<std::string, bool> key_is_float;
  Json sources = Json::array();
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string& path = files[f];
    ASTRAI_CHECK(H5Fis_hdf5(path.c_str()) > 0, "HDF5 import: ", path, " is not an HDF5 file");
    Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    ASTRAI_CHECK(file.valid(), "HDF5 import: cannot open ", path);
    int64_t file_records = 0;
    for (const std::string& key : member_names(file.get(), path)) {
      const std::string where_key = path + ":/" + key;
      Handle obj(H5Oopen(file.get(), key.c_str(), H5P_DEFAULT), H5Oclose);
      ASTRAI_CHECK(obj.valid(), where_key, ": cannot open");
      std::vector<std::string> datasets;
      const H5I_type_t type = H5Iget_type(obj.get());
      if (type == H5I_GROUP) {
        for (const auto& m : member_names(obj.get(), where_key)) datasets.push_back(key + "/" + m);
        std::sort(datasets.begin(), datasets.end(), natural_less);
      } else if (type == H5I_DATASET) {
        datasets.push_back(key);  // a bare dataset at the root: one record
      } else {
        fail(where_key, ": expected a group of tensors or a dataset");
      }
      obj.reset();
      for (const auto& ds_path : datasets) {
        const std::string where = path + ":/" + ds_path;
        Column col = read_column(file.get(), ds_path, where);
        if (!writer.has_key(key)) {
          DType dtype = DType::kI32;
          bool tokens = false;
          if (col.is_float) {
            dtype = DType::kF32;
          } else if (is_mask_key(key)) {
            dtype = DType::kU8;
          } else {
            tokens = token_keys.count(key) != 0;
          }
          writer.add_key(key, dtype, tokens);
          key_is_float[key] = col.is_float;
        }
        const bool want_float = key_is_float[key];
        if (col.is_float && !want_float) {
          fail(where, ": float tensor in integer key \"", key, "\"");
        }
        try {
          if (want_float) {
            if (col.is_float) {
              writer.add_record(key, col.floats);
            } else {
              std::vector<float> fl(col.ints.begin(), col.ints.end());
              writer.add_record(key, fl);
            }
          } else {
            std::vector<int32_t> v(col.ints.size());
            for (size_t i = 0; i < v.size(); ++i) {
              ASTRAI_CHECK(col.ints[i] >= INT32_MIN && col.ints[i] <= INT32_MAX, "value ", col.ints[i],
                           " does not fit int32");
              v[i] = static_cast<int32_t>(col.ints[i]);
            }
            writer.add_record(key, v);
          }
        } catch (const Error& e) {
          fail(where, ": ", e.what());
        }
        ++file_records;
      }
    }
    sources.push_back(Json{{"file", fs::absolute(path).string()}, {"records", file_records}});
    if (options.progress) options.progress(f + 1, files.size());
  }
  for (const auto& group : std::vector<std::vector<std::string>>{
           {"sequence", "loss_mask", "position_ids"}, {"chosen", "chosen_mask"}, {"rejected", "rejected_mask"}}) {
    std::vector<std::string> present;
    for (const auto& k : group)
      if (writer.has_key(k)) present.push_back(k);
    if (present.size() >= 2) writer.add_group(present);
  }
  writer.finish(Json{{"kind", "imported"}, {"source", {{"format", "hdf5"}, {"files", sources}}}});
  return read_json_file(out_dir + "/meta.json");
}

void export_hdf5(const Shards& shards, const std::string& path) {
  quiet_hdf5();
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    ASTRAI_CHECK(file.valid(), "HDF5 export: cannot create ", tmp);
    for (const auto& name : shards.key_names()) {
      const ShardKey& k = shards.key(name);
      Handle group(H5Gcreate2(file.get(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      ASTRAI_CHECK(group.valid(), "HDF5 export: cannot create group ", name);
      hid_t ftype = H5T_STD_I32LE, mtype = H5T_NATIVE_INT32;
      switch (k.dtype) {
        case DType::kI32: break;
        case DType::kI64: ftype = H5T_STD_I64LE; mtype = H5T_NATIVE_INT64; break;
        case DType::kU16: ftype = H5T_STD_U16LE; mtype = H5T_NATIVE_UINT16; break;
        case DType::kU8:
        case DType::kBool: ftype = H5T_STD_U8LE; mtype = H5T_NATIVE_UINT8; break;
        case DType::kI8: ftype = H5T_STD_I8LE; mtype = H5T_NATIVE_INT8; break;
        case DType::kF32: ftype = H5T_IEEE_F32LE; mtype = H5T_NATIVE_FLOAT; break;
        default: fail("HDF5 export: key \"", name, "\" has unsupported dtype");
      }
      const int64_t records = k.records();
      {
        Handle aspace(H5Screate(H5S_SCALAR), H5Sclose);
        Handle attr(H5Acreate2(group.get(), "num_tensors", H5T_STD_I64LE, aspace.get(), H5P_DEFAULT, H5P_DEFAULT),
                    H5Aclose);
        ASTRAI_CHECK(attr.valid() && H5Awrite(attr.get(), H5T_NATIVE_INT64, &records) >= 0,
                     "HDF5 export: cannot write num_tensors of ", name);
      }
      const size_t esize = dtype_size(k.dtype);
      for (int64_t r = 0; r < records; ++r) {
        const hsize_t n = static_cast<hsize_t>(k.record_end(r) - k.record_begin(r));
        Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
        Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
        if (n > 0) {
          const hsize_t chunk = std::min<hsize_t>(n, 1 << 16);
          H5Pset_chunk(dcpl.get(), 1, &chunk);
          H5Pset_deflate(dcpl.get(), 4);
        }
        const std::string ds_name = "data_" + std::to_string(r);
        Handle ds(H5Dcreate2(group.get(), ds_name.c_str(), ftype, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                  H5Dclose);
        ASTRAI_CHECK(ds.valid(), "HDF5 export: cannot create ", name, "/", ds_name);
        if (n > 0) {
          const void* src = k.data->data() + static_cast<size_t>(k.record_begin(r)) * esize;
          ASTRAI_CHECK(H5Dwrite(ds.get(), mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, src) >= 0, "HDF5 export: cannot write ",
                       name, "/", ds_name);
        }
      }
    }
    ASTRAI_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL) >= 0, "HDF5 export: cannot flush ", tmp);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    fail("HDF5 export: cannot rename ", tmp, " to ", path);
  }
}

}  // namespace astrai::data
