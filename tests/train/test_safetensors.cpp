// Safetensors: round trips of every dtype, the exact byte layout of the
// format, and rejection (with a reason) of damaged files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "coremesh/train/safetensors.hpp"
#include "test_util.hpp"

using namespace coremesh;
using namespace coremesh::train;

TEST(Safetensors, RoundTripEveryDtype) {
  std::vector<float> f{1.5f, -2.25f, 3.0f, 0.0f, 7.0f, -1.0f};
  NamedTensorList in{{"a.f32", Tensor::from_vector(f, {2, 3})},
                     {"b.bf16", Tensor::from_vector(f, {6}).to(DType::bf16)},
                     {"c.e4m3", Tensor::from_vector(f, {3, 2}).to(DType::f8e4m3)},
                     {"d.e5m2", Tensor::from_vector(f, {6}).to(DType::f8e5m2)},
                     {"e.i32", Tensor::from_vector(std::vector<int32_t>{1, -2, 3}, {3})},
                     {"f.i64", Tensor::from_vector(std::vector<int64_t>{1LL << 40}, {1})},
                     {"g.empty", Tensor::empty({0, 4})}};
  std::string bytes = safetensors_serialize(in, {{"k", "v"}, {"json", "{\"x\": 1}"}});
  SafetensorsFile out = safetensors_parse(bytes.data(), bytes.size(), "mem");
  ASSERT_EQ(out.names.size(), in.size());
  EXPECT_EQ(out.metadata.at("k"), "v");
  EXPECT_EQ(out.metadata.at("json"), "{\"x\": 1}");
  for (const auto& [name, t] : in) {
    const Tensor& u = out.at(name);
    EXPECT_EQ(u.dtype(), t.dtype()) << name;
    EXPECT_EQ(u.shape(), t.shape()) << name;
    EXPECT_EQ(0, std::memcmp(u.raw_data(), t.raw_data(), t.nbytes())) << name;
  }
}

TEST(Safetensors, ByteLayoutFollowsTheFormat) {
  std::string bytes = safetensors_serialize({{"w", Tensor::from_vector(std::vector<float>{1, 2}, {2})}});
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian host
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 8);
  std::string header = bytes.substr(8, n);
  EXPECT_NE(header.find("\"dtype\":\"F32\""), std::string::npos) << header;
  EXPECT_NE(header.find("\"data_offsets\":[0,8]"), std::string::npos) << header;
  float v[2];
  std::memcpy(v, bytes.data() + 8 + n, 8);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 2.0f);
}

static std::string error_of(const std::string& bytes) {
  try {
    safetensors_parse(bytes.data(), bytes.size(), "bad");
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "(accepted)";
}

static std::string with_header(const std::string& json, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json + std::string(data_bytes, '\0');
}

TEST(Safetensors, DamagedFilesAreRefusedWithAReason) {
  std::string good = safetensors_serialize({{"w", Tensor::zeros({4})}});
  EXPECT_NE(error_of(good.substr(0, 5)).find("too short"), std::string::npos);
  EXPECT_NE(error_of(good.substr(0, 20)).find("truncated"), std::string::npos);
  EXPECT_NE(error_of(good.substr(0, good.size() - 4)).find("truncated"), std::string::npos);
  EXPECT_NE(error_of(good + "xxxx").find("follow the last tensor"), std::string::npos);
  EXPECT_NE(error_of(with_header("{not json", 0)).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(with_header(R"({"w":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})", 2))
                .find("tensor 'w': unsupported safetensors dtype 'F16'"),  // names the tensor
            std::string::npos);
  // bytes that are not text are escaped, not written raw to the terminal
  const std::string raw = error_of(with_header("{\"w\": \"\xff\xfe\x1b[2J\"}", 0));
  EXPECT_NE(raw.find("not valid JSON"), std::string::npos) << raw;
  EXPECT_EQ(raw.find('\xff'), std::string::npos) << raw;
  EXPECT_EQ(raw.find('\x1b'), std::string::npos) << raw;
  EXPECT_NE(error_of(with_header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8))
                .find("needs 12 bytes"),
            std::string::npos);
  EXPECT_NE(error_of(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                 12))
                .find("overlap or hole"),
            std::string::npos);
  EXPECT_NE(error_of(with_header(R"({"w":{"dtype":"F32","shape":[1]}})", 4)).find("malformed"),
            std::string::npos);
  // a fractional dimension was truncated (2.5 read as 2) and accepted
  EXPECT_NE(error_of(with_header(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8))
                .find("not lists of integers"),
            std::string::npos);
}

TEST(Safetensors, FileWriteIsAtomicAndReadable) {
  TempDir dir;
  std::string path = dir.path + "/x.safetensors";
  write_safetensors(path, {{"w", Tensor::full({3}, 2.0f)}}, {{"m", "1"}});
  SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.at("w").item({2}), 2.0f);
  EXPECT_EQ(f.metadata.at("m"), "1");
  // No temporary files remain next to it.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}
