// `strata plan`: cut a model into pipeline stages from its per-layer profile and predict the
// step time of a schedule, for the balanced partition beside the uniform one (and a given one),
// GroPipe's projection partition, and with --planner dynpipe DynPipe's plan (plan_dynpipe.h).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "tools/profile_command.h"

namespace strata::tools {

struct PlanOptions {
  ProfileOptions model;  // the model flags, --threads and --seed for profiling on the spot
  int64_t profile_steps = 3;
  int stages = 2;
  int64_t micro_batches = 4;
  int64_t batch_size = 64;
  std::string schedule = "1f1b";
  std::string profile;  // a JSON from `strata profile --output`; empty: profile now
  double bandwidth_gbps = 10.0;
  std::string mem_limit;  // per stage; empty: none
  int optimizer_slots = 2;
  std::string partition;  // a manual partition to evaluate
  // --memory-policy auto: vPIPE's per-stage swap/recompute plan of the balanced partition under
  // --mem-limit (parallel/vpipe/swap_recompute_planner.h).
  std::string memory_policy = "keep";
  double swap_bandwidth_gbps = 0.0;  // host-device copies; 0: measure this machine's
  std::string precision = "fp32";    // bf16/fp16: 16-bit working copies in the memory model
  // GroPipe's AMPA (parallel/partition/projection.h), as strata train takes them.
  std::string ampa_normalize = "on";
  double ampa_threshold = 0.01;
  std::string ampa_guard = "even";
  // --planner dynpipe (parallel/dynpipe, tools/plan_dynpipe.h): DynPipe's plan over --gpus beside
  // the others, with the stage count of Algorithm 1 when --dynpipe-epsilon is given.
  std::string planner = "default";
  int gpus = 0;                      // 0: --stages
  int gpus_per_node = 0;             // 0: one machine
  double node_bandwidth_gbps = 0.0;  // links inside a machine; 0: --bandwidth
  std::string tensor_parallel = "off";
  std::string dynpipe_rule = "corrected";
  std::string dynpipe_search = "full";
  double dynpipe_lr = 0.01;
  double dynpipe_epsilon = 0.0;  // 0: no convergence target, S = --stages
  // Eq. 3's warm-up statistics; negative: measured by --warmup-steps.
  double dynpipe_smoothness = -1.0;
  double dynpipe_noise = -1.0;
  double dynpipe_initial_loss = -1.0;
  int64_t warmup_steps = 0;
  // DynPipe's re-partition (Algorithm 2, tools/plan_repartition.cpp) of the current plan (the
  // given --partition, else the dp one) under per-rank slowdowns: given factors, measured stage
  // times (dynpipe-no-rf), or the slowdown forest with each rank's counters.
  std::string slowdown;        // "RANK:FACTOR,..."
  std::string stage_ms;        // "MS,MS,..." measured per stage
  std::string slowdown_model;  // a forest of `strata fit-slowdown`
  std::string rank_counters;   // JSON: one object of counters per rank
  int repartition_top_k = 0;
};

CLI::App* add_plan_command(CLI::App& app, PlanOptions& options);
int run_plan(const PlanOptions& options);

}  // namespace strata::tools
