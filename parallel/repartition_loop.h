// --repartition: vPIPE's Algorithm 1 in the trainer (../shared/papers/vpipe.md §2.3), around a
// RepartitionPolicy (parallel/vpipe/repartition.h).
//
// Statistics. Every stage times each layer's training forward and backward
// (parallel/runtime/stage_memory.h) and its compute instructions; over a window of `every` steps
// these ride on the step-metrics all-reduce the trainer makes after every step anyway (the
// window's per-layer seconds and per-stage busy seconds appended to it at the window's last
// step): no message of their own, and every rank gets the sums.
// Decision. Rank 0 asks the policy (only it: the decision is not recomputed from floating sums on
// every rank); its answer (a flag and the S - 1 cuts) rides on the next step's metrics all-reduce,
// where the other ranks add zeros, so every rank holds the same decision one step later, and the
// layers move before the step after that, through the --migrate-at re-layout (the executor
// rebuilt). Timeline for a decision after step d (counted from 1): statistics of steps
// (d - every, d]; the plan reaches every rank with step d + 1; the move goes before step d + 2,
// or, under an asynchronous schedule (one program whose segments overlap), before the step e the
// trainer's apply-step function names (set_apply_step: the first step >= d + 2 where the program
// cut there agrees with the one that ran; parallel/trainer_layout.cpp). Rank 0 asks for e when it
// decides (its record's apply_step), every rank again when it learns the plan (the function is
// deterministic: they agree). No decision is made while a decided move has not gone yet.
// No decision is made on a window that a migration cut short (vPIPE: no planning while
// migrating): the window starts again after each move. A move whose layout measures slower (the
// slowest stage's busy time per step) than the one it left by more than the noise margin (the
// threshold, --repartition-threshold's fraction) is undone at the next decision, and that
// partition is not applied again from the layout it was undone to unless that layout comes to
// measure more than kRetryMargins margins (20% by default) above what it measured then (a
// slowdown began: the rejected partition may be tried again).
// Memory (--memory-policy auto, parallel/memory_replan.h): rank 0 gives the policy the memory
// planner, so that vpipe scores its candidates with their own swap/recompute plans (Algorithm 1's
// alternation: parallel/vpipe/repartition.h); any policy's proposal whose smallest plan does not
// fit --mem-limit is not applied, and the record says why. The layers' plan is made again for the
// partition they move to (parallel/trainer_layout.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "graph/model.h"
#include "parallel/dynpipe/monitor.h"
#include "parallel/partition/partition.h"
#include "parallel/runtime/stage_memory.h"
#include "parallel/vpipe/repartition.h"

namespace strata::parallel {

struct RepartitionConfig {
  std::string policy = "off";  // off | vpipe | dynpipe | dynpipe-no-rf | pipedream-re
  int64_t every = 20;          // steps per window (>= 2); 0: the policy's default (resolve_every)
  double threshold = 0.05;     // the least predicted gain applied (a fraction)
  std::string slowdown_model;  // dynpipe: --slowdown-model FILE
  std::string slowdown_fallback;  // dynpipe: "" or "no-rf" (--slowdown-fallback)
  int64_t top_k = 0;              // dynpipe*: --repartition-top-k (0: no condensation)
  // --monitor-interval-ms: the runtime monitor's period (parallel/dynpipe/monitor.h); 0: off.
  double monitor_interval_ms = 0.0;
  // The policy's default window: 20 steps, or for pipedream-re the epoch (`steps_per_epoch`).
  static int64_t resolve_every(const RepartitionConfig& config, int64_t steps_per_epoch);
};

// One decision, reported by rank 0 (TrainObserver::on_repartition).
struct RepartitionRecord {
  int64_t step = 0;        // optimizer steps done when it was decided
  int64_t apply_step = 0;  // the layers move before this step (0: not applied)
  std::string policy;
  std::string current, proposed;  // partitions, as --partition writes them
  RepartitionDecision decision;
  std::vector<double> layer_seconds;       // the window's, per model layer, per step
  std::vector<double> stage_busy_seconds;  // the window's, per stage, per step
};

class RepartitionLoop {
 public:
  // `names`: the model's layers; this rank is `stage` of `stages` in one of `groups` groups.
  RepartitionLoop(const RepartitionConfig& config, std::vector<std::string> names, int rank,
                  int stage, int stages, int groups, int64_t total_steps);
  bool active() const { return policy_ != nullptr; }
  // What DynPipe's policies read besides the times: the model's layers (parameter bytes), the
  // world's size (the monitor's slots) and the samples of a step per group.
  // `memory`: the memory planner (--memory-policy auto; rank 0's is used), or empty.
  void describe(const graph::Model& model, int world, double samples_per_step,
                MemoryPlanner memory = {});
  // The monitor's samples that reached this rank with the last exchange (rank 0 reports them).
  const std::vector<dynpipe::MonitorSample>& fresh_samples() const { return fresh_; }

  using Ranges = std::vector<std::pair<size_t, size_t>>;  // [begin, end) per stage

