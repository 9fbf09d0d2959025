// `strata plan`: cut a model into pipeline stages from its per-layer profile and predict the
// step time of a schedule, for the balanced partition beside the uniform one (and a given one).
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
};

CLI::App* add_plan_command(CLI::App& app, PlanOptions& options);
int run_plan(const PlanOptions& options);

}  // namespace strata::tools
