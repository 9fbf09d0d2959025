// Safetensors files: a write/read round trip of every dtype Strata has, the writer's layout
// (padded header, tensors sorted and aligned), and headers that lie in every way the reader must
// catch before it reads past the end, each rejected with the file and the tensor named.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "engine/check.h"
#include "testing/testing.h"

namespace strata::io {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/strata_safetensors_" + name + ".safetensors";
}

// A file of an 8-byte little-endian `length` (the header's own by default), `header`, `buffer`.
std::string write_raw(const std::string& name, const std::string& header, const std::string& buffer,
                      std::optional<uint64_t> length = std::nullopt) {
  const std::string path = temp_path(name);
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = length.value_or(header.size());
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
  f << header << buffer;
  return path;
}

// The message of the Error opening `path` throws ("" if it opens).
std::string open_error(const std::string& path) {
  try {
    SafetensorsReader reader(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_REJECTED(path_expr, ...)                                                         \
  do {                                                                                          \
    const std::string rejected_path = (path_expr);                                              \
    const std::string message = open_error(rejected_path);                                      \
    EXPECT_FALSE(message.empty()) << rejected_path << " was accepted";                          \
    EXPECT_NE(message.find(rejected_path), std::string::npos) << message;                       \
    for (const char* part : {__VA_ARGS__}) {                                                    \
      EXPECT_NE(message.find(part), std::string::npos) << "no '" << part << "' in " << message; \
    }                                                                                           \
  } while (0)

uint64_t header_length(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  unsigned char b[8];
  f.read(reinterpret_cast<char*>(b), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  return n;
}

TEST(Safetensors, RoundTripsEveryDtypeWithMetadata) {
  const std::string path = temp_path("round_trip");
  const Tensor f32 = testing::random_tensor({3, 5}, 1, -2, 2, DType::kF32);
  const Tensor f64 = testing::random_tensor({2, 2, 2}, 2);
  const Tensor f16 = testing::random_tensor({7}, 3, -2, 2, DType::kF16);
  const Tensor bf16 = testing::random_tensor({3}, 4, -2, 2, DType::kBF16);
  const Tensor i64 = Tensor::from_vector<int64_t>({-5, 1LL << 40}, {2});
  const Tensor i32 = Tensor::from_vector<int32_t>({7, -8, 9}, {3});
  const Tensor u8 = Tensor::from_vector<uint8_t>({1, 2, 255}, {3});
  const Tensor scalar = Tensor::from_vector<int64_t>({42}, {});
  const Tensor empty = Tensor::empty({0, 4}, DType::kF32);
  // A transposed view is written in row-major order of its own shape.
  const Tensor transposed = f32.transpose(0, 1);
  write_safetensors(path,
                    {{"w.f32", f32},
                     {"w.f64", f64},
                     {"w.f16", f16},
                     {"w.bf16", bf16},
                     {"n.i64", i64},
                     {"n.i32", i32},
                     {"n.u8", u8},
                     {"scalar", scalar},
                     {"empty", empty},
                     {"transposed", transposed}},
                    {{"format", "pt"}, {"note", "caf\xc3\xa9"}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  const SafetensorsReader r(path);
  EXPECT_EQ(r.header_bytes() % 8, 0u);
  EXPECT_EQ(r.header_bytes(), header_length(path));
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("note"), "caf\xc3\xa9");
  ASSERT_EQ(r.tensors().size(), 10u);
  // Buffer order: element size descending, then name; every tensor aligned to its element size.
  std::vector<std::string> order;
  for (const SafetensorsInfo& t : r.tensors()) {
    order.push_back(t.name);
    EXPECT_EQ((8 + r.header_bytes() + t.begin) % safetensors_dtype_size(t.dtype), 0u) << t.name;
  }
  EXPECT_EQ(order, (std::vector<std::string>{"n.i64", "scalar", "w.f64", "empty", "n.i32",
                                             "transposed", "w.f32", "w.bf16", "w.f16", "n.u8"}));
  EXPECT_EQ(r.find("w.bf16")->dtype, "BF16");
  EXPECT_EQ(r.find("scalar")->shape, Shape{});
  EXPECT_EQ(r.find("empty")->shape, (Shape{0, 4}));
  EXPECT_EQ(r.find("missing"), nullptr);

  auto same_bytes = [](const Tensor& a, const Tensor& b) {
    const Tensor ac = a.contiguous(), bc = b.contiguous();
    return a.dtype() == b.dtype() && a.shape() == b.shape() &&
           std::memcmp(ac.raw_data(), bc.raw_data(), ac.nbytes()) == 0;
  };
  EXPECT_TRUE(same_bytes(r.read("w.f32"), f32));
  EXPECT_TRUE(same_bytes(r.read("w.f64"), f64));
  EXPECT_TRUE(same_bytes(r.read("w.f16"), f16));
  EXPECT_TRUE(same_bytes(r.read("w.bf16"), bf16));
  EXPECT_TRUE(same_bytes(r.read("n.i64"), i64));
  EXPECT_TRUE(same_bytes(r.read("n.i32"), i32));
  EXPECT_TRUE(same_bytes(r.read("n.u8"), u8));
  EXPECT_TRUE(same_bytes(r.read("scalar"), scalar));
  EXPECT_EQ(r.read("empty").numel(), 0);
  EXPECT_TRUE(same_bytes(r.read("transposed"), transposed));
  EXPECT_EQ(r.read("transposed").shape(), (Shape{5, 3}));
}

TEST(Safetensors, HeaderIsCompactJsonPaddedWithSpaces) {
  const std::string path = temp_path("padding");
  write_safetensors(path, {{"a", Tensor::zeros({1}, DType::kU8)}});
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const uint64_t n = header_length(path);
  ASSERT_EQ(bytes.size(), 8 + n + 1);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.rfind("{\"a\":{\"data_offsets\":[0,1],\"dtype\":\"U8\",\"shape\":[1]}}", 0), 0u)
      << header;
  EXPECT_EQ(header.find_first_not_of(' ', header.find('}') + 2), std::string::npos) << header;
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, ReadsAFileWithoutTensors) {
  const std::string path = write_raw("no_tensors", "{}      ", "");
  const SafetensorsReader r(path);
  EXPECT_TRUE(r.tensors().empty());
}

TEST(Safetensors, RejectsAFileShorterThanTheLengthPrefix) {
  const std::string path = temp_path("short");
  std::ofstream(path, std::ios::binary) << "abc";
  EXPECT_REJECTED(path, "3 bytes", "8-byte header length");
}

TEST(Safetensors, RejectsAHeaderLengthBeyondTheFile) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  EXPECT_REJECTED(write_raw("length_beyond", header, std::string(4, '\0'), 4096), "header length",
                  "4096", "beyond");
  // Past 2^63: no signed overflow in the comparison.
  EXPECT_REJECTED(write_raw("length_huge", header, std::string(4, '\0'), 0xFFFFFFFFFFFFFFF0ull),
                  "header length", "beyond");
}

TEST(Safetensors, RejectsATensorEndingBeyondTheFile) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  EXPECT_REJECTED(write_raw("end_beyond", header, std::string(8, '\0')), "tensor 'w'", "[0, 16]",
                  "beyond the data buffer of 8 bytes");
}

TEST(Safetensors, RejectsOverlappingRanges) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  EXPECT_REJECTED(write_raw("overlap", header, std::string(12, '\0')), "tensor 'b'",
                  "overlap tensor 'a'");
}

TEST(Safetensors, RejectsOffsetsOutOfOrder) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})";
  EXPECT_REJECTED(write_raw("out_of_order", header, std::string(8, '\0')), "tensor 'w'",
                  "out of order");
}

