// Pipeline partitions: which contiguous range of the model's layers each stage runs.
//
// Three ways to get one: a manual `--partition` text, the uniform split by layer count, and the
// balanced split that minimizes the slowest stage's time under a per-stage memory limit. The cost
// of a stage comes from a per-layer profile (graph::LayerProfiler, live or from the JSON that
// `strata profile --output` writes):
//
//   time(stage)   = micro-batch size x sum of its layers' (forward + backward) ms per sample
//                   + micro-batch size x output bytes per sample of its last layer / bandwidth
//                   (the activations sent to the next stage; the last stage sends none)
//   memory(stage) = param bytes x (1 + 1 gradient + optimizer slots)
//                   + param bytes x (in flight - 1)  [async-1f1b only: stashed weight versions]
//                   + micro-batch size x activation bytes per sample x in flight
//
// where `in flight` is the number of micro-batches stage s holds at once under the schedule:
// M for gpipe, min(S - s, M) for 1f1b and async-1f1b (parallel/schedule/schedule.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/schedule/schedule.h"

namespace strata::graph {
class Model;
struct LayerProfile;
}  // namespace strata::graph

namespace strata::parallel {

// One layer's measured cost, per sample.
struct LayerCost {
  std::string name;
  double forward_ms = 0.0;        // forward time per sample
  double backward_ms = 0.0;       // backward time per sample
  double output_bytes = 0.0;      // outputs per sample: what a stage ending here sends on
  double activation_bytes = 0.0;  // outputs + tensors saved for backward, per sample
  double param_bytes = 0.0;       // the layer's parameters (f32)
  // For memory planning (parallel/vpipe/memory_model.h), per sample; zero in profiles written
  // before they were measured: the storages the tape keeps (each once), those of them the
  // previous layer's tape also keeps, the inputs, and the most bytes the forward and the
  // backward allocate above the level they start at.
  double saved_bytes = 0.0;
  double shared_bytes = 0.0;
  double input_bytes = 0.0;
  double forward_peak_bytes = 0.0;
  double backward_peak_bytes = 0.0;
};

// From a live profile.
std::vector<LayerCost> layer_costs(const std::vector<graph::LayerProfile>& profile);
// From the JSON of graph::LayerProfiler::to_json: {"layers": [{"name", "forward_ms_per_sample",
// "backward_ms_per_sample", "output_bytes_per_sample", "activation_bytes_per_sample",
// "param_bytes"}, ...]}. `source` names the text in errors (the file name).
std::vector<LayerCost> parse_profile_json(const std::string& json_text, const std::string& source);
std::vector<LayerCost> read_profile_file(const std::string& path);
// Throws strata::Error unless `costs` names the model's layers in order (count and names),
// naming the first mismatch and `source`.
void check_profile_matches(const std::vector<LayerCost>& costs, const graph::Model& model,
                           const std::string& source);

// Stage s runs layers [begin, end).
struct LayerRange {
  size_t begin = 0;
  size_t end = 0;
  bool operator==(const LayerRange& o) const { return begin == o.begin && end == o.end; }
};
using Partition = std::vector<LayerRange>;

// A range of layers "FIRST-LAST" or one layer, by index or name (names may hold dashes), as
// [first, last] (inclusive). Errors name `flag` and, for an unknown name, list the layers.
std::pair<size_t, size_t> parse_layer_range(const std::string& range,
                                            const std::vector<std::string>& names,
                                            const std::string& flag);

// Parses "0-3,4-11,12-15" (layer indices, inclusive) or "conv1-pool2,fc1-fc2" (layer names),
// or a mix; a range of one layer may be written "5" or "fc2". The ranges must cover all layers
// in order with no gap, no overlap and no empty range, one per stage; errors name the offending
// range.
Partition parse_partition(const std::string& text, const std::vector<std::string>& layer_names,
                          int stages);
// Stage s gets L / S layers, the first L % S stages one more. Throws for S < 1 or S > L.
Partition uniform_partition(size_t layers, int stages);
// "conv1-pool1,bn2-fc2": the text parse_partition reads back.
std::string partition_string(const Partition& partition,
                             const std::vector<std::string>& layer_names);
// Micro-batches stage s holds at once under `kind` (see the file comment).
int64_t stage_in_flight(ScheduleKind kind, int stages, int stage, int64_t micro_batches);

struct PartitionOptions {
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int64_t micro_batches = 1;
  int64_t micro_batch_size = 1;  // samples per micro-batch
  double bandwidth_bytes_per_second = 10e9;
  double mem_limit_bytes = 0.0;  // per stage; 0 = no limit
  int optimizer_slots = 2;       // optimizer state tensors per parameter (AdamW: 2)
};

struct StageEstimate {
  LayerRange layers;
  double forward_ms = 0.0;   // per micro-batch
  double backward_ms = 0.0;  // per micro-batch
  double send_ms = 0.0;      // sending the micro-batch's output activations on
  double time_ms = 0.0;      // forward + backward + send: the balanced quantity
  int64_t in_flight = 0;
  double param_memory_bytes = 0.0;       // parameters, gradients, optimizer state, stashes
  double activation_memory_bytes = 0.0;  // activations of the micro-batches in flight
  double memory_bytes = 0.0;
};

struct PartitionPlan {
  Partition partition;
  std::vector<StageEstimate> stages;
  size_t slowest_stage = 0;
  double slowest_ms = 0.0;
  std::string memory_error;  // the first stage over the limit; empty when all fit
};

// The estimates of a given partition (checked to cover `costs`).
PartitionPlan evaluate_partition(const std::vector<LayerCost>& costs, const Partition& partition,
                                 const PartitionOptions& options);

// The partition minimizing the slowest stage's time among those whose every stage fits the
// memory limit, by dynamic programming in O(S L^2). Ties are broken exactly: among optimal
// partitions, the one whose last cut is earliest, then whose first S - 1 stages have the smallest
// slowest time, then whose cut before them is earliest, and so on (the lexicographic minimum of
// (T_S, b_{S-1}, T_{S-1}, b_{S-2}, ..., T_2, b_1), T_k = slowest of the first k stages, b_k = the
// first layer of stage k): layers move towards later stages, which hold fewer micro-batches in
// flight. Throws strata::Error for S < 1, S > L, or when no partition fits the limit (naming the
// stage and bytes that the least memory-hungry partition still exceeds).
PartitionPlan balanced_partition(const std::vector<LayerCost>& costs, int stages,
                                 const PartitionOptions& options);

}  // namespace strata::parallel
