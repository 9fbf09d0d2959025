// `strata plan --planner dynpipe`: DynPipe's plan (parallel/dynpipe) beside the dp and projection
// partitions. Over --gpus GPUs (--gpus-per-node per machine, --node-bandwidth inside one,
// --bandwidth between), the Eq. 5 dynamic program gives the best plan and its iteration time
// W(S) for every stage count S; with --dynpipe-epsilon, Algorithm 1 picks S by least T(S) x W(S),
// T(S) the updates of Eq. 3 from the warm-up statistics L, xi^2 and f(w0), given as flags or
// measured by --warmup-steps steps of SGD on the model's data. Every planner's partition is then
// priced by Eq. 5 beside the schedule simulation of `strata plan`.
#pragma once

#include <string>
#include <vector>

#include "parallel/dynpipe/convergence.h"
#include "parallel/partition/partition.h"
#include "tools/plan_command.h"

namespace strata::tools {

void add_dynpipe_flags(CLI::App* plan, PlanOptions& options);
// Throws strata::Error naming the flag for a bad value, or a DynPipe flag without
// --planner dynpipe; called before the model is profiled.
void check_dynpipe_options(const PlanOptions& options);

// L, xi^2 and f(w0) from `steps` steps of plain SGD at `lr` on batches of `batch_size` samples of
// the flags' model and dataset: each step's gradient before and after its update on the same
// batch (parallel::dynpipe::estimate_warmup), so two forward-backward passes per step.
parallel::dynpipe::WarmupEstimate measure_warmup(const ProfileOptions& model, int64_t batch_size,
                                                 int64_t steps, double lr);

// A partition of another planner, with its schedule simulation (ms).
struct PlannedPartition {
  std::string planner;
  parallel::Partition partition;
  double simulated_ms = 0.0;
};

// Algorithm 2's flags (tools/plan_repartition.cpp): --slowdown, --stage-ms, --slowdown-model,
// --rank-counters, --repartition-top-k; checked by check_dynpipe_options.
void add_repartition_flags(CLI::App* plan, PlanOptions& options);
void check_repartition_options(const PlanOptions& options);
// With one of --slowdown, --stage-ms or --slowdown-model: the re-partition of `current` (one rank
// per stage), as a table of the ranks' slowdowns, layers and stage times now and proposed.
void print_repartition(const PlanOptions& options, const std::vector<parallel::LayerCost>& costs,
                       const std::vector<std::string>& names,
                       const parallel::PartitionOptions& partition_options,
                       const PlannedPartition& current);

// Prints DynPipe's section and the comparison of the planners (and the re-partition when asked).
void print_dynpipe_plan(const PlanOptions& options, const std::vector<parallel::LayerCost>& costs,
                        const std::vector<std::string>& names,
                        const parallel::PartitionOptions& partition_options,
                        const std::vector<PlannedPartition>& others);

}  // namespace strata::tools
