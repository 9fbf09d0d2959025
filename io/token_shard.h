// llm.c's token shard files (karpathy/llm.c dev/data/data_common.py, llmc/dataloader.h):
//
//   header  256 x int32, little-endian: [0] magic 20240520, [1] version 1, [2] token count N,
//           the rest 0
//   tokens  N x uint16, little-endian (GPT-2 ids: the vocabulary of 50257 fits 16 bits)
//
// so a file is exactly 1024 + 2 N bytes. Datasets of shards are named *_train_*.bin and
// *_val_*.bin by llm.c and train_NNNNNN.bin / val_NNNNNN.bin by `strata prepare-text`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::io {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr size_t kTokenShardHeaderInts = 256;
inline constexpr size_t kTokenShardHeaderBytes = kTokenShardHeaderInts * sizeof(int32_t);

// A read-only token shard, memory-mapped (the pages are read on demand and shared between
// processes). Opening checks the header and the file size; errors name the file and what was
// expected and found. Movable (a moved-from shard is empty), not copyable; thread-safe to read.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);
  ~TokenShard();
  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }  // tokens N
  const uint16_t* tokens() const { return tokens_; }
  uint16_t operator[](int64_t i) const { return tokens_[i]; }

 private:
  void release();

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
};

// Writes `tokens` as a shard at `path` (through a temporary file renamed into place, so a reader
// never sees half a shard). Each id must fit 16 bits (an error names the first that does not).
void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens);
void write_token_shard(const std::string& path, const int32_t* tokens, size_t count);

// The whole shard, read (not mapped) into memory.
std::vector<uint16_t> read_token_shard(const std::string& path);

// The paths of the files in `dir` named *.bin that have `prefix` as one of the '_'-separated parts
// of their name, sorted by name: "train" finds train_000000.bin, fineweb_train_000001.bin and
// tiny_shakespeare_train.bin, not trainer.bin. A missing directory is an error naming it.
std::vector<std::string> find_token_shards(const std::string& dir, const std::string& prefix);

}  // namespace strata::io
