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
// is returned, so the result is never worse than the even split. Strata never splits a layer, so
// the paper's "no partition on the fully connected layer" holds by construction.
#pragma once

#include <cstdint>
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

struct ProjectionOptions {
  int exponent = 2;         // of Eq. 8 (the paper prints k)
  double threshold = 0.01;  // stop when PD / mu <= threshold
  bool normalize = true;    // balance Eq. 9's normalized times (false: raw times)
  int64_t max_moves = 0;    // 0: 4 L^2 k
};

struct AmpaResult {
  std::vector<size_t> sizes;  // layers per partition, in order
  bool criterion_met = false;
  int64_t moves = 0;
  double dispersion = 0.0;  // PD / mu of the result, in the balanced quantity
};

// Algorithm 1 on per-layer times (any unit). Throws for k < 1, k > L or a negative time.
AmpaResult ampa(const std::vector<double>& layer_times, int partitions,
                const ProjectionOptions& options = {});

// AMPA on profiled costs (t_l = forward + backward ms per sample), with the estimates of
// partition.h (send time, memory) for the result. The memory limit is not part of Algorithm 1:
// plan.memory_error says when a stage exceeds it.
PartitionPlan projection_partition(const std::vector<LayerCost>& costs, int stages,
                                   const PartitionOptions& options,
                                   const ProjectionOptions& projection = {},
                                   AmpaResult* result = nullptr);

}  // namespace strata::parallel
