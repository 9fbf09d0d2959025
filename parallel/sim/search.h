// Layout search: every (G, S, M, schedule, memory policy, partitioner) that uses a cluster's GPUs
// for a global batch, simulated, ranked by throughput, each loser with the reason it loses.
//
// Candidates: S divides the GPU count and is at most the number of layers, G = GPUs / S;
// M divides the batch per group (B / G) into micro-batches of at least one sample (powers of two
// by default); the schedules, policies and partitioners asked for. A candidate whose whole-run
// memory (parameters, gradients, optimizer state) already exceeds the device on some stage is
// out of memory without simulating; otherwise it is simulated and out of memory when its peak
// is. Reasons, against the best candidate, per sample of the batch (a step's time split three
// ways on the slowest stage: compute (its forwards, backwards, recomputes and updates), exposed
// communication (waits for messages in transit, all-reduces, swaps) and bubble (the rest of the
// step: waiting for other stages)):
//   out of memory   the numbers: which stage needs how much against the capacity;
//   bubble / communication / compute   the part that grew most against the best.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/sim/simulator.h"

namespace strata::parallel::sim {

// "dp" (the balanced min-max partition of parallel/partition), "projection" (GroPipe's AMPA) or
// "uniform" (by layer count): the stages' layers for micro-batches of `rows`.
Partition choose_partition(const CostModel& costs, int stages, double rows,
                           const std::string& partitioner, ScheduleKind schedule,
                           int64_t micro_batches, double link_bandwidth);

struct Candidate {
  int groups = 1, stages = 1;
  int64_t micro_batches = 1;
  double rows = 1;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  MemoryPolicy policy = MemoryPolicy::kKeep;
  std::string partitioner = "dp";
  Partition partition;
  bool simulated = false;
  bool fits = false;
  std::string out_of_memory;  // empty when it fits
  SimResult result;
  double samples_per_s = 0.0;
  // Per step, on the slowest stage (see the file comment).
  double compute_s = 0.0, comm_s = 0.0, bubble_s = 0.0;
  std::string reason;  // why it loses to the best ("" for the best)
};

struct SearchSpace {
  int64_t batch_size = 1;              // global batch B
  std::vector<int64_t> micro_batches;  // empty: 1, 2, 4, ... up to B / G
  std::vector<ScheduleKind> schedules{ScheduleKind::kGPipe, ScheduleKind::k1F1B};
  std::vector<MemoryPolicy> policies{MemoryPolicy::kKeep, MemoryPolicy::kRecompute,
                                     MemoryPolicy::kSwap};
  std::vector<std::string> partitioners{"dp", "uniform"};
  std::vector<int> stages;  // empty: every divisor of the GPU count up to the layer count
  double memory_bytes = 0;  // capacity per GPU; 0: the cluster's device
};

// `base` gives what the search does not vary (gradient sync, all-reduce algorithm, optimizer
// slots, precision). Returns every candidate, best first (those that fit by throughput, then the
// ones out of memory), with reasons filled in.
std::vector<Candidate> search_layouts(const CostModel& costs, const Cluster& cluster,
                                      const SearchSpace& space, const SimConfig& base);

// Simulates one candidate (fills result, fits, samples_per_s and the split of its step).
void evaluate_candidate(const CostModel& costs, const Cluster& cluster, const SimConfig& base,
                        double capacity, int64_t batch_size, Candidate* candidate);

// "G=8 x S=4, M=16, 1f1b, keep, dp"
std::string describe(const Candidate& candidate);

}  // namespace strata::parallel::sim
