// Repartition at run time (vPIPE Algorithm 1, ../shared/papers/vpipe.md §2.3): a policy looks at
// the statistics the stages measured over the last window of steps and proposes a new partition,
// or none; the trainer (parallel/repartition_loop.h) gathers the statistics, asks the policy on
// one rank, hands its decision to every rank and moves the layers through the step-boundary
// migration of --migrate-at.
//
// A policy is an implementation of RepartitionPolicy. vPIPE's (`vpipe`): each layer costs what it
// was measured to cost where it ran (forward + backward seconds per step, as vPIPE's training
// monitor reports t^fwd and t^bwd per layer), the partitioner is Algorithm 3 (one-step coarsening,
// recursive Kernighan-Lin bisection, refinement: parallel/vpipe/kl_partitioner.h) over the chain
// of layers, and a plan is applied only when its predicted slowest stage is below the current
// partition's, predicted the same way, by more than `threshold` (a fraction): checkBalanced.
// Another policy (DynPipe's interference-aware planner) plugs in by implementing propose().
//
// With a memory planner (--memory-policy auto, parallel/memory_replan.h), the vpipe policy is
// Algorithm 1's alternation: the measured layer times less the current plan's overhead (a
// replayed forward counts in its layer's backward) are each layer's base time; with the layers'
// swap/recompute policies held (sub-problem B), Algorithm 3 partitions the layers at their base
// time plus their policy's overhead; each stage of the result, and of the partitions on the way
// from the current one to it (each boundary moved part of the way), gets its own plan (sub-problem
// A); a candidate whose smallest plan does not fit --mem-limit is dropped (and reported), the
// others are scored by their slowest stage at base time plus their own plan's overhead
// (recomputed forwards, swap traffic the window does not hide); the best becomes the current one
// and the two steps alternate while the score improves (at most 10 rounds, as the paper reports
// converging within 10). Only a plan that beats the current partition with its current plan by
// `threshold` is applied.
//
// What the per-layer model cannot see: a layer's time belongs to the layer, not to the rank that
// ran it, so a rank that is slow for every layer (a co-located job) makes its layers look heavy,
// and a layer moved off it is predicted to stay as heavy. The loop measures again after the move
// and may move more layers at the next window (the prediction is conservative: it never moves
// layers onto a slow rank because they looked cheap there).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/memory_replan.h"
#include "parallel/partition/partition.h"

namespace strata::parallel {

// What the stages measured over a window of steps, per step (means over the data-parallel
// groups), in the partition in force during the window.
struct RepartitionInput {
  int64_t step = 0;                        // optimizer steps done at the end of the window
  int64_t window_steps = 0;                // steps the window spans
  Partition partition;                     // the current one
  std::vector<double> layer_seconds;       // per model layer: forward + backward, per step
  std::vector<double> stage_busy_seconds;  // per stage: compute instructions, per step
  // What DynPipe's policies read besides (parallel/dynpipe/policy.h): samples per step (of one
  // group), per model layer the outputs' and activations' bytes per sample and the parameters'
  // bytes, and per stage the CPU counters of the monitor's latest samples (means over groups;
  // empty without the monitor).
  double samples_per_step = 1.0;
  std::vector<double> layer_output_bytes, layer_activation_bytes, layer_param_bytes;
  std::vector<std::map<std::string, double>> stage_counters;
  // --memory-policy auto: the plan of a candidate partition (empty: the layers keep everything).
  MemoryPlanner memory;
};

// A candidate partition whose smallest memory plan does not fit --mem-limit.
struct DroppedPartition {
  Partition partition;
  std::string why;
  std::string name;  // the partition as --partition writes it (the repartition loop fills it)
};

struct RepartitionDecision {
  bool apply = false;
  Partition partition;            // the proposal (the current partition when none is better)
  double current_cost = 0.0;      // the current partition's slowest stage, predicted (s/step)
  double predicted_cost = 0.0;    // the proposal's slowest stage, predicted (s/step)
  double measured_slowest = 0.0;  // the slowest stage's measured busy time (s/step)
  std::string reason;             // why it is applied or not
  // With a memory planner: candidates dropped because no plan fits, and the memory plan each
  // stage of `partition` gets ("stage 0: keep conv1-bn2; stage 1: ...").
  std::vector<DroppedPartition> infeasible;
  std::string memory_plan;
  // The predicted gain: 1 - predicted / current (0 when nothing is proposed).
  double gain() const { return current_cost > 0 ? 1.0 - predicted_cost / current_cost : 0.0; }
};

class RepartitionPolicy {
 public:
  virtual ~RepartitionPolicy() = default;
  virtual const char* name() const = 0;
  // Called on one rank; must be deterministic in its input.
  virtual RepartitionDecision propose(const RepartitionInput& input) = 0;
};

// --repartition vpipe; `threshold`: the least relative gain applied. Throws for a threshold
// outside [0, 1).
std::unique_ptr<RepartitionPolicy> make_vpipe_policy(double threshold);
// --repartition NAME with its defaults (vpipe, dynpipe-no-rf, pipedream-re; dynpipe needs its
// model: make_policy in parallel/dynpipe/policy.h). Throws for an unknown name or a threshold
// outside [0, 1).
std::unique_ptr<RepartitionPolicy> make_repartition_policy(const std::string& name,
                                                           double threshold);

// The partitions on the way from `from` to `to`, `to` first: each boundary moved k / n of its way
// (rounded; n the longest boundary move, k = n .. 1), those with an empty stage left out.
std::vector<Partition> partitions_between(const Partition& from, const Partition& to);

// The slowest stage of `partition` when every layer costs `layer_seconds` (the vpipe policy's
// prediction).
double slowest_stage_seconds(const Partition& partition, const std::vector<double>& layer_seconds);

}  // namespace strata::parallel
