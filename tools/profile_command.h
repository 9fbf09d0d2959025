// `strata profile`: per-layer forward/backward time, activation and parameter bytes of a model
// on real batches, as a table and optionally a JSON file (the input of the pipeline partitioner).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace strata::tools {

struct ProfileOptions {
  std::string model = "cnn";
  std::string size;
  std::string model_spec;
  std::string dataset = "fashion-mnist";
  std::string data_dir;
  int64_t seq_len = 128;  // text datasets: tokens per sample (lm, or mlm for bert)
  int64_t batch_size = 64;
  int64_t steps = 5;
  int threads = 0;
  uint64_t seed = 0;
  std::string output;
};

CLI::App* add_profile_command(CLI::App& app, ProfileOptions& options);
int run_profile(const ProfileOptions& options);

}  // namespace strata::tools
