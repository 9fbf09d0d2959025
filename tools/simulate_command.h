// `strata simulate`: a layout of G groups x S stages on a cluster, simulated from the executor's
// instruction lists (parallel/sim) over a cost model (a profile or a device model), or searched
// for (--search) at one or several GPU counts.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace strata::tools {

struct SimulateOptions {
  // The model.
  std::string model = "gpt2";
  std::string size;  // "" = the model's default
  std::string model_spec;
  int64_t seq_len = 0;      // text models: tokens per sample (0: the model's positions)
  std::string input_shape;  // image models: C,H,W (default 3,224,224)
  int64_t num_classes = 0;  // image models: classes (default 1000)
  int64_t layers = 0, width = 0, heads = 0, vocab = 0;  // dimensions over the named size
  // Costs.
  std::vector<std::string> profile;  // FILE or FILE@BATCH, repeatable
  std::string device_model;          // h100, h200, a100, or a name with --device-* flags
  double device_tflops = 0;          // overrides of the device model
  double device_bandwidth = 0;       // GB/s
  std::string device_memory;         // 80GB
  double host_bandwidth = 0;         // GB/s
  double nvlink_bandwidth = 0;       // GB/s
  double launch_us = -1;
  std::string efficiency;
  std::string precision = "fp32";
  double optimizer_gbs = 0;     // parameter GB/s of the optimizer step (0: the device's)
  double step_overhead_ms = 0;  // per step and rank
  // The cluster.
  std::string gpus = "0";  // N, or N1,N2,... with --search; 0: groups x stages
  int gpus_per_node = 8;
  std::string intra_link;  // "" : nvlink (pcie for a device without)
  std::string inter_link = "infiniband";
  double intra_bandwidth = 0, inter_bandwidth = 0;      // GB/s
  double intra_latency_us = -1, inter_latency_us = -1;  // us
  std::string all_reduce = "ring";
  // The layout.
  int stages = 1;
  int groups = 0;  // 0: GPUs / stages
  int64_t micro_batches = 1;
  int64_t batch_size = 64;
  int64_t batch_per_gpu = 0;  // > 0: the batch is this x the GPU count
  std::string schedule = "1f1b";
  std::string partition = "auto";
  std::string partitioner = "dp";
  std::string memory_policy = "keep";
  std::string optimizer = "adamw";
  double momentum = 0.9;
  std::string dp_overlap = "on";
  double dp_bucket_mb = 25.0;
  int dp_delay = 0;
  int steps = 0;
  std::string mem_limit;  // per GPU, over the device's memory
  // Outputs.
  std::string json, trace, plot;
  bool search = false;
  int top = 10;
  std::string search_micro_batches;
  std::string search_schedules = "gpipe,1f1b";
  std::string search_policies = "keep,recompute,swap";
  std::string search_partitioners = "dp,uniform";
};

CLI::App* add_simulate_command(CLI::App& app, SimulateOptions& options);
int run_simulate(const SimulateOptions& options);

}  // namespace strata::tools
