// llm.c token shards (io/token_shard.h): the mapped reader and the whole-file reader must agree
// on which files are shards and on their tokens.
#include "engine/check.h"
#include "fuzz/fuzz_util.h"
#include "io/token_shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  const std::string path = fuzz::scratch().write("shard.bin", fuzz::as_text(data, size));
  bool mapped_ok = false, read_ok = false;
  std::vector<uint16_t> mapped, read;
  try {
    io::TokenShard shard(path);
    FUZZ_CHECK(io::kTokenShardHeaderBytes + 2 * static_cast<size_t>(shard.size()) == size);
    mapped.assign(shard.tokens(), shard.tokens() + shard.size());
    mapped_ok = true;
  } catch (const Error&) {
  }
  try {
    read = io::read_token_shard(path);
    read_ok = true;
  } catch (const Error&) {
  }
  FUZZ_CHECK(mapped_ok == read_ok);
  FUZZ_CHECK(mapped == read);
  return 0;
}
