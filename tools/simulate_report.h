// What `strata simulate` prints and writes: the report of one simulated layout, its JSON, the
// search tables, and the SVG plots (tools/svg_plot.h).
#pragma once

#include <string>
#include <vector>

#include "parallel/sim/cluster.h"
#include "parallel/sim/search.h"
#include "parallel/sim/simulator.h"

namespace strata::tools {

// What the report needs besides the simulation.
struct SimContext {
  std::string model;        // "gpt2-1558M"
  std::string cost_source;  // "device model h100 (...)", "profile p.json"
  std::string precision;    // fp32, tf32, bf16, fp16
  std::vector<std::string> layer_names;
  parallel::sim::Cluster cluster;
  int64_t batch_size = 0;
  int64_t tokens_per_sample = 0;  // text models: T; 0 otherwise
  double flops_per_sample = 0;    // model FLOPs of a training sample (models/flops.h)
  double peak_flops = 0;          // per GPU at the run's precision; 0: no MFU (a profile)
  double capacity = 0;            // bytes per GPU; 0: unlimited
  std::string memory_policy;
};

struct Throughput {
  double samples_per_s = 0, tokens_per_s = 0, mfu = 0;
};
Throughput throughput(const SimContext& ctx, const parallel::sim::SimResult& r, int ranks);

void print_simulation(const SimContext& ctx, const parallel::sim::SimConfig& config,
                      const parallel::sim::SimResult& result);
std::string simulation_json(const SimContext& ctx, const parallel::sim::SimConfig& config,
                            const parallel::sim::SimResult& result);

// One GPU count's search: the best `top` and why the others lose.
void print_search(const SimContext& ctx, const std::vector<parallel::sim::Candidate>& ranked,
                  int top);

// The best layout at each GPU count beside the best plain data-parallel (S = 1) and plain
// pipeline (G = 1) layouts.
struct ScaleRow {
  int gpus = 0;
  int64_t batch_size = 0;
  const parallel::sim::Candidate* best = nullptr;
  const parallel::sim::Candidate* data_parallel = nullptr;
  const parallel::sim::Candidate* pipeline = nullptr;
  SimContext ctx;
  size_t candidates = 0;
};
void print_scaling(const std::vector<ScaleRow>& rows);
std::string search_json(const std::vector<ScaleRow>& rows,
                        const std::vector<std::vector<parallel::sim::Candidate>>& all);

}  // namespace strata::tools
