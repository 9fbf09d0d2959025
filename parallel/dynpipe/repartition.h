// DynPipe's interference-aware re-partition, the planning side of Algorithm 2 (papers/dynpipe.md
// Sec. 2.8; the paper's Sec. V-B): the layer graph condensed to blocks at the top-k anchors,
// candidate partitions of the blocks over the same ranks scored by a cycle-time simulator with
// each rank's predicted slowdown, the current partition always a candidate.
//
// Decisions where the paper is silent (papers/dynpipe.md Sec. 6 items 7-9):
//  - Condensation: the top_k layers of most forward + backward time are anchors; a block is the
//    layers after the previous anchor up to and including an anchor, and the layers after the last
//    anchor form a tail block. The current partition's cuts are also block ends, so the current
//    plan is one of the condensed candidates. top_k = 0 (or >= M): every layer is a block.
//  - Candidates: one stage per rank, stage s on rank s (the ranks do not move, the layers do),
//    every contiguous partition of the blocks into as many stages as the current one. Their best
//    is found exactly by dynamic programming (the cycle-time recursion is non-decreasing in the
//    prefix's time, as Eq. 5's DP in cost_model.h), which equals exhaustive enumeration of the
//    boundary combinations (tested) in O(B^2 S) instead of C(B - 1, S - 1) simulations.
//  - Simulator: Eq. 4/5 folded over the stages (the corrected rule by default), a stage's time =
//    its rank's slowdown x micro_batch_size x sum (p^f + p^b) of its layers, and the boundary
//    after layer l costs Eq. 7 on one GPU per side: 2 x micro_batch_size x out_bytes_l / bandwidth
//    (activation forward, gradient back; not slowed: the interference is on compute).
//  - The slowdown of a rank may depend on the layers a candidate puts there (the forest predicts
//    per layer from the layer's own features and the rank's counters); a stage's slowdown is then
//    the solo-time-weighted mean of its layers' (make_forest_slowdown).
//  - The proposal moves only when it is better than the current plan by more than `min_gain`
//    (a fraction of the current cycle time); otherwise the current plan is returned.
//  - dynpipe-no-rf (the paper's baseline): the slowdown of a rank is its last measured stage time
//    over the stage's solo time (measured_slowdowns), the same for any layers placed there.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "parallel/dynpipe/cost_model.h"
#include "parallel/partition/partition.h"

namespace strata::parallel::dynpipe {

class ForestModel;

struct RepartitionOptions {
  size_t top_k = 0;               // anchors of the condensation; 0: no condensation
  double micro_batch_size = 1.0;  // samples per iteration
  double bandwidth_bps = 0.0;     // link between consecutive ranks; 0: free
  TwoStageRule rule = TwoStageRule::kCorrected;
  double min_gain = 1e-9;  // relative improvement over the current plan needed to move
};

// The slowdown (>= 0, 1 = solo speed) of `rank` were it to run `layers`.
using SlowdownFn = std::function<double(int rank, LayerRange layers)>;
// A fixed factor per rank, whatever layers it runs. Throws strata::Error for a factor that is not
// positive and finite.
SlowdownFn per_rank_slowdown(const std::vector<double>& factors);

// Algorithm 2's ModelCondense: contiguous blocks covering the layers (see the file comment);
// `keep` (may be empty) adds its cuts as block ends.
std::vector<LayerRange> condense(const std::vector<LayerCost>& layers, size_t top_k,
                                 const Partition& keep = {});

// The simulator: predicted cycle (iteration) time of `partition`, stage s on rank s, in ms;
// `stage_ms` (optional) gets each stage's slowed time.
double simulate_cycle(const std::vector<LayerCost>& layers, const Partition& partition,
                      const SlowdownFn& slowdown, const RepartitionOptions& options,
                      std::vector<double>* stage_ms = nullptr);

struct Proposal {
  Partition partition;            // the best plan (the current one unless it is beaten)
  double cycle_ms = 0.0;          // its predicted cycle time
  double current_cycle_ms = 0.0;  // the current plan's, under the same slowdowns
  bool changed = false;           // partition != current
  size_t blocks = 0;              // after condensation
  std::vector<double> stage_ms;   // the proposal's slowed stage times
};

// Algorithm 2's Repartition for the current partition over its ranks. Throws strata::Error for a
// partition that does not cover `layers` contiguously, or negative/non-finite costs.
Proposal propose(const Partition& current, const std::vector<LayerCost>& layers,
                 const SlowdownFn& slowdown, const RepartitionOptions& options);
// The same with one factor per rank (the size of `current`).
Proposal propose(const Partition& current, const std::vector<LayerCost>& layers,
                 const std::vector<double>& rank_slowdown, const RepartitionOptions& options);

// dynpipe-no-rf: each rank's last measured stage time (ms per iteration) over the simulator's
// solo time of its stage. Throws for a count that differs from the stages or a time that is not
// positive.
std::vector<double> measured_slowdowns(const std::vector<LayerCost>& layers,
                                       const Partition& current,
                                       const std::vector<double>& measured_stage_ms,
                                       const RepartitionOptions& options);

// The forest's prediction per candidate stage: each layer's row of feature set kFeatureSet
// (slowdown_features.h: the same function as the profile's rows), from the layer (layer_solo_ms =
// forward + backward ms per sample, parameter, output and activation bytes) and the rank's
// counters (`rank_counters[rank]`, by name: feature_counter_names() needed); a stage's slowdown is
// the solo-time-weighted mean of its layers' (clamped below at 1e-3). Predictions are made once per
// rank and layer here. Throws strata::Error for a model of another feature set or a counter
// missing from a rank's.
SlowdownFn make_forest_slowdown(const ForestModel& model, const std::vector<LayerCost>& layers,
                                const std::vector<std::map<std::string, double>>& rank_counters);

}  // namespace strata::parallel::dynpipe
