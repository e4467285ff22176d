// The GGUF header parser (base/gguf_file.h) on files built byte by byte here: every value type,
// arrays, alignment, tensor records, and each kind of corruption as a clear error. (Files written by
// llama.cpp's own gguf-py are read in tests/model/gguf_oracle.py.)
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "base/error.h"
#include "base/files.h"
#include "base/gguf_file.h"

namespace astrai {
namespace {

// Little-endian GGUF bytes.
struct Writer {
  std::string b;
  template <typename T>
  Writer& put(T v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Writer& str(const std::string& s) {
    put<uint64_t>(s.size());
    b += s;
    return *this;
  }
};

// A v3 file: 6 keys of several types, then two tensors (an F32 [3] and a Q8_0 [32, 2]).
std::string sample(uint32_t alignment = 32) {
  Writer w;
  w.put<uint32_t>(0x46554747).put<uint32_t>(3).put<uint64_t>(2).put<uint64_t>(alignment == 32 ? 6 : 7);
  w.str("general.architecture").put<uint32_t>(8).str("llama");
  w.str("llama.block_count").put<uint32_t>(4).put<uint32_t>(2);
  w.str("llama.rope.freq_base").put<uint32_t>(6).put<float>(10000.0f);
  w.str("tokenizer.ggml.add_bos_token").put<uint32_t>(7).put<uint8_t>(1);
  w.str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2).str("a").str("bc");
  w.str("x.i64").put<uint32_t>(11).put<int64_t>(-5);
  if (alignment != 32) w.str("general.alignment").put<uint32_t>(4).put<uint32_t>(alignment);
  w.str("norm.weight").put<uint32_t>(1).put<uint64_t>(3).put<uint32_t>(0).put<uint64_t>(0);
  w.str("blk.0.attn_q.weight").put<uint32_t>(2).put<uint64_t>(32).put<uint64_t>(2).put<uint32_t>(8);
  w.put<uint64_t>(alignment);  // the F32 tensor's 12 bytes fit in the first aligned slot
  while (w.b.size() % alignment) w.b.push_back('\0');
  w.b.append(alignment + 2 * 34, '\x01');
  return w.b;
}

std::string write(const std::string& name, const std::string& bytes) {
  const std::string path = std::string(::testing::TempDir()) + name;
  write_file_atomic(path, bytes);
  return path;
}

void expect_error(const std::string& bytes, const std::string& needle) {
  const std::string path = write("astrai_gguf_bad.gguf", bytes);
  try {
    read_gguf(path);
    ADD_FAILURE() << "expected an error containing \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

TEST(GgufFile, ReadsMetadataAndTensorRecords) {
  for (uint32_t alignment : {32u, 64u}) {
    const std::string bytes = sample(alignment);
    const std::string path = write("astrai_gguf_ok.gguf", bytes);
    EXPECT_TRUE(is_gguf_file(path));
    const GgufFile g = read_gguf(path);
    EXPECT_EQ(g.version, 3u);
    EXPECT_EQ(g.metadata["general.architecture"], "llama");
    EXPECT_EQ(g.metadata["llama.block_count"], 2);
    EXPECT_EQ(g.metadata["llama.rope.freq_base"].get<float>(), 10000.0f);
    EXPECT_EQ(g.metadata["tokenizer.ggml.add_bos_token"], true);
    EXPECT_EQ(g.metadata["tokenizer.ggml.tokens"], Json::array({"a", "bc"}));
    EXPECT_EQ(g.metadata["x.i64"], -5);
    ASSERT_EQ(g.tensors.size(), 2u);
    EXPECT_EQ(g.data_begin % alignment, 0u);
    EXPECT_EQ(g.tensors[0].name, "norm.weight");
    EXPECT_EQ(g.tensors[0].dims, std::vector<int64_t>{3});
    EXPECT_EQ(g.tensors[0].offset, g.data_begin);
    EXPECT_EQ(g.tensors[1].ggml_type, 8u);
    EXPECT_EQ(g.tensors[1].dims, (std::vector<int64_t>{32, 2}));
    EXPECT_EQ(g.tensors[1].offset, g.data_begin + alignment);
    std::remove(path.c_str());
  }
}

TEST(GgufFile, CorruptFilesAreClearErrors) {
  const std::string good = sample();
  expect_error(good.substr(0, 3), "truncated");
  std::string bad = good;
  bad[0] = 'X';
  expect_error(bad, "not a GGUF file");
  bad = good;
  bad[4] = 9;
  expect_error(bad, "version 9");
  for (size_t cut : {20ul, 60ul, 150ul, 260ul}) expect_error(good.substr(0, cut), "truncated");
  // A string length far beyond the file.
  bad = good;
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(&bad[24], &huge, 8);
  expect_error(bad, "corrupt");
  // An unknown value type for the first key.
  bad = good;
  const uint32_t type = 99;
  std::memcpy(&bad[24 + 8 + std::strlen("general.architecture")], &type, 4);
  expect_error(bad, "unknown value type 99");
  // A tensor offset that is not aligned, and one past the end.
  bad = good;
  const size_t at = bad.find("blk.0.attn_q.weight") + std::strlen("blk.0.attn_q.weight") + 4 + 16 + 4;
  uint64_t off = 33;
  std::memcpy(&bad[at], &off, 8);
  expect_error(bad, "not a multiple of 32");
  off = 1 << 20;
  std::memcpy(&bad[at], &off, 8);
  expect_error(bad, "past the end");
  // A duplicate tensor name.
  bad = good;
  const size_t second = bad.find("blk.0.attn_q.weight");
  bad.replace(second, std::strlen("blk.0.attn_q.weight"), "norm.weightXXXXXXXX");
  bad.replace(second - 8, 8, std::string("\x0b\0\0\0\0\0\0\0", 8));
  // The record now reads "norm.weight" and the rest is garbage: some error, never a crash.
  const std::string path = write("astrai_gguf_dup.gguf", bad);
  EXPECT_THROW(read_gguf(path), Error);
  std::remove(path.c_str());
}

TEST(GgufFile, IsGgufFileIsFalseForDirectoriesAndOtherFiles) {
  EXPECT_FALSE(is_gguf_file(std::string(::testing::TempDir())));
  const std::string path = write("astrai_gguf_not.json", "{\"a\": 1}");
  EXPECT_FALSE(is_gguf_file(path));
  EXPECT_FALSE(is_gguf_file("/nonexistent/model.gguf"));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace astrai
