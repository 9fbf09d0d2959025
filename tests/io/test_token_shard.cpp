// llm.c token shards: the byte layout, round trips, discovery by name, and the errors for a
// wrong magic, version or length, each naming the file and what was expected and found.
#include "io/token_shard.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "engine/check.h"

namespace strata::io {
namespace {

std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/strata_shard_" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

int32_t int_at(const std::vector<char>& bytes, size_t offset) {
  int32_t v;
  std::memcpy(&v, bytes.data() + offset, sizeof(v));
  return v;
}

void set_int(std::vector<char>* bytes, size_t offset, int32_t v) {
  std::memcpy(bytes->data() + offset, &v, sizeof(v));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(TokenShard, WritesLlmcLayout) {
  const std::string path = temp_dir("layout") + "/train_000000.bin";
  write_token_shard(path, std::vector<int32_t>{50256, 0, 1, 65535, 464});
  const std::vector<char> bytes = file_bytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 2u * 5u);
  EXPECT_EQ(int_at(bytes, 0), 20240520);
  EXPECT_EQ(int_at(bytes, 4), 1);
  EXPECT_EQ(int_at(bytes, 8), 5);
  for (size_t off = 12; off < 1024; off += 4) ASSERT_EQ(int_at(bytes, off), 0) << off;
  // Little-endian uint16 tokens after the header.
  EXPECT_EQ(static_cast<uint8_t>(bytes[1024]), 50256 & 0xFF);
  EXPECT_EQ(static_cast<uint8_t>(bytes[1025]), 50256 >> 8);
  EXPECT_EQ(static_cast<uint8_t>(bytes[1030]), 0xFF);
  EXPECT_EQ(static_cast<uint8_t>(bytes[1031]), 0xFF);
}

TEST(TokenShard, RoundTripsByMapAndByRead) {
  const std::string path = temp_dir("roundtrip") + "/val_000000.bin";
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 100000; ++i) tokens.push_back((i * 7919) % 50257);
  write_token_shard(path, tokens);
  TokenShard shard(path);
  ASSERT_EQ(shard.size(), 100000);
  EXPECT_EQ(shard.path(), path);
  for (int64_t i = 0; i < shard.size(); ++i) ASSERT_EQ(shard[i], tokens[i]) << i;
  const std::vector<uint16_t> read = read_token_shard(path);
  ASSERT_EQ(read.size(), tokens.size());
  EXPECT_TRUE(std::equal(read.begin(), read.end(), tokens.begin()));
  // Moving keeps the mapping; the moved-from shard is empty.
  TokenShard moved(std::move(shard));
  EXPECT_EQ(moved.size(), 100000);
  EXPECT_EQ(moved[99999], tokens[99999]);
  EXPECT_EQ(shard.size(), 0);  // the moved-from state the header specifies
  shard = std::move(moved);
  EXPECT_EQ(shard[12345], tokens[12345]);
}

TEST(TokenShard, EmptyShardIsHeaderOnly) {
  const std::string path = temp_dir("empty") + "/train_000000.bin";
  write_token_shard(path, std::vector<int32_t>{});
  EXPECT_EQ(file_bytes(path).size(), 1024u);
  EXPECT_EQ(TokenShard(path).size(), 0);
}

TEST(TokenShard, RejectsIdsThatDoNotFit16Bits) {
  const std::string path = temp_dir("wide") + "/train_000000.bin";
  const std::string msg = error_of([&] { write_token_shard(path, {1, 2, 65536}); });
  EXPECT_TRUE(has(msg, path + ": token 2 is 65536")) << msg;
  const std::string neg = error_of([&] { write_token_shard(path, {-1}); });
  EXPECT_TRUE(has(neg, "token 0 is -1")) << neg;
  struct stat st;
  EXPECT_NE(::stat(path.c_str(), &st), 0) << "a failed write left " << path;
}

class BrokenShard : public ::testing::Test {
 protected:
  void SetUp() override {
    // A directory per test: ctest runs the tests of this fixture in parallel processes.
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    path_ = temp_dir("broken_" + test) + "/train_000000.bin";
    write_token_shard(path_, std::vector<int32_t>{1, 2, 3, 4});
    bytes_ = file_bytes(path_);
  }
  std::string open_error() {
    write_bytes(path_, bytes_);
    return error_of([&] { TokenShard shard(path_); });
  }
  std::string path_;
  std::vector<char> bytes_;
};

TEST_F(BrokenShard, WrongMagic) {
  set_int(&bytes_, 0, 12345);
  const std::string msg = open_error();
  EXPECT_TRUE(has(msg, path_)) << msg;
  EXPECT_TRUE(has(msg, "bad magic at offset 0: expected 20240520")) << msg;
  EXPECT_TRUE(has(msg, "found 12345")) << msg;
  set_int(&bytes_, 0, 20240801);
  EXPECT_TRUE(has(open_error(), "llama-3")) << open_error();
}

TEST_F(BrokenShard, WrongVersion) {
  set_int(&bytes_, 4, 7);
  const std::string msg = open_error();
  EXPECT_TRUE(has(msg, path_ + ": bad version at offset 4: expected 1, found 7")) << msg;
}

TEST_F(BrokenShard, WrongLength) {
  bytes_.resize(bytes_.size() - 2);  // one token short
  std::string msg = open_error();
  EXPECT_TRUE(has(msg, path_ + ": bad length")) << msg;
  EXPECT_TRUE(has(msg, "says 4 tokens, so expected 1032 bytes")) << msg;
  EXPECT_TRUE(has(msg, "found 1030 bytes (truncated?)")) << msg;
  bytes_.resize(1034, 0);  // one token too many
  msg = open_error();
  EXPECT_TRUE(has(msg, "found 1034 bytes (trailing data)")) << msg;
  set_int(&bytes_, 8, -5);
  EXPECT_TRUE(has(open_error(), "bad token count at offset 8")) << open_error();
  bytes_.resize(100);
  msg = open_error();
  EXPECT_TRUE(has(msg, path_ + ": truncated header: expected 1024 header bytes")) << msg;
}

TEST(TokenShard, MissingFileNamesIt) {
  const std::string msg = error_of([] { TokenShard shard("/nonexistent/train_000000.bin"); });
  EXPECT_TRUE(has(msg, "cannot open '/nonexistent/train_000000.bin'")) << msg;
}

TEST(TokenShard, FindsShardsByNamePart) {
  const std::string dir = temp_dir("find");
  for (const char* name : {"train_000001.bin", "train_000000.bin", "fineweb_train_000002.bin",
                           "tiny_shakespeare_val.bin", "val_000000.bin", "trainer.bin",
                           "train_000003.txt", "notes.bin"}) {
    write_token_shard(dir + "/" + name, std::vector<int32_t>{1});
  }
  EXPECT_EQ(find_token_shards(dir, "train"),
            (std::vector<std::string>{dir + "/fineweb_train_000002.bin", dir + "/train_000000.bin",
                                      dir + "/train_000001.bin"}));
  EXPECT_EQ(find_token_shards(dir, "val"),
            (std::vector<std::string>{dir + "/tiny_shakespeare_val.bin", dir + "/val_000000.bin"}));
  const std::string msg = error_of([] { find_token_shards("/nonexistent/shards", "train"); });
  EXPECT_TRUE(has(msg, "'/nonexistent/shards'")) << msg;
}

}  // namespace
}  // namespace strata::io
