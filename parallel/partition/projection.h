// GroPipe's performance projection and its partitioner AMPA (papers/gropipe.md Secs. 2.2, 2.3),
// beside the dynamic-programming partitioner of partition.h (`--partitioner dp`, the default).
//
// Projection (GroPipe Eqs. 1-7). t[i][j] = time of micro-batch i on partition j (i < m, j < k).
// A task starts when the same micro-batch has left the previous partition and the previous
// micro-batch has left this one (GroPipe Eq. 2):
//   T_{i,j} = t_{i,j} + max(T_{i,j-1}, T_{i-1,j}),  T_{0,j} = T_{i,0} = 0 (1-based),
// and T_{m,k} is the time of the forward pass. With every micro-batch taking the same time on a
// partition (t_{i,j} = t_j, the paper's homogeneous assumption) the longest path through the
// m x k grid is Eqs. 3-6 (n = the bottleneck partition, Eq. 4):
//   T_F = sum_i t_n + sum_{p > n} t_p + sum_{q < n} t_q = (m - 1) max_j t_j + sum_j t_j,
// and Eq. 1's step time is T_F + T_B with T_B from the backward times (Eq. 7 sets T_B = T_F; we
// keep the measured backward times instead). Communication is not modelled (nor by the paper).
//
// Balance (GroPipe Eq. 8): PD = sum_i (T_i - mu)^e / (k mu), T_i = partition i's time, mu their
// mean. The paper prints the exponent as k; with odd k the signed terms cancel (T = (0, 3, 3)
// gives PD < 0 and passes any threshold), so the exponent is a parameter, 2 by default, which
// makes PD the variance-to-mean ratio. The stopping criterion, whose threshold the paper never
// gives, is PD / mu <= threshold (scale-free: with e = 2 it is the squared coefficient of
// variation of the partition times), 0.01 by default (a spread of about 10%).
//
// AMPA (GroPipe Algorithm 1), faithful to the box: per-layer times t_l = forward + backward,
// min-max normalized (Eq. 9; all-equal times become all 1, so that balancing them balances layer
// counts), an even split by layer count (the first L mod k partitions one layer longer), then:
// take the partition with the largest sum (index max); repeatedly take the one with the smallest
// (index min), stop if the criterion holds, else move the boundary layer from min's neighbour on
// max's side into min (h = min - 1 and its last layer when max <= min, h = min + 1 and its first
// layer otherwise), and start over with a new max once h == max. Ties go to the lowest index.
// What the box leaves open, decided here: a move that would empty p_h ends the search, and so
// does max == min (all sums equal); the search also ends after `max_moves`; whenever it ends
// without meeting the criterion the best partition seen (smallest largest sum, then smallest PD)
// is returned, so the result is never worse than the even split in the balanced quantity. Strata
// never splits a layer, so the paper's "no partition on the fully connected layer" holds by
// construction.
//
// The guard (not in the paper). Balancing normalized times is not balancing real ones: Eq. 9
// shifts every layer by min(T), which favours partitions of many cheap layers, and a move cycle
// may end at a partition that only looks better. Times [10, 11, 12, 10, 10, 10] ms in two
// partitions normalize to [0, .5, 1, 0, 0, 0]; AMPA moves to (2, 4), 21|42 ms, against the even
// split's 33|30. projection_partition therefore evaluates AMPA's partition in raw time (the stage
// model of partition.h: compute + send, per micro-batch) and returns the even split instead
// when that one's slowest stage is faster (--ampa-guard even, the default), or the fastest of
// AMPA's, the even split and the exact min-max partition of `--partitioner dp` (--ampa-guard dp);
// --ampa-guard off returns AMPA's partition as the paper does. Ties keep AMPA's; a candidate over
// the memory limit loses to one within it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/partition/partition.h"

namespace strata::parallel {

// Eq. 2 by dynamic programming: t[i][j] for micro-batch i and partition j; returns T_{m,k}.
// Throws strata::Error for an empty or ragged table or a negative time.
double projection_recurrence(const std::vector<std::vector<double>>& t);
// Eq. 4: the bottleneck partition (first index of the largest time).
size_t projection_bottleneck(const std::vector<double>& stage_times);
// Eqs. 3-6 for t_{i,j} = stage_times[j] and m micro-batches: T_stable + T_rising.
double projection_closed_form(const std::vector<double>& stage_times, int64_t micro_batches);
// Eq. 1 with T_F and T_B from the closed form (per micro-batch forward and backward times).
double projected_step_time(const std::vector<double>& forward_times,
                           const std::vector<double>& backward_times, int64_t micro_batches);

// Eq. 9: (t - min) / (max - min); all-equal input gives all 1.
std::vector<double> min_max_normalize(const std::vector<double>& times);
// Eq. 8 with the given exponent (0 when the mean is 0).
double performance_dispersion(const std::vector<double>& partition_times, int exponent = 2);

// What projection_partition may return instead of AMPA's partition (see the file comment).
enum class AmpaGuard { kOff, kEven, kDp };
// off|even|dp; throws strata::Error naming --ampa-guard otherwise.
AmpaGuard parse_ampa_guard(const std::string& name);
const char* ampa_guard_name(AmpaGuard guard);

struct ProjectionOptions {
  int exponent = 2;         // of Eq. 8 (the paper prints k)
  double threshold = 0.01;  // stop when PD / mu <= threshold (--ampa-threshold)
  bool normalize = true;    // balance Eq. 9's normalized times (false: raw; --ampa-normalize)
  int64_t max_moves = 0;    // 0: 4 L^2 k
  AmpaGuard guard = AmpaGuard::kEven;  // projection_partition only (--ampa-guard)
};
// Throws strata::Error naming the flag for an exponent < 1 or a negative or non-finite threshold.
void check_projection_options(const ProjectionOptions& options);

struct AmpaResult {
  std::vector<size_t> sizes;  // layers per partition, in order
  bool criterion_met = false;
  int64_t moves = 0;
  double dispersion = 0.0;  // PD / mu of the result, in the balanced quantity
  // Set by projection_partition: the partition it returned ("ampa", "even" or "dp") and the raw
  // slowest stage, ms per micro-batch, of each candidate it evaluated (< 0: not evaluated).
  std::string chosen = "ampa";
  Partition ampa_partition;
  double ampa_slowest_ms = -1.0;
  double even_slowest_ms = -1.0;
  double dp_slowest_ms = -1.0;
};
// One line for a configuration or a plan: "AMPA, criterion met after 2 moves" or "the even split
// (AMPA's partition: slowest stage 42.000 ms; even split 33.000 ms)".
std::string describe_ampa(const AmpaResult& result);

// Algorithm 1 on per-layer times (any unit). Throws for k < 1, k > L or a negative time.
AmpaResult ampa(const std::vector<double>& layer_times, int partitions,
                const ProjectionOptions& options = {});

// AMPA on profiled costs (t_l = forward + backward ms per sample), with the estimates of
// partition.h (send time, memory) for the result, then the guard of projection.guard. The memory
// limit is not part of Algorithm 1: plan.memory_error says when a stage of the result exceeds it.
PartitionPlan projection_partition(const std::vector<LayerCost>& costs, int stages,
                                   const PartitionOptions& options,
                                   const ProjectionOptions& projection = {},
                                   AmpaResult* result = nullptr);

}  // namespace strata::parallel
