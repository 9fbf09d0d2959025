// vPIPE's layer repartitioner (Algorithm 3, ../shared/papers/vpipe.md §2.5): one-step coarsening
// of the operator graph, recursive Kernighan-Lin bisection of the coarse graph, projection back
// onto the operators, and KL refinement of every boundary on the original graph.
//
// The graph: operators in their execution order (the invoke timestamps T of the profile; a
// Strata model's layers run in their list order), each with an execution time t, and edges
// carrying bytes between them. Stages are contiguous ranges of that order (a pipeline stage
// must be), so a partition is a list of cut points.
//
// Readings of the note's §6.6, pinned by tests:
//  - Coarsening (H1, H2): consecutive operators joined by an edge are the backbone; any other
//    edge is *sparse* when its endpoints' invoke times are more than mean = sum(t) / p apart, else
//    a *subgraph* edge. A subgraph edge from a to b contracts the operators a..b (in order) into
//    one coarse vertex, so no cut falls inside a densely connected block; coarse vertices are the
//    maximal runs so joined. Sparse edges cost the same under every contiguous partition of the
//    blocks they span and are left to the cost below. A chain (backbone only) coarsens to itself.
//  - Cost of a stage: its operators' time plus the bytes of the edges it cuts (its incoming and
//    outgoing crossing edges) over `bandwidth`. Objective (Eq. 3): the slowest stage.
//  - Bisection of a range into p stages (p not a power of two: floor(p/2) and ceil(p/2)): the
//    coarse cut that minimizes max(left cost / left stages, right cost / right stages), then the
//    KL pass: the cut moves one vertex at a time while that lowers the pair's max.
//  - Refinement on the original operators: every boundary moves one operator at a time while it
//    lowers the slowest of its two stages (never creating an empty stage), until no move helps.
#pragma once

#include <cstddef>
#include <vector>

#include "parallel/partition/partition.h"

namespace strata::parallel {

struct OpGraph {
  std::vector<double> time;    // t per operator, in execution order
  std::vector<double> invoke;  // T per operator (nondecreasing); empty: the running sum of t
  struct Edge {
    size_t from = 0, to = 0;  // from < to in execution order
    double bytes = 0.0;
  };
  std::vector<Edge> edges;

  // A chain of `layers` with consecutive edges of `bytes[i]` (i -> i + 1), as a Strata model is.
  static OpGraph chain(const std::vector<double>& time, const std::vector<double>& bytes);
};

struct KlPartition {
  Partition partition;             // over the operators
  std::vector<double> stage_cost;  // per stage: time + cut bytes / bandwidth
  double max_stage_cost = 0.0;
  double edge_cut_bytes = 0.0;  // bytes of every edge between different stages
  size_t coarse_vertices = 0;   // after coarsening (the operators without it)
  int refinement_moves = 0;
};

// The coarse vertices of `g` for `stages` stages: [begin, end) runs of operators.
std::vector<LayerRange> coarsen(const OpGraph& g, int stages);

// Algorithm 3 (coarsen = true) or plain recursive KL on the operators (coarsen = false, the
// Table 4 baseline). Throws for stages < 1 or more stages than operators.
KlPartition kl_partition(const OpGraph& g, int stages, double bandwidth, bool coarsen = true);

// Cost of a given partition under the same model.
KlPartition evaluate_kl_partition(const OpGraph& g, const Partition& partition, double bandwidth);

}  // namespace strata::parallel
