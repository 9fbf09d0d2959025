// vPIPE's swap/recompute planner run again when layers move (../shared/papers/vpipe.md §2.3,
// Algorithm 1: sub-problem A, each stage's swap/recompute plan for a fixed partition, alternates
// with sub-problem B, the partition for fixed plans; §2.7: a plan is applied only when it fits).
//
// Who plans. `--memory-policy auto` plans the stages with Algorithm 2
// (parallel/vpipe/swap_recompute_planner.h) from per-layer costs (a profile) and the measured
// host-device bandwidth, both obtained once before training on world rank 0 (tools/train_layout.h).
// Both are timings that another rank would measure differently, so the plan of a new partition is
// made on rank 0 only, by the MemoryPlanner the CLI gives it, from those cached numbers (the same
// partition always gets the same plan there), and its per-layer policies reach every rank through
// one collective (share_memory_plan). Every rank of every data-parallel group therefore runs the
// same plan.
//
// When. Before every re-layout (a --migrate-at move, a move the repartition loop decided, a run
// resumed into a later layout): the new partition's plan is made and shared before any layer
// moves; a partition whose smallest plan does not fit --mem-limit stops the run there, naming it
// (the CLI refuses such a --migrate-at before training; the loop never decides one). The
// repartition loop (parallel/repartition_loop.h) scores each candidate partition with its own
// plan's predicted overhead: recomputed forwards and swap traffic not hidden behind compute.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "parallel/comm/communicator.h"
#include "parallel/partition/partition.h"
#include "parallel/runtime/memory_plan.h"
#include "parallel/vpipe/swap_recompute_planner.h"

namespace strata::parallel {

// The memory plan of one partition.
struct PartitionMemory {
  bool feasible = false;
  // Not feasible: which stage (and its layers) does not fit, the bytes its smallest plan needs
  // per rank and the limit.
  std::string refusal;
  MemoryPlan plan;                // every model layer (--memory-plan's overrides applied)
  std::vector<StagePlan> stages;  // the planner's, per stage: predicted peak and times
  // Per model layer: the time its policy adds (a recomputed forward; its share of the stage's
  // swap traffic that the window does not hide), as a fraction of its forward + backward.
  std::vector<double> layer_overhead;
};

// The plan of a partition (world rank 0 calls it; it must be deterministic in its argument).
using MemoryPlanner = std::function<PartitionMemory(const Partition&)>;

// `plan`'s per-layer overheads over `layers`' costs (one micro-batch): a recomputed layer adds
// its forward; a stage's exposed swap time is shared by its swapped layers in proportion to
// their saved bytes.
std::vector<double> layer_overheads(const std::vector<LayerMemoryCost>& layers,
                                    const PipelinePlan& plan, const Partition& partition);

// The slowest stage of `partition` when layer l takes base[l] * (1 + overhead[l]) seconds.
double slowest_stage_with_overhead(const Partition& partition, const std::vector<double>& base,
                                   const std::vector<double>& overhead);

// One stage of a plan, as the {"type":"memory_plan"} metrics record writes it.
struct StageMemoryPlanRecord {
  int stage = 0;
  std::string plan;  // "keep embed-blocks.0, recompute blocks.1"
  double predicted_peak_bytes = 0.0;
  double predicted_forward_s = 0.0;   // per micro-batch
  double predicted_backward_s = 0.0;  // per micro-batch, recompute and exposed swap included
  double predicted_recompute_s = 0.0;
  double predicted_exposed_swap_s = 0.0;
};
std::vector<StageMemoryPlanRecord> memory_plan_records(const MemoryPlan& plan,
                                                       const std::vector<StagePlan>& stages,
                                                       const Partition& partition,
                                                       const std::vector<std::string>& names);

// Rank 0 calls `planner` for `to` and every rank of `world` (null: this process alone) gets the
// plan's feasibility, refusal and per-layer policies (one collective). The planner's per-stage
// predictions and overheads stay on rank 0. `layers`: the model's.
PartitionMemory share_memory_plan(Communicator* world, int rank, const MemoryPlanner& planner,
                                  const Partition& to, size_t layers);

}  // namespace strata::parallel
