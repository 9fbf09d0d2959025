// `strata bench`: with --model, the training throughput of a built-in model on synthetic data
// (step time, samples/s, tokens/s, achieved TFLOP/s and MFU); without it, the op benchmarks: the
// CPU conv2d and matmul beside sgemm (tools/bench/op_bench.h), or with --device cuda:N the hot ops
// of GPT-2 124M and ResNet-50 against the GPU's roofline.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "tools/bench/op_bench.h"

namespace strata::tools {

struct BenchOptions {
  OpBenchOptions ops;  // --threads, --min-seconds, --filter, --json
  std::string model;   // empty: the op benchmarks
  std::string size;    // empty: the model's default size
  int64_t batch_size = 0;
  int64_t seq_len = 0;     // text models; 0: the model's positions (1024 for GPT-2)
  int64_t vocab = 0;       // text models; 0: the model's own (256 for the tiny sizes)
  int64_t image_size = 0;  // image models; 0: 224 for ImageNet-sized models, else 32
  std::string precision = "fp32";
  std::string device;  // empty: auto with --model, cpu for the op benchmarks
  int64_t steps = 20;
  int64_t warmup = 5;
  uint64_t seed = 0;
};

CLI::App* add_bench_command(CLI::App& app, BenchOptions& options);
int run_bench(const BenchOptions& options);
// The model benchmark alone (options.model must be set).
int run_model_bench(const BenchOptions& options);

}  // namespace strata::tools