TEST(Safetensors, RejectsGapsAndTrailingBytes) {
  const std::string gap = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  EXPECT_REJECTED(write_raw("gap", gap, std::string(12, '\0')), "tensor 'b'", "gap of 4 bytes",
                  "after tensor 'a'");
  const std::string trailing = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  EXPECT_REJECTED(write_raw("trailing", trailing, std::string(12, '\0')), "holds 12 bytes",
                  "cover 4", "after tensor 'a'");
}

TEST(Safetensors, RejectsAByteCountThatIsNotNumelTimesDtypeSize) {
  const std::string header = R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})";
  EXPECT_REJECTED(write_raw("byte_count", header, std::string(8, '\0')), "tensor 'w'",
                  "hold 8 bytes", "needs 6 x 2 = 12 bytes");
}

TEST(Safetensors, RejectsAShapeWhoseSizeOverflows) {
  const std::string header =
      R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})";
  EXPECT_REJECTED(write_raw("overflow", header, ""), "tensor 'w'", "more elements than 2^63");
  const std::string bytes =
      R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})";
  EXPECT_REJECTED(write_raw("overflow_bytes", bytes, ""), "tensor 'w'", "overflows 2^64 bytes");
}

TEST(Safetensors, RejectsMalformedEntries) {
  EXPECT_REJECTED(
      write_raw("bad_dtype", R"({"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})",
                std::string(4, '\0')),
      "tensor 'w'", "unknown dtype \"F33\"");
  EXPECT_REJECTED(
      write_raw("negative_dim", R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", ""),
      "tensor 'w'", "non-negative integer");
  EXPECT_REJECTED(
      write_raw("float_offset", R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1.5]}})",
                std::string(1, '\0')),
      "tensor 'w'", "data_offsets[1]");
  EXPECT_REJECTED(
      write_raw("no_shape", R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", std::string(1, '\0')),
      "tensor 'w'", "no \"shape\"");
  EXPECT_REJECTED(
      write_raw("three_offsets", R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})",
                std::string(1, '\0')),
      "tensor 'w'", "[begin, end]");
  EXPECT_REJECTED(write_raw("metadata_number", R"({"__metadata__":{"epoch":3}})", ""),
                  "__metadata__ entry 'epoch'");
  EXPECT_REJECTED(write_raw("not_object", "[1, 2]  ", ""), "JSON object");
}

