// The GPT-2 vocabulary readers (io/bpe.h): encoder.json (our flat JSON reader) and vocab.bpe.
// Input: [encoder.json][vocab.bpe], split at the first "#version" (the merges file's header);
// without one, the merges file is the header alone. An accepted vocabulary tokenizes a fixed text
// and decodes it back.
#include "engine/check.h"
#include "fuzz/fuzz_util.h"
#include "io/bpe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  if (size > 65536) return 0;
  const std::string_view input = fuzz::as_text(data, size);
  const size_t split = std::min(input.find("#version"), input.size());
  const std::string merges =
      split < input.size() ? std::string(input.substr(split)) : std::string("#version: 0.2\n");
  const fuzz::ScratchDir& dir = fuzz::scratch();
  const std::string encoder_path = dir.write("encoder.json", input.substr(0, split));
  const std::string merges_path = dir.write("vocab.bpe", merges);
  try {
    io::BpeTokenizer bpe(encoder_path, merges_path);
    const std::string text = "Hello, world! It's 2024:\n\ttokens \xff\xfe caf\xc3\xa9.";
    const std::vector<int32_t> ids = bpe.encode(text);
    for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < bpe.vocab_size());
    FUZZ_CHECK(bpe.decode(ids) == text);
  } catch (const Error&) {
  }
  return 0;
}
