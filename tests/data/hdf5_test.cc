#include "data/hdf5.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdlib>
#include <filesystem>

#include "base/files.h"
#include "test_util.h"

namespace astrai::data {
namespace {

using ::testing::HasSubstr;
using testing::error_of;
using testing::ScratchDir;

// Writes a file the way the reference's save_h5 does with h5py: a group per key, gzip
// compressed 1-D datasets data_0, data_1, ..., an attribute num_tensors. Token ids are int64
// (torch.long), masks numpy bool (an HDF5 enum over int8), rewards float32.
class RefFile {
 public:
  explicit RefFile(const std::string& path) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(file_, 0);
  }
  ~RefFile() { H5Fclose(file_); }

  void group_i64(const std::string& key, const std::vector<std::vector<int64_t>>& tensors) {
    write_group(key, tensors.size(), [&](size_t i, hid_t g, const std::string& name) {
      dataset(g, name, H5T_STD_I64LE, H5T_NATIVE_INT64, tensors[i].size(), tensors[i].data());
    });
  }
  void group_bool(const std::string& key, const std::vector<std::vector<int8_t>>& tensors) {
    hid_t t = H5Tenum_create(H5T_NATIVE_INT8);
    int8_t f = 0, tr = 1;
    H5Tenum_insert(t, "FALSE", &f);
    H5Tenum_insert(t, "TRUE", &tr);
    write_group(key, tensors.size(), [&](size_t i, hid_t g, const std::string& name) {
      dataset(g, name, t, t, tensors[i].size(), tensors[i].data());
    });
    H5Tclose(t);
  }
  void group_f32(const std::string& key, const std::vector<std::vector<float>>& tensors) {
    write_group(key, tensors.size(), [&](size_t i, hid_t g, const std::string& name) {
      dataset(g, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, tensors[i].size(), tensors[i].data());
    });
  }
  void dataset_2d(const std::string& name) {
    hsize_t dims[2] = {2, 3};
    hid_t space = H5Screate_simple(2, dims, nullptr);
    hid_t ds = H5Dcreate2(file_, name.c_str(), H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int32_t v[6] = {1, 2, 3, 4, 5, 6};
    H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    H5Dclose(ds);
    H5Sclose(space);
  }

 private:
  template <typename Fn>
  void write_group(const std::string& key, size_t n, Fn&& fn) {
    hid_t g = H5Gcreate2(file_, key.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t aspace = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(g, "num_tensors", H5T_STD_I64LE, aspace, H5P_DEFAULT, H5P_DEFAULT);
    const int64_t count = static_cast<int64_t>(n);
    H5Awrite(attr, H5T_NATIVE_INT64, &count);
    H5Aclose(attr);
    H5Sclose(aspace);
    for (size_t i = 0; i < n; ++i) fn(i, g, "data_" + std::to_string(i));
    H5Gclose(g);
  }
  void dataset(hid_t g, const std::string& name, hid_t ftype, hid_t mtype, size_t n, const void* data) {
    const hsize_t dims = n;
    hid_t space = H5Screate_simple(1, &dims, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (n > 0) {
      H5Pset_chunk(dcpl, 1, &dims);
      H5Pset_deflate(dcpl, 4);
    }
    hid_t ds = H5Dcreate2(g, name.c_str(), ftype, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (n > 0) H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
  }
  hid_t file_ = -1;
};

std::vector<int32_t> all_i32(const ShardKey& k) {
  std::vector<int32_t> v(static_cast<size_t>(k.length));
  k.read_i32(0, k.length, v.data());
  return v;
}

TEST(Hdf5, ImportsTheReferenceLayout) {
  ScratchDir tmp;
  // 12 tensors so natural order matters (data_10 after data_9, not after data_1).
  std::vector<std::vector<int64_t>> seq;
  std::vector<std::vector<int8_t>> mask;
  std::vector<int32_t> flat_seq, flat_mask;
  for (int i = 0; i < 12; ++i) {
    std::vector<int64_t> t;
    std::vector<int8_t> m;
    for (int k = 0; k <= i % 4; ++k) {
      t.push_back(i * 100 + k);
      m.push_back(static_cast<int8_t>((i + k) % 2));
      flat_seq.push_back(i * 100 + k);
      flat_mask.push_back((i + k) % 2);
    }
    seq.push_back(t);
    mask.push_back(m);
  }
  {
    RefFile f(tmp.path("part-a.h5"));
    f.group_i64("sequence", seq);
    f.group_bool("loss_mask", mask);
    f.group_f32("rewards", {{0.25f}, {-1.5f, 2.0f}, {}});
  }
  {
    RefFile f(tmp.path("part-b.h5"));
    f.group_i64("sequence", {{7, 8, 9}});
    f.group_bool("loss_mask", {{1, 1, 0}});
  }
  flat_seq.insert(flat_seq.end(), {7, 8, 9});
  flat_mask.insert(flat_mask.end(), {1, 1, 0});
  std::filesystem::create_directory(tmp.path("in"));
  std::filesystem::rename(tmp.path("part-a.h5"), tmp.path("in/part-a.h5"));
  std::filesystem::rename(tmp.path("part-b.h5"), tmp.path("in/part-b.h5"));
  size_t progress_calls = 0;
  Hdf5ImportOptions o;
  o.progress = [&](size_t done, size_t total) {
    ++progress_calls;
    EXPECT_EQ(total, 2u);
    EXPECT_EQ(done, progress_calls);
  };
  const Json meta = import_hdf5({tmp.path("in")}, tmp.path("ds"), o);
  EXPECT_EQ(progress_calls, 2u);
  EXPECT_EQ(meta["kind"], "imported");
  EXPECT_EQ(meta["source"]["files"].size(), 2u);

  const Shards s = Shards::open(tmp.path("ds"));
  const ShardKey& sk = s.key("sequence");
  EXPECT_EQ(sk.dtype, DType::kI32);
  EXPECT_TRUE(sk.token_ids);
  EXPECT_EQ(sk.records(), 13);
  EXPECT_EQ(all_i32(sk), flat_seq);
  EXPECT_EQ(sk.record_end(10) - sk.record_begin(10), 3);  // data_10 has i % 4 + 1 = 3 elements
  EXPECT_EQ(sk.at_i32(sk.record_begin(10)), 1000);
  EXPECT_EQ(s.key("loss_mask").dtype, DType::kU8);
  EXPECT_FALSE(s.key("loss_mask").token_ids);
  EXPECT_EQ(all_i32(s.key("loss_mask")), flat_mask);
  const ShardKey& rk = s.key("rewards");
  EXPECT_EQ(rk.dtype, DType::kF32);
  ASSERT_EQ(rk.records(), 3);
  EXPECT_EQ(rk.record_end(2) - rk.record_begin(2), 0);
  float r[3];
  rk.read_f32(0, 3, r);
  EXPECT_EQ(r[0], 0.25f);
  EXPECT_EQ(r[1], -1.5f);
  EXPECT_EQ(r[2], 2.0f);
  ASSERT_EQ(s.groups().size(), 1u);
  EXPECT_EQ(s.groups()[0], (std::vector<std::string>{"sequence", "loss_mask"}));
  EXPECT_NO_THROW(s.check_vocab(1200));
  EXPECT_THAT(error_of([&] { s.check_vocab(1000); }), HasSubstr("element 23 (record 10) is token id 1000"));
}

TEST(Hdf5, ExportThenImportRoundTrips) {
  ScratchDir tmp;
  {
    ShardWriter w(tmp.path("a"));
    w.add_key("chosen", DType::kI32, true);
    w.add_key("chosen_mask", DType::kU8);
    w.add_key("reward", DType::kF32);
    w.add_record("chosen", std::vector<int32_t>{1, 2, 3});
    w.add_record("chosen", std::vector<int32_t>{});
    w.add_record("chosen", std::vector<int32_t>{40000, 5});
    w.add_record("chosen_mask", std::vector<int32_t>{0, 1, 1});
    w.add_record("chosen_mask", std::vector<int32_t>{});
    w.add_record("chosen_mask", std::vector<int32_t>{1, 1});
    w.add_record("reward", std::vector<float>{3.5f});
    w.add_group({"chosen", "chosen_mask"});
    w.finish();
  }
  const Shards a = Shards::open(tmp.path("a"));
  export_hdf5(a, tmp.path("a.h5"));
  import_hdf5({tmp.path("a.h5")}, tmp.path("b"));
  const Shards b = Shards::open(tmp.path("b"));
  EXPECT_EQ(b.key_names(), a.key_names());
  for (const auto& name : a.key_names()) {
    const ShardKey& ka = a.key(name);
    const ShardKey& kb = b.key(name);
    EXPECT_EQ(kb.dtype, ka.dtype) << name;
    EXPECT_EQ(kb.token_ids, ka.token_ids) << name;
    ASSERT_EQ(kb.records(), ka.records()) << name;
    for (int64_t r = 0; r <= ka.records(); ++r) EXPECT_EQ(kb.offsets()[r], ka.offsets()[r]);
    EXPECT_EQ(read_file(tmp.path("b/" + name + ".bin")), read_file(tmp.path("a/" + name + ".bin"))) << name;
  }
  EXPECT_EQ(b.groups(), a.groups());
}

TEST(Hdf5, BadInputsAreClearErrors) {
  ScratchDir tmp;
  write_file_atomic(tmp.path("not.h5"), "plain text, not HDF5");
  EXPECT_THAT(error_of([&] { import_hdf5({tmp.path("not.h5")}, tmp.path("o1")); }), HasSubstr("not an HDF5 file"));
  EXPECT_THAT(error_of([&] { import_hdf5({tmp.path("missing.h5")}, tmp.path("o2")); }),
              HasSubstr("no such file or directory"));
  {
    RefFile f(tmp.path("2d.h5"));
    f.dataset_2d("sequence");
  }
  EXPECT_THAT(error_of([&] { import_hdf5({tmp.path("2d.h5")}, tmp.path("o3")); }), HasSubstr("expected a 1-D tensor"));
  {
    RefFile f(tmp.path("mismatch.h5"));
    f.group_i64("sequence", {{1, 2, 3}});
    f.group_bool("loss_mask", {{1, 1}});
  }
  EXPECT_THAT(error_of([&] { import_hdf5({tmp.path("mismatch.h5")}, tmp.path("o4")); }),
              HasSubstr("different record boundaries"));
  {
    RefFile f(tmp.path("big.h5"));
    f.group_i64("sequence", {{int64_t{1} << 40}});
  }
  EXPECT_THAT(error_of([&] { import_hdf5({tmp.path("big.h5")}, tmp.path("o5")); }), HasSubstr("does not fit int32"));
  // Nothing half-written was left behind by the failures.
  for (const char* d : {"o1", "o2", "o3", "o4", "o5"}) EXPECT_FALSE(file_exists(tmp.path(d))) << d;
}

}  // namespace
}  // namespace astrai::data
