// What `strata train` decides once, before the ranks start (rank 0 under MPI, which sends it to
// the others): where the stages are cut (--partition) and what each layer's saved tensors do
// (--memory-policy, --memory-plan: parallel/runtime/memory_plan.h). Both may need the model's
// per-layer costs: a --profile file, or a short profiling run on the training set at the
// micro-batch size, measured at most once.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/model.h"
#include "io/dataset.h"
#include "parallel/memory_replan.h"
#include "parallel/partition/partition.h"
#include "parallel/runtime/memory_plan.h"
#include "parallel/trainer.h"
#include "parallel/vpipe/swap_recompute_planner.h"
#include "tools/train_command.h"

namespace strata::tools {

class TrainLayout {
 public:
  TrainLayout(const TrainOptions& options, std::shared_ptr<const io::Dataset> train,
              const parallel::PipelineConfig& pipeline, const graph::Model& model);

  parallel::Partition partition();
  // --partitioner projection: what AMPA and its guard did (empty for the other partitioners).
  const std::string& partition_note() const { return note_; }
  // --memory-policy keep|swap|recompute with --memory-plan's overrides; auto: vPIPE's planner on
  // every stage of `partition` under --mem-limit (an error naming the stage, the bytes its
  // smallest plan needs and the limit when no plan fits), then the overrides.
  parallel::MemoryPlan memory_plan(const parallel::Partition& partition);
  // The plan of `partition` as memory_plan makes it, without throwing: infeasible with the
  // refusal when a stage's smallest plan does not fit (--memory-policy auto; the other policies
  // are feasible by construction). The costs and the bandwidth are measured at the first call
  // and reused, so the same partition always gets the same plan (parallel/memory_replan.h).
  parallel::PartitionMemory plan_partition(const parallel::Partition& partition);
  // --migrate-at under --memory-policy auto: throws, naming the move, for a partition whose
  // smallest plan does not fit --mem-limit (before training).
  void check_migrations(const std::vector<parallel::Migration>& migrations);
  // The planner's per-stage result when --memory-policy auto ran (for the configuration).
  const std::optional<parallel::PipelinePlan>& auto_plan() const { return auto_plan_; }
  double swap_bandwidth() const { return bandwidth_; }

 private:
  const std::vector<parallel::LayerCost>& costs();
  parallel::StageSetting stage_setting();

  const TrainOptions& o_;
  std::shared_ptr<const io::Dataset> train_;
  parallel::PipelineConfig pipeline_;
  const graph::Model& model_;
  std::vector<std::string> names_;
  std::optional<std::vector<parallel::LayerCost>> costs_;
  std::optional<parallel::PipelinePlan> auto_plan_;
  double bandwidth_ = 0.0;
  std::string note_;
};

// The rows per micro-batch of a layout.
int64_t micro_batch_rows(const TrainOptions& options, const parallel::PipelineConfig& pipeline);
// Per-sample layer costs: --profile's (checked against `model`), or a profile of `model` on the
// training set itself at the layout's micro-batch rows (so it sees the samples it will train on:
// sequence length, task, vocabulary, image size).
std::vector<parallel::LayerCost> layer_costs_for(const TrainOptions& options,
                                                 std::shared_ptr<const io::Dataset> train,
                                                 const parallel::PipelineConfig& pipeline,
                                                 const graph::Model& model);
// "keep", or per stage "stage 0: keep embed, swap blocks.0; stage 1: ..." (with the planner's
// predicted peak per stage when it ran).
std::string describe_memory(const TrainOptions& options, const parallel::PipelineConfig& pipeline,
                            const std::vector<std::string>& layer_names,
                            const std::optional<parallel::PipelinePlan>& auto_plan);

// --migrate-at's moves: "before step 10: embed-blocks.2,blocks.3-head (live)".
std::string describe_migrations(const std::vector<parallel::Migration>& migrations,
                                const std::vector<std::string>& layer_names,
                                const std::string& mode);

}  // namespace strata::tools
