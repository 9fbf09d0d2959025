#include "io/idx.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

namespace strata::io {
namespace {

// A fresh directory per test, removed afterwards.
class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "strata_idx_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  void write_bytes(const std::string& file, const std::vector<uint8_t>& bytes) const {
    std::FILE* f = std::fopen(file.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  }

  std::vector<uint8_t> read_bytes(const std::string& file) const {
    std::vector<uint8_t> bytes;
    std::FILE* f = std::fopen(file.c_str(), "rb");
    if (f == nullptr) return bytes;
    int c;
    while ((c = std::fgetc(f)) != EOF) bytes.push_back(static_cast<uint8_t>(c));
    std::fclose(f);
    return bytes;
  }

  // The message of the Error that reading `file` throws ("" when it does not throw).
  std::string read_error(const std::string& file) const {
    try {
      read_idx(file);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  std::string dir_;
};

// A valid 2x3 i16 file: header (12 bytes) + 12 data bytes.
std::vector<uint8_t> small_i16_file() {
  return encode_idx(IdxArray::from_values<int16_t>({2, 3}, {1, -2, 300, -400, 5, 32767}));
}

template <typename T>
void expect_round_trip(const std::string& file, bool gzip, const std::vector<T>& values) {
  const IdxArray written =
      IdxArray::from_values<T>({2, static_cast<int64_t>(values.size() / 2)}, values);
  write_idx(file, written, gzip);
  const IdxArray read = read_idx(file);
  EXPECT_EQ(read.type, IdxTypeOf<T>::value) << file;
  EXPECT_EQ(read.dims, written.dims) << file;
  ASSERT_EQ(read.numel(), static_cast<int64_t>(values.size())) << file;
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(read.at<T>(static_cast<int64_t>(i)), values[i]) << file << " element " << i;
  }
}

TEST_F(IdxTest, RoundTripEveryTypeRawAndGzip) {
  for (bool gzip : {false, true}) {
    const std::string tag = gzip ? ".gz" : "";
    expect_round_trip<uint8_t>(path("u8" + tag), gzip, {0, 1, 127, 128, 254, 255});
    expect_round_trip<int8_t>(path("i8" + tag), gzip, {-128, -1, 0, 1, 100, 127});
    expect_round_trip<int16_t>(path("i16" + tag), gzip, {-32768, -2, 0, 258, 4000, 32767});
    expect_round_trip<int32_t>(path("i32" + tag), gzip,
                               {std::numeric_limits<int32_t>::min(), -70000, 0, 1, 16909060,
                                std::numeric_limits<int32_t>::max()});
    expect_round_trip<float>(path("f32" + tag), gzip, {-1.5f, 0.0f, 1e-30f, 3.25f, 1e30f, -0.0f});
    expect_round_trip<double>(path("f64" + tag), gzip, {-1e300, 0.1, 2.0, 1e-300, 7.0, -3.5});
  }
}

TEST_F(IdxTest, ThreeDimensionsAndEmptyArrays) {
  std::vector<uint8_t> pixels(2 * 4 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7);
  write_idx(path("images"), IdxArray::from_values<uint8_t>({2, 4, 3}, pixels), true);
  const IdxArray images = read_idx(path("images"));
  EXPECT_EQ(images.dims, (std::vector<int64_t>{2, 4, 3}));
  EXPECT_EQ(images.data, pixels);

  write_idx(path("empty"), IdxArray::from_values<float>({0, 5}, {}));
  const IdxArray empty = read_idx(path("empty"));
  EXPECT_EQ(empty.dims, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(empty.numel(), 0);
}

// Found by tests/fuzz/idx_fuzz: sizes whose product passes 2^63 (but not 2^64) before a size of 0
// made numel() overflow int64; the header is refused now.
TEST_F(IdxTest, SizesPastInt64BeforeAZeroAreRefused) {
  // Sizes 2^31, 2^32 - 1, 2, 0: the first three multiply to 2^64 - 2^32.
  const std::vector<uint8_t> bytes = {0x00, 0x00, 0x08, 0x04, 0x80, 0x00, 0x00, 0x00, 0xFF, 0xFF,
                                      0xFF, 0xFF, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00};
  EXPECT_THROW(parse_idx(bytes.data(), bytes.size(), "huge.idx"), Error);
}

TEST_F(IdxTest, DecodesBigEndian) {
  // i16 {0x0102, 0xFFFE}, i32 {0x01020304}, f32 {1.0f = 0x3F800000}, f64 {-2.0 = 0xC000...}.
  const std::vector<uint8_t> i16 = {0, 0, 0x0B, 1, 0, 0, 0, 2, 0x01, 0x02, 0xFF, 0xFE};
  const IdxArray a = parse_idx(i16.data(), i16.size(), "i16");
  EXPECT_EQ(a.at<int16_t>(0), 258);
  EXPECT_EQ(a.at<int16_t>(1), -2);

  const std::vector<uint8_t> i32 = {0, 0, 0x0C, 1, 0, 0, 0, 1, 0x01, 0x02, 0x03, 0x04};
  EXPECT_EQ(parse_idx(i32.data(), i32.size(), "i32").at<int32_t>(0), 16909060);

  const std::vector<uint8_t> f32 = {0, 0, 0x0D, 1, 0, 0, 0, 1, 0x3F, 0x80, 0, 0};
  EXPECT_EQ(parse_idx(f32.data(), f32.size(), "f32").at<float>(0), 1.0f);

  const std::vector<uint8_t> f64 = {0, 0, 0x0E, 1, 0, 0, 0, 1, 0xC0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(parse_idx(f64.data(), f64.size(), "f64").at<double>(0), -2.0);

  // Sizes are big-endian too: 0x00000103 = 259 elements.
  std::vector<uint8_t> u8 = {0, 0, 0x08, 1, 0, 0, 0x01, 0x03};
  u8.resize(u8.size() + 259, 7);
  EXPECT_EQ(parse_idx(u8.data(), u8.size(), "u8").dims, (std::vector<int64_t>{259}));

  // And the same through a file.
  write_bytes(path("f32.idx"), f32);
  EXPECT_EQ(read_idx(path("f32.idx")).at<float>(0), 1.0f);
}

TEST_F(IdxTest, EncodesBigEndian) {
  const std::vector<uint8_t> bytes = encode_idx(IdxArray::from_values<int32_t>({1}, {16909060}));
  EXPECT_EQ(bytes, (std::vector<uint8_t>{0, 0, 0x0C, 1, 0, 0, 0, 1, 1, 2, 3, 4}));
  const IdxArray array = IdxArray::from_values<uint8_t>({1}, {1});
  EXPECT_THROW(array.at<int32_t>(0), Error);  // wrong element type
}

TEST_F(IdxTest, GzipIsDetectedByMagicNotByName) {
  write_idx(path("looks_raw.idx"), IdxArray::from_values<int16_t>({2}, {-5, 6}), true);
  write_idx(path("looks_compressed.gz"), IdxArray::from_values<int16_t>({2}, {7, -8}), false);
  const std::vector<uint8_t> head = read_bytes(path("looks_raw.idx"));
  ASSERT_GE(head.size(), 2u);
  EXPECT_EQ(head[0], 0x1f);
  EXPECT_EQ(head[1], 0x8b);
  EXPECT_EQ(read_idx(path("looks_raw.idx")).at<int16_t>(0), -5);
  EXPECT_EQ(read_idx(path("looks_compressed.gz")).at<int16_t>(1), -8);
}

TEST_F(IdxTest, ConcatenatedGzipMembers) {
  const std::vector<uint8_t> bytes = small_i16_file();
  const std::string file = path("two_members.gz");
  for (const char* mode : {"wb", "ab"}) {  // each gzopen/gzclose writes one member
    gzFile gz = gzopen(file.c_str(), mode);
    ASSERT_NE(gz, nullptr);
    const size_t half = bytes.size() / 2;
    const uint8_t* part = std::string(mode) == "wb" ? bytes.data() : bytes.data() + half;
    const size_t n = std::string(mode) == "wb" ? half : bytes.size() - half;
    ASSERT_EQ(gzwrite(gz, part, static_cast<unsigned>(n)), static_cast<int>(n));
    gzclose(gz);
  }
  EXPECT_EQ(read_idx(file).at<int16_t>(5), 32767);
}

TEST_F(IdxTest, MissingFileNamesThePath) {
  const std::string msg = read_error(path("nope-idx1-ubyte"));
  EXPECT_NE(msg.find(path("nope-idx1-ubyte")), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;
}

TEST_F(IdxTest, BadMagicNonzeroFirstBytes) {
  std::vector<uint8_t> bytes = small_i16_file();
  bytes[0] = 0x12;
  write_bytes(path("bad0"), bytes);
  const std::string msg = read_error(path("bad0"));
  EXPECT_NE(msg.find(path("bad0")), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad magic at offset 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected two zero bytes, found 0x12 0x00"), std::string::npos) << msg;
}

TEST_F(IdxTest, BadMagicUnknownTypeCode) {
  std::vector<uint8_t> bytes = small_i16_file();
  bytes[2] = 0x07;
  write_bytes(path("bad2"), bytes);
  const std::string msg = read_error(path("bad2"));
  EXPECT_NE(msg.find(path("bad2")), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected a type code"), std::string::npos) << msg;
  EXPECT_NE(msg.find("found 0x07"), std::string::npos) << msg;
}

TEST_F(IdxTest, BadMagicZeroDimensions) {
  write_bytes(path("bad3"), {0, 0, 0x08, 0});
  const std::string msg = read_error(path("bad3"));
  EXPECT_NE(msg.find(path("bad3")), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("found 0"), std::string::npos) << msg;
}

TEST_F(IdxTest, TruncatedHeader) {
  write_bytes(path("short_magic"), {0, 0});
  std::string msg = read_error(path("short_magic"));
  EXPECT_NE(msg.find(path("short_magic")), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated header"), std::string::npos) << msg;
  EXPECT_NE(msg.find("file ends at offset 2"), std::string::npos) << msg;

  write_bytes(path("short_sizes"), {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0});  // 3 sizes need 16 bytes
  msg = read_error(path("short_sizes"));
  EXPECT_NE(msg.find(path("short_sizes")), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated header: expected 3 big-endian u32 sizes at offsets 4..16"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("file ends at offset 10"), std::string::npos) << msg;
}

TEST_F(IdxTest, TruncatedData) {
  std::vector<uint8_t> bytes = small_i16_file();  // 12 header + 12 data bytes
  bytes.resize(bytes.size() - 5);
  write_bytes(path("short_data"), bytes);
  const std::string msg = read_error(path("short_data"));
  EXPECT_NE(msg.find(path("short_data")), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected 12 data bytes after the header at offset 12, file ends at "
                     "offset 19"),
            std::string::npos)
      << msg;
}

TEST_F(IdxTest, TruncatedDataInsideGzipNamesUncompressedOffsets) {
  std::vector<uint8_t> bytes = small_i16_file();
  bytes.resize(bytes.size() - 4);
  const std::string file = path("short_data.gz");
  gzFile gz = gzopen(file.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  gzclose(gz);
  const std::string msg = read_error(file);
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected 12 data bytes after the header at offset 12 of the uncompressed "
                     "stream, file ends at offset 20"),
            std::string::npos)
      << msg;
}

TEST_F(IdxTest, TrailingGarbage) {
  std::vector<uint8_t> bytes = small_i16_file();
  bytes.insert(bytes.end(), {1, 2, 3});
  write_bytes(path("long"), bytes);
  const std::string msg = read_error(path("long"));
  EXPECT_NE(msg.find(path("long")), std::string::npos) << msg;
  EXPECT_NE(msg.find("trailing garbage: expected the file to end at offset 24"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("found 3 more bytes"), std::string::npos) << msg;
}

TEST_F(IdxTest, CorruptGzipStream) {
  write_idx(path("crc.gz"), IdxArray::from_values<int16_t>({2, 3}, {1, 2, 3, 4, 5, 6}), true);
  std::vector<uint8_t> bytes = read_bytes(path("crc.gz"));
  ASSERT_GT(bytes.size(), 8u);
  bytes[bytes.size() - 8] ^= 0xFF;  // the CRC-32 of the trailer
  write_bytes(path("crc.gz"), bytes);
  std::string msg = read_error(path("crc.gz"));
  EXPECT_NE(msg.find(path("crc.gz")), std::string::npos) << msg;
  EXPECT_NE(msg.find("corrupt gzip stream"), std::string::npos) << msg;
  EXPECT_NE(msg.find("uncompressed offset 24"), std::string::npos) << msg;
  EXPECT_NE(msg.find("incorrect data check"), std::string::npos) << msg;

  bytes = read_bytes(path("crc.gz"));
  bytes[2] = 7;  // compression method: only 8 (deflate) exists
  write_bytes(path("method.gz"), bytes);
  msg = read_error(path("method.gz"));
  EXPECT_NE(msg.find(path("method.gz")), std::string::npos) << msg;
  EXPECT_NE(msg.find("corrupt gzip stream at compressed byte"), std::string::npos) << msg;
  EXPECT_NE(msg.find("uncompressed offset 0"), std::string::npos) << msg;
}

TEST_F(IdxTest, TruncatedAndPaddedGzipStreams) {
  std::vector<uint8_t> values(4000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>((i * i) >> 3);
  write_idx(path("full.gz"), IdxArray::from_values<uint8_t>({4000}, values), true);
  std::vector<uint8_t> bytes = read_bytes(path("full.gz"));

  std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + bytes.size() / 2);
  write_bytes(path("cut.gz"), cut);
  std::string msg = read_error(path("cut.gz"));
  EXPECT_NE(msg.find(path("cut.gz")), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated gzip stream"), std::string::npos) << msg;
  EXPECT_NE(msg.find("file ends at compressed byte " + std::to_string(cut.size())),
            std::string::npos)
      << msg;

  bytes.insert(bytes.end(), {0, 0, 0, 0});
  write_bytes(path("padded.gz"), bytes);
  msg = read_error(path("padded.gz"));
  EXPECT_NE(msg.find(path("padded.gz")), std::string::npos) << msg;
  EXPECT_NE(msg.find("trailing garbage after the gzip stream"), std::string::npos) << msg;
  EXPECT_NE(msg.find("found 4 more bytes"), std::string::npos) << msg;
}

TEST_F(IdxTest, WriterRejectsBadArraysAndPaths) {
  IdxArray bad = IdxArray::from_values<int32_t>({2}, {1, 2});
  bad.data.pop_back();
  EXPECT_THROW(write_idx(path("bad"), bad), Error);
  EXPECT_THROW(IdxArray::from_values<uint8_t>({3}, {1, 2}), Error);
  try {
    write_idx(path("no/such/dir/file"), IdxArray::from_values<uint8_t>({1}, {1}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path("no/such/dir/file")), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::io
