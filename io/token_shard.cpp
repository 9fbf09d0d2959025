// llm.c token shards: read by mmap, written through a temporary file.
//
// A shard of 100M tokens is 200 MB, and a training run visits its windows in random order, so
// shards are mapped rather than read: the kernel pages in what is touched and shares the pages
// between the processes of a run. The header is checked field by field against llm.c's writer
// (magic, version, count) and the file size against the count, so a truncated download or a
// shard of another format (llama-3's uint32 shards, magic 20240801) fails at open with the file,
// the field, and what was expected and found. The format is little-endian, like every host
// Strata builds for.
#include "io/token_shard.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "engine/check.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "token shards are little-endian; a big-endian host needs byte swaps here");

namespace strata::io {
namespace {

std::string errno_str(int err) { return std::strerror(err); }

// Checks a shard's header and size; returns the token count.
int64_t check_header(const int32_t* header, size_t file_bytes, const std::string& path) {
  if (header[0] != kTokenShardMagic) {
    STRATA_THROW() << "token shard " << path << ": bad magic at offset 0: expected "
                   << kTokenShardMagic << " (llm.c GPT-2 uint16 shards), found " << header[0]
                   << (header[0] == 20240801 ? " (llm.c's llama-3 uint32 shards: not supported)"
                                             : " (not a token shard?)");
  }
  if (header[1] != kTokenShardVersion) {
    STRATA_THROW() << "token shard " << path << ": bad version at offset 4: expected "
                   << kTokenShardVersion << ", found " << header[1];
  }
  const int64_t count = header[2];
  if (count < 0) {
    STRATA_THROW() << "token shard " << path << ": bad token count at offset 8: expected a count "
                   << ">= 0, found " << count;
  }
  const size_t expected = kTokenShardHeaderBytes + static_cast<size_t>(count) * sizeof(uint16_t);
  if (file_bytes != expected) {
    STRATA_THROW() << "token shard " << path << ": bad length: the header (offset 8) says " << count
                   << " tokens, so expected " << expected << " bytes (1024 + 2 x " << count
                   << "), found " << file_bytes << " bytes"
                   << (file_bytes < expected ? " (truncated?)" : " (trailing data)");
  }
  return count;
}

}  // namespace

TokenShard::TokenShard(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    STRATA_THROW() << "token shard: cannot open '" << path << "': " << errno_str(err);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    STRATA_THROW() << "token shard: cannot stat '" << path << "': " << errno_str(err);
  }
  const auto bytes = static_cast<size_t>(st.st_size);
  if (bytes < kTokenShardHeaderBytes) {
    ::close(fd);
    STRATA_THROW() << "token shard " << path << ": truncated header: expected "
                   << kTokenShardHeaderBytes << " header bytes (256 int32), file ends at offset "
                   << bytes;
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    STRATA_THROW() << "token shard: cannot map '" << path << "' (" << bytes
                   << " bytes): " << errno_str(err);
  }
  map_ = map;
  map_bytes_ = bytes;
  try {
    count_ = check_header(static_cast<const int32_t*>(map), bytes, path);
  } catch (...) {
    release();
    throw;
  }
  tokens_ =
      reinterpret_cast<const uint16_t*>(static_cast<const char*>(map) + kTokenShardHeaderBytes);
}

TokenShard::~TokenShard() { release(); }

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)),
      count_(std::exchange(other.count_, 0)) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

void TokenShard::release() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
  count_ = 0;
}

void write_token_shard(const std::string& path, const int32_t* tokens, size_t count) {
  STRATA_CHECK(count <= static_cast<size_t>(INT32_MAX))
      << "token shard " << path << ": " << count << " tokens do not fit the int32 count of the "
      << "header; split them over several shards";
  std::vector<uint16_t> data(count);
  for (size_t i = 0; i < count; ++i) {
    STRATA_CHECK(tokens[i] >= 0 && tokens[i] <= 0xFFFF)
        << "token shard " << path << ": token " << i << " is " << tokens[i]
        << ", which does not fit the format's uint16 (expected 0 <= id < 65536)";
    data[i] = static_cast<uint16_t>(tokens[i]);
  }
  int32_t header[kTokenShardHeaderInts] = {};
  header[0] = kTokenShardMagic;
  header[1] = kTokenShardVersion;
  header[2] = static_cast<int32_t>(count);

  const std::string temp = path + ".tmp";
  std::FILE* f = std::fopen(temp.c_str(), "wb");
  if (f == nullptr) {
    const int err = errno;
    STRATA_THROW() << "token shard: cannot create '" << temp << "': " << errno_str(err);
  }
  bool ok = std::fwrite(header, sizeof(header), 1, f) == 1;
  if (count > 0) ok = ok && std::fwrite(data.data(), sizeof(uint16_t), count, f) == count;
  const int write_err = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(temp.c_str());
    STRATA_THROW() << "token shard: error writing '" << temp << "' (" << count
                   << " tokens): " << errno_str(write_err);
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(temp.c_str());
    STRATA_THROW() << "token shard: cannot rename '" << temp << "' to '" << path
                   << "': " << errno_str(err);
  }
}

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens) {
  write_token_shard(path, tokens.data(), tokens.size());
}

std::vector<uint16_t> read_token_shard(const std::string& path) {
  const TokenShard shard(path);
  return std::vector<uint16_t>(shard.tokens(), shard.tokens() + shard.size());
}

std::vector<std::string> find_token_shards(const std::string& dir, const std::string& prefix) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    const int err = errno;
    STRATA_THROW() << "token shards: cannot read directory '" << dir << "': " << errno_str(err);
  }
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= 4 || name.compare(name.size() - 4, 4, ".bin") != 0) continue;
    const std::string stem = name.substr(0, name.size() - 4);
    bool match = false;
    for (size_t begin = 0; begin <= stem.size() && !match;) {
      size_t end = stem.find('_', begin);
      if (end == std::string::npos) end = stem.size();
      match = stem.compare(begin, end - begin, prefix) == 0;
      begin = end + 1;
    }
    if (match) names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  const std::string sep = !dir.empty() && dir.back() == '/' ? "" : "/";
  for (std::string& n : names) n = dir + sep + n;
  return names;
}

}  // namespace strata::io
