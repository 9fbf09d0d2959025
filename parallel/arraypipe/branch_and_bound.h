// Exact Branch and Bound for JAPSP (papers/arraypipe.md §2.5, Algorithm 1 with real
// backtracking). The paper's Algorithm 1 as printed is a single greedy dive; this is the full
// depth-first search it abbreviates: Giffler-Thompson branching on active schedules (the
// operation o* that can finish its device occupancy first fixes the device; every unscheduled
// operation on that device that could start before o* ends is a branch), children explored in
// order of their lower bound, pruned when the bound reaches the best schedule found. The bound is
// the largest of (a) every job's earliest start of its next operation plus the rest of its chain
// and (b) per device, the preemptive 1|r_j,pmtn|Lmax relaxation (Jackson's rule) over its
// unscheduled operations with heads from the job chains and tails to Eq. 3's end. The first leaf
// is the greedy dive; without a node or time limit the search proves optimality.
#pragma once

#include <vector>

#include "parallel/arraypipe/instance.h"

namespace strata::parallel::arraypipe {

struct BnbOptions {
  int max_jobs = 30;        // refuse larger arrays (the search is exponential): use the GA
  double time_limit_s = 0;  // stop after this long with the best schedule found; 0: no limit
  long max_nodes = 0;       // stop after this many search nodes; 0: no limit
};

struct BnbResult {
  std::vector<int> sequence;    // the best schedule, as an operation sequence (decode() it)
  TimedSchedule schedule;       // decode(instance, sequence)
  double makespan = 0;          // Eq. 3
  double dive_makespan = 0;     // the first leaf: the greedy dive of Algorithm 1
  double root_lower_bound = 0;  // the bound before any decision
  bool proven_optimal = false;  // false when the time or node limit cut the search
  long nodes = 0;               // search nodes (partial schedules) expanded
  double seconds = 0;
};

// Throws strata::Error when the array has more than options.max_jobs jobs. An initial sequence
// (say a baseline's) seeds the incumbent; the search then looks only for better schedules.
BnbResult branch_and_bound(const Instance& instance, const BnbOptions& options = {},
                           const std::vector<int>& initial_sequence = {});

// The lower bound of the root node (no operation scheduled), as the search computes it.
double root_lower_bound(const Instance& instance);

}  // namespace strata::parallel::arraypipe
