// vPIPE's per-stage swap/recompute planner (Algorithm 2, ../shared/papers/vpipe.md §2.4), over
// the memory and time models of memory_model.h, and the plan of a whole pipeline
// (--memory-policy auto).
//
// Algorithm 2 as implemented, with the readings of the note's §6 that it leaves open:
//  1. Per layer that saves anything: if moving its tensors one way costs more than recomputing it
//     (a_i / P > f_i) its cheaper op is recompute at cost f_i, else swap at cost a_i / P.
//  2. gain = a_i / cost (bytes freed per second of overhead; the p - k copies multiply every
//     layer's bytes alike, so the order ignores them, §6.4). Layers are taken by decreasing gain,
//     then decreasing a_i, then increasing index (deterministic).
//  3. window = t_fwd + t_bwd of the all-keep stage; the PCIe budget is P x window bytes per
//     micro-batch, and a swapped layer costs 2 a_i of it (out and back in: Eq. 2's charge, not
//     Alg. 2's rank x a_i, §6.3).
//  4. Step 5 (hidden swaps): in gain order, layers whose cheaper op is swap are swapped while the
//     stage is over its limit and their 2 a_i still fits the budget; the budget is checked before
//     a layer is taken, never overshot, and layers whose op is recompute are skipped (§6.3).
//     Unlike the paper's box, swapping stops once the stage fits (no PCIe load for no memory
//     need, §6.3).
//  5. Step 6: while the stage is over its limit, the next layer in gain order (still kept) gets
//     its cheaper op, even if that swap is exposed (Eq. 2 charges the excess).
//  6. Every other layer keeps its tensors.
// "Over its limit" is the full peak of memory_model.h (Eq. 1 plus the boundary and transients),
// not Eq. 1 alone, so that the plan holds in a real run. When the greedy plan still does not fit,
// all-swap and all-recompute are tried too, the faster fitting one taken; when none fits, the
// stage is infeasible and the smallest of those peaks is reported.
#pragma once

#include <string>
#include <vector>

#include "parallel/runtime/memory_plan.h"
#include "parallel/vpipe/memory_model.h"

namespace strata::parallel {

struct StagePlan {
  bool feasible = false;
  MemoryPlan plan;  // over the model's layers; only the stage's are set
  StageMemoryEstimate memory;
  StageTimeEstimate time;
  double smallest_peak_bytes = 0.0;  // the least any tried plan needs (infeasible stages)
};

// Algorithm 2 for the stage holding layers[first .. first + stage_layers.size()) of a model of
// `model_layers` layers, under `limit_bytes` (0: no limit, every layer keeps).
StagePlan plan_stage(const std::vector<LayerMemoryCost>& stage_layers, size_t first,
                     size_t model_layers, const StageSetting& setting, double limit_bytes);

struct PipelinePlan {
  MemoryPlan plan;                // every layer of the model
  std::vector<StagePlan> stages;  // per stage
  bool feasible = true;
};

// Every stage of `partition` planned under `limit_bytes` per rank; `base` gives the setting shared
// by the stages (its stage index is replaced).
PipelinePlan plan_pipeline(const std::vector<LayerMemoryCost>& layers, const Partition& partition,
                           const StageSetting& base, double limit_bytes);

}  // namespace strata::parallel
