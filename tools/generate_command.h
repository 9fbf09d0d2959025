// `strata generate`: text from a GPT-2, streamed to stdout token by token, with a key/value cache
// (graph/decoding.h) so that each new token costs one position.
//
//   strata generate --weights runs/brown --prompt "The jury said" --max-tokens 64 --top-k 40
//   strata generate --model gpt2 --size 124M --weights gpt2.safetensors --prompt "Hello"
//
// The weights are those of `strata convert --weights`: a checkpoint directory (its manifest gives
// the model), a safetensors file Strata wrote, or a Hugging Face GPT-2 file (GPT2LMHeadModel or
// GPT2Model names; its dimensions are read from its tensors). The prompt is encoded with GPT-2's
// BPE; an empty prompt starts from <|endoftext|>. The text goes to stdout, a line of statistics
// (tokens, time, tokens/s) to stderr.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "models/generation.h"
#include "tools/weights_source.h"

namespace strata::tools {

struct GenerateOptions {
  ModelSource source;
  std::string prompt;
  int64_t max_tokens = 64;
  models::SamplingOptions sampling;
  std::string kv_cache = "on";  // off: every token recomputes the whole prefix (for comparison)
  std::string vocab_dir;
  std::string device = "auto";
  int threads = 0;
};

CLI::App* add_generate_command(CLI::App& app, GenerateOptions& options);
int run_generate(const GenerateOptions& options);

}  // namespace strata::tools
