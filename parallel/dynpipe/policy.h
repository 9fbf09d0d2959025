// DynPipe's re-partition policies for the trainer's loop (parallel/repartition_loop.h): Algorithm 2
// (parallel/dynpipe/repartition.h) fed with what the loop measured, and the paper's baselines
// (papers/dynpipe.md Sec. 4: DynPipe-w/o RF, PipeDream-Re).
//
//  - Layer costs p^f + p^b (solo). The loop measures each layer's forward + backward seconds per
//    step where it ran, slowdown included. A layer's solo cost is the least per-step time it was
//    measured at over the windows so far (a layer that ran on an unslowed rank, or before the
//    interference began, keeps that time); ms per sample = seconds per step / samples per step.
//    So a run slowed from its first step sees the slowed times as solo until a layer runs
//    elsewhere: the planner then treats those layers as heavy, as vpipe does.
//  - dynpipe-no-rf: each rank's slowdown is its stage's last measured time (the sum of its
//    layers' measured seconds over the window) over the same layers' solo time
//    (measured_slowdowns), the same for whatever layers a candidate puts there.
//  - dynpipe: the slowdown model (--slowdown-model FILE, fitted by strata fit-slowdown) predicts
//    each layer's slowdown on each rank from the layer's features (solo ms per sample, parameter,
//    output and activation bytes) and the rank's CPU counters, the monitor's latest sample
//    (parallel/dynpipe/monitor.h; a stage's counters are the mean over its groups). Ranks that
//    share a process and a machine (local ranks) read the same counters: the model then tells the
//    ranks apart only by the layers they run. A sleep (--inject kind=slow) is not visible in the
//    counters at all (the rank's threads are idle, not competing); the model sees co-located work.
//    So the measurement bounds the prediction from below: where a rank's current stage measured
//    slower (the dynpipe-no-rf slowdown) than the model predicts for it, the rank's predictions
//    for every candidate are raised by that ratio (the model keeps how the slowdown varies with
//    the layers placed there, the measurement sets its least level). Where the model predicts
//    more than was measured, the prediction stands: fresh counters show a load the window's
//    times do not yet (a load that began late in the window), which is where the model is ahead
//    of dynpipe-no-rf, and each candidate's prediction is the forest's on its own layers. The
//    paper's forest takes the per-stage times among its runtime inputs; without this, a slowdown
//    that leaves no trace in the counters left dynpipe behind dynpipe-no-rf
//    (tools/bench/dynpipe_recovery.py).
//  - pipedream-re: PipeDream's partitioner re-run on the per-layer costs measured as they ran
//    (slowdown included, no slowdown model), at the loop's decisions; with --repartition-every
//    set to the epoch's steps (the trainer's default for it) that is PipeDream restarted at epoch
//    boundaries; the move drains the pipeline (a restart: async-1f1b needs --migration restart).
//  All of them score candidates with the cycle-time simulator and apply a plan only when it beats
//  the current one by more than --repartition-threshold (a relative gain of the cycle time).
#pragma once

#include <memory>
#include <string>

#include "parallel/vpipe/repartition.h"

namespace strata::parallel::dynpipe {

struct PolicyOptions {
  std::string name;         // vpipe | dynpipe | dynpipe-no-rf | pipedream-re
  double threshold = 0.05;  // least relative gain applied
  std::string model_path;   // dynpipe: --slowdown-model
  std::string fallback;     // dynpipe: "" (a bad model stops the run) or "no-rf"
  size_t top_k = 0;         // condensation anchors (0: every layer is a block)
  bool log = true;          // print the fallback (rank 0)
};

// Throws strata::Error for an unknown name, a threshold outside [0, 1), dynpipe without a model
// file, or (without fallback "no-rf") a model file that is missing, truncated or of another
// feature set than kDynpipeFeatures, naming the file and what differs.
std::unique_ptr<RepartitionPolicy> make_policy(const PolicyOptions& options);

// The features the trainer provides to the slowdown model: feature set kFeatureSet
// (slowdown_features.h), the columns strata profile --colocation writes.
std::vector<std::string> dynpipe_features();

}  // namespace strata::parallel::dynpipe
