#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "base/error.h"
#include "base/files.h"
#include "base/json.h"
#include "base/mapped_file.h"

namespace astrai {
namespace {

std::string temp_path(const char* name) { return std::string(::testing::TempDir()) + name; }

TEST(Files, AtomicWriteThenMapReadsTheSameBytes) {
  const std::string path = temp_path("astrai_base_test.bin");
  write_file_atomic(path, std::string("hello\0world", 11));
  MappedFile file(path);
  ASSERT_EQ(file.size(), 11u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file.data()), file.size()), std::string("hello\0world", 11));
  EXPECT_EQ(read_file(path), std::string("hello\0world", 11));
  std::remove(path.c_str());
}

TEST(Files, MissingFileErrorNamesThePath) {
  try {
    MappedFile file("/nonexistent/astrai.bin");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/astrai.bin"), std::string::npos);
  }
}

TEST(Json, RequiredFieldErrorsNameFieldAndFile) {
  const Json j = Json::parse(R"({"a": 1, "b": "x"})");
  EXPECT_EQ(json_required<int>(j, "a", "cfg.json"), 1);
  EXPECT_EQ(json_optional<int>(j, "z", 7, "cfg.json"), 7);
  try {
    json_required<int>(j, "b", "cfg.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"b\""), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos);
  }
  EXPECT_THROW(json_required<int>(j, "missing", "cfg.json"), Error);
}

TEST(Json, InvalidFileIsAClearError) {
  const std::string path = temp_path("astrai_bad.json");
  write_file_atomic(path, "{not json");
  EXPECT_THROW(read_json_file(path), Error);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace astrai