  // After step `step` (from 0) ran: what this rank appends to the step's metrics all-reduce
  // (empty on most steps; the same length on every rank). `memory`: the executor's statistics
  // (per-layer times since it was made); `busy_seconds`: the step's compute time here.
  std::vector<double> contribution(int64_t step, const StageMemoryStats& memory,
                                   double busy_seconds, const Ranges& current);
  // The world's sum of the contributions of step `step`. On the decision step rank 0 decides and
  // returns the record to report; on the next step every rank learns the decision.
  std::optional<RepartitionRecord> absorb(int64_t step, const std::vector<double>& sum,
                                          const Ranges& current);
  // Both around `sum`, the step's metrics all-reduce of `metrics` (left as it was given).
  std::optional<RepartitionRecord> exchange(int64_t step, const StageMemoryStats& memory,
                                            double busy_seconds, const Ranges& current,
                                            std::vector<double>* metrics,
                                            const std::function<void(std::vector<double>*)>& sum);
  // The partition to move to before step `step` (from 0), if the loop decided one.
  std::optional<Ranges> due(int64_t step) const;
  // The step a move was learned for with the exchange of step `step` (after it ran), if one was.
  std::optional<int64_t> learned(int64_t step) const;
  // Where a move decided now goes: given the earliest step (the decision's step + 2) and the
  // partitions it goes from and to, the step before which the layers move, or -1 where none can
  // (the move is then not applied). Called on every rank alike (deterministic); unset: the
  // earliest step (synchronous schedules).
  using ApplyStep =
      std::function<int64_t(int64_t earliest, const Partition& from, const Partition& to)>;
  void set_apply_step(ApplyStep apply_step) { apply_step_ = std::move(apply_step); }
  // Refuses what the loop does not support (errors name --repartition): an asynchronous schedule
  // other than async-1f1b with --migration live (`live_async`) without --migration restart, and
  // one with swapped layers (their prefetches are laid out for the asynchronous run before a
  // move is decided).
  static void check(const RepartitionConfig& config, bool synchronous, bool restart, bool swaps,
                    bool live_async = false);
  // The layers moved. `now`: the executor's statistics when it was kept (a live move: its layer
  // times go on counting, the window starts from them); null: the executor is new, its layer
  // times count from zero.
  void migrated(const StageMemoryStats* now = nullptr);

 private:
  bool decides_after(int64_t step) const;
  // Per stage, the mean of the monitor's latest counters over its ranks (a stage none of whose
  // ranks sampled yet: empty).
  std::vector<std::map<std::string, double>> stage_counters() const;
  // Only moves that measure better stay (vPIPE applies only improving plans; the prediction can
  // be wrong: a layer's time depends on the rank that runs it): when the slowest stage's measured
  // busy time after the policy's last move is above the one before it by more than the margin
  // (config.threshold), the layers move back, and that partition is not applied again from the
  // layout it left until that layout measures more than kRetryMargins margins above its
  // measurement then. A single noisy window thus neither undoes a move nor locks out a plan for
  // good, and noise alone does not make the loop oscillate between two layouts.
  static constexpr double kRetryMargins = 4.0;
  void check_measured(const RepartitionInput& in, const Partition& current, RepartitionRecord* r);
  // With a memory planner: a decision to move to a partition no plan fits is not applied; an
  // applied one carries its stages' plans.
  void check_memory(RepartitionDecision* d) const;
  struct Move {
    Partition from;
    std::string to;
    double measured = 0.0;  // the slowest stage's busy seconds per step before the move
  };
  // A move that measured slower: from `from` (measuring `measured` then) to the rejected
  // partition (the key of rejected_).
  struct Rejection {
    std::string from;
    double measured = 0.0;
  };
  std::optional<Move> last_move_;              // rank 0
  std::map<std::string, Rejection> rejected_;  // rank 0: partitions that measured slower

  RepartitionConfig config_;
  std::unique_ptr<RepartitionPolicy> policy_;
  std::vector<std::string> names_;
  int rank_, stage_, stages_, groups_;
  int64_t total_;
  // The window: steps, this rank's busy seconds, and the per-layer times at its start.
  bool seen_first_ = false;  // the first step this loop sees is left out of the window
  int64_t window_steps_ = 0;
  double window_busy_ = 0.0;
  std::vector<double> layer_start_;  // per model layer (this stage's layers), seconds
  std::unique_ptr<dynpipe::StageMonitor> monitor_;
  std::vector<dynpipe::MonitorSample> fresh_;
  std::vector<double> layer_params_;  // bytes, per model layer
  double samples_per_step_ = 1.0;
  MemoryPlanner memory_;                        // rank 0: --memory-policy auto's planner
  std::optional<RepartitionDecision> pending_;  // rank 0: decided, not yet told to the others
  int64_t pending_apply_ = -1;                  // rank 0: the step it goes before
  std::optional<Ranges> due_partition_;
  int64_t due_step_ = -1;
  int64_t learned_at_ = -1;  // the step whose exchange told the due move
  ApplyStep apply_step_;
};

}  // namespace strata::parallel
