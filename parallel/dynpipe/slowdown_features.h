// The slowdown model's feature set, defined once: `strata profile --colocation` writes its rows
// with slowdown_feature_row and the trainer's dynpipe policy predicts from rows built by the same
// function (make_forest_slowdown), so that a profile row and a monitor row of the same situation
// are the same numbers. A model file records the set's name and columns (slowdown_model.h); a
// file of another set is refused naming what differs.
//
// Set kFeatureSet ("strata-cpu-3"), in column order:
//   layer_solo_ms           the layer's forward + backward ms per sample alone (in training: the
//                           least it measured per step so far; under an emulated device, its
//                           emulated time)
//   layer_param_bytes, layer_output_bytes (per sample), layer_activation_bytes (per sample)
//   then one counter of colocation.h (feature_counter_names()): colocated_threads, the
//   co-located load's threads on the rank's device (on a CPU or waiting for one).
// "strata-cpu-2" had the machine's utilization and run queue per core and the process's run delay
// and preemptions per CPU second instead. In training they followed the pipeline itself, not the
// load: emulated-device ranks under mpirun showed a run queue of 4.2-4.9 per core and 340-7700
// preemptions per CPU second before any load (the ranks waiting for their messages), and 30-37 s
// of run delay per CPU second with one, against the profile's 2.2-6.3, 0-800 and 0.5-19, where a
// long run queue marked the loaded windows. The forest predicted 2-3 for unloaded stages from
// them (and in the first version of this set, which kept utilization and run queue beside
// colocated_threads, still 2-3 under a sleep that no counter shows). And every rank of a machine
// read the same machine-wide counters, so it could not tell the loaded rank from the others;
// colocated_threads does. The monitor still samples and records every counter
// (counter_names()).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "parallel/dynpipe/colocation.h"

namespace strata::parallel::dynpipe {

inline constexpr const char* kFeatureSet = "strata-cpu-3";

// What a layer contributes to its rows.
struct LayerFeatures {
  double solo_ms = 0.0;  // forward + backward, per sample
  double param_bytes = 0.0;
  double output_bytes = 0.0;      // per sample
  double activation_bytes = 0.0;  // per sample
};

// The monitor's counters that are features, in order.
std::vector<std::string> feature_counter_names();
// The set's column names, in order.
std::vector<std::string> slowdown_features();
// One row of the set: the layer's features, then the counters'.
std::vector<double> slowdown_feature_row(const LayerFeatures& layer, const CpuCounters& counters);
// Counters by name (a monitor sample's counter map, a stage's mean): every name of
// feature_counter_names() must be there (the others are 0 when absent); throws strata::Error
// naming a missing one and `whose`.
CpuCounters counters_from_map(const std::map<std::string, double>& counters,
                              const std::string& whose);

}  // namespace strata::parallel::dynpipe
