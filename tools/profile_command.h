// `strata profile`: per-layer forward/backward time, activation and parameter bytes of a model
// on real batches, as a table and optionally a JSON file (the input of the pipeline partitioner).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/allocator.h"
#include "graph/model.h"
#include "graph/profiler.h"
#include "io/dataset.h"

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
  // --colocation (tools/profile_colocation.cpp): the co-location data set of DynPipe's slowdown
  // model, to colocation_output (CSV).
  bool colocation = false;
  int colocation_samples = 8;  // loaded windows
  std::string colocation_output;
  int load_threads = 0;  // the most load threads; 0: twice the cores
  std::string inject;    // --colocation: "kind=device,factor=X" (an emulated device) or empty
};

// The flags that choose the model and its data (--model, --size, --model-spec, --dataset,
// --data-dir), shared by the commands that build a model.
void add_model_flags(CLI::App* command, ProfileOptions& options);

// A model profiled on real batches.
struct ModelProfile {
  // The profile's own allocator (first: it outlives what was allocated from it): the layers'
  // peak bytes are this profile's alone, not those of other threads of the process (local ranks
  // profiling or training at the same time shared the default allocator's window peak).
  std::shared_ptr<Allocator> allocator;
  std::unique_ptr<graph::Model> model;
  std::unique_ptr<graph::LayerProfiler> profiler;
  std::string dataset;  // the dataset's name
  std::string threads;  // the threads the ops ran on, in words
};

// The training split of the flags' dataset (text datasets: their sequence length and task).
std::shared_ptr<const io::Dataset> open_profile_dataset(const ProfileOptions& options);
// The model of the flags, checked against the dataset's samples; `dataset` gets its name.
std::unique_ptr<graph::Model> load_cli_model(const ProfileOptions& options, std::string* dataset);
// Builds the model and runs options.steps training steps of options.batch_size samples (forward,
// loss, backward; no update) after one warm-up step, with the layer profiler attached.
ModelProfile profile_model(const ProfileOptions& options);
// The same on `data`, the dataset the caller will train on (strata train's --partition auto):
// its sequence length, task, vocabulary and image size, whatever `options` says of them.
ModelProfile profile_model(const ProfileOptions& options, std::shared_ptr<const io::Dataset> data);

CLI::App* add_profile_command(CLI::App& app, ProfileOptions& options);
int run_profile(const ProfileOptions& options);
// `strata profile --colocation`.
int run_colocation_profile(const ProfileOptions& options);

}  // namespace strata::tools