TEST(Safetensors, RejectsInvalidJsonAndInvalidUtf8) {
  EXPECT_REJECTED(write_raw("bad_json", R"({"w":{"dtype":"F32",)", ""), "not valid JSON");
  // A lone continuation byte inside a tensor name.
  const std::string header =
      std::string(R"({"w)") + "\x80" + R"(":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  EXPECT_REJECTED(write_raw("bad_utf8", header, std::string(1, '\0')), "not valid UTF-8", "0x80",
                  "file offset 11");
}

TEST(Safetensors, RejectsADuplicateName) {
  const std::string header = R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  EXPECT_REJECTED(write_raw("duplicate", header, std::string(2, '\0')), "tensor 'w'",
                  "more than once");
}

TEST(Safetensors, ReadNamesTheTensorOfADtypeStrataLacks) {
  const std::string path =
      write_raw("bool", R"({"mask":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}}      )",
                std::string(2, '\1'));
  const SafetensorsReader r(path);
  try {
    r.read("mask");
    FAIL() << "read a BOOL tensor";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("tensor 'mask' has dtype BOOL"), std::string::npos) << m;
  }
}

TEST(Safetensors, WriterRejectsBadNames) {
  const Tensor t = Tensor::zeros({1});
  const std::string path = temp_path("bad_names");
  EXPECT_THROW(write_safetensors(path, {{"a", t}, {"a", t}}), Error);
  EXPECT_THROW(write_safetensors(path, {{"", t}}), Error);
  EXPECT_THROW(write_safetensors(path, {{"__metadata__", t}}), Error);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Safetensors, MissingFileNamesIt) {
  EXPECT_REJECTED(std::string("/nonexistent/dir/w.safetensors"), "cannot open");
}

}  // namespace
}  // namespace strata::io
