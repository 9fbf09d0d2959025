// vPIPE Algorithm 3 (see the header for the readings chosen). On a chain of coarse vertices the
// Kernighan-Lin bisection of a range is a choice of one cut point, so every cut point is tried
// (the optimum of the pass KL's single moves converge to); refinement then moves each boundary
// one operator at a time, as KL does, on the original operators.
#include "parallel/vpipe/kl_partitioner.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "engine/check.h"

namespace strata::parallel {
namespace {

struct Costs {
  const OpGraph& g;
  double bandwidth;
  std::vector<double> prefix;  // prefix[i]: sum of t over operators [0, i)

  Costs(const OpGraph& graph, double bw) : g(graph), bandwidth(bw) {
    prefix.assign(g.time.size() + 1, 0.0);
    for (size_t i = 0; i < g.time.size(); ++i) prefix[i + 1] = prefix[i] + g.time[i];
  }
  double time(size_t a, size_t b) const { return prefix[b] - prefix[a]; }
  // Bytes of the edges with exactly one end in [a, b).
  double cut(size_t a, size_t b) const {
    double bytes = 0.0;
    for (const OpGraph::Edge& e : g.edges) {
      const bool in_from = e.from >= a && e.from < b, in_to = e.to >= a && e.to < b;
      if (in_from != in_to) bytes += e.bytes;
    }
    return bytes;
  }
  double stage(size_t a, size_t b) const { return time(a, b) + cut(a, b) / bandwidth; }
  // Bytes of the edges crossing a cut before operator c.
  double crossing(size_t c) const {
    double bytes = 0.0;
    for (const OpGraph::Edge& e : g.edges) {
      if (e.from < c && e.to >= c) bytes += e.bytes;
    }
    return bytes;
  }
};

// Recursive bisection of operators [begin, end) into `stages`, cutting only at `points` (sorted
// operator indices where a cut may fall); appends the cuts.
void bisect(const Costs& c, size_t begin, size_t end, int stages, const std::vector<size_t>& points,
            std::vector<size_t>* cuts) {
  if (stages <= 1) return;
  const int left_stages = stages / 2, right_stages = stages - left_stages;
  // Allowed cuts inside the range that leave each side enough operators.
  std::vector<size_t> candidates;
  for (size_t p : points) {
    if (p > begin + static_cast<size_t>(left_stages) - 1 &&
        p + static_cast<size_t>(right_stages) <= end && p > begin && p < end) {
      candidates.push_back(p);
    }
  }
  if (candidates.empty()) {  // too few coarse vertices here: any operator boundary
    for (size_t p = begin + static_cast<size_t>(left_stages);
         p + static_cast<size_t>(right_stages) <= end; ++p) {
      candidates.push_back(p);
    }
  }
  STRATA_CHECK(!candidates.empty()) << "kl_partition: cannot cut operators [" << begin << ", "
                                    << end << ") into " << stages << " stages";
  size_t best = candidates.front();
  double best_cost = std::numeric_limits<double>::infinity();
  for (size_t p : candidates) {
    const double traffic = c.crossing(p) / c.bandwidth;
    const double cost =
        std::max(c.time(begin, p) / left_stages, c.time(p, end) / right_stages) + traffic;
    if (cost < best_cost) {
      best_cost = cost;
      best = p;
    }
  }
  cuts->push_back(best);
  bisect(c, begin, best, left_stages, points, cuts);
  bisect(c, best, end, right_stages, points, cuts);
}

Partition from_cuts(std::vector<size_t> cuts, size_t n) {
  std::sort(cuts.begin(), cuts.end());
  Partition p;
  size_t begin = 0;
  for (size_t cut : cuts) {
    p.push_back({begin, cut});
    begin = cut;
  }
  p.push_back({begin, n});
  return p;
}

// KL refinement of every boundary on the operators; returns the moves made.
int refine(const Costs& c, Partition* p) {
  int moves = 0;
  for (bool improved = true; improved && moves < 100000;) {
    improved = false;
    for (size_t s = 0; s + 1 < p->size(); ++s) {
      LayerRange& a = (*p)[s];
      LayerRange& b = (*p)[s + 1];
      const double now = std::max(c.stage(a.begin, a.end), c.stage(b.begin, b.end));
      // One operator from a to b, or from b to a, whichever lowers the pair's slowest stage more.
      double best = now;
      int direction = 0;
      if (a.end - a.begin > 1) {
        const double left = std::max(c.stage(a.begin, a.end - 1), c.stage(b.begin - 1, b.end));
        if (left < best) best = left, direction = -1;
      }
      if (b.end - b.begin > 1) {
        const double right = std::max(c.stage(a.begin, a.end + 1), c.stage(b.begin + 1, b.end));
        if (right < best) best = right, direction = 1;
      }
      if (direction != 0) {
        a.end += static_cast<size_t>(static_cast<long>(direction));
        b.begin = a.end;
        ++moves;
        improved = true;
      }
    }
  }
  return moves;
}

}  // namespace

OpGraph OpGraph::chain(const std::vector<double>& time, const std::vector<double>& bytes) {
  OpGraph g;
  g.time = time;
  for (size_t i = 0; i + 1 < time.size(); ++i) {
    g.edges.push_back({i, i + 1, i < bytes.size() ? bytes[i] : 0.0});
  }
  return g;
}

std::vector<LayerRange> coarsen(const OpGraph& g, int stages) {
  const size_t n = g.time.size();
  STRATA_CHECK(stages >= 1) << "coarsen: stages " << stages;
  std::vector<double> T = g.invoke;
  if (T.empty()) {
    T.assign(n, 0.0);
    for (size_t i = 1; i < n; ++i) T[i] = T[i - 1] + g.time[i - 1];
  }
  STRATA_CHECK_EQ(T.size(), n) << "coarsen: invoke times per operator";
  const double mean = std::accumulate(g.time.begin(), g.time.end(), 0.0) / stages;
  // far[i]: the last operator that a subgraph edge from i reaches.
  std::vector<size_t> far(n);
  std::iota(far.begin(), far.end(), size_t{0});
  for (const OpGraph::Edge& e : g.edges) {
    STRATA_CHECK(e.from < e.to && e.to < n)
        << "coarsen: edge " << e.from << " -> " << e.to << " is not forward in the order";
    if (e.to == e.from + 1) continue;           // the backbone (critical edge)
    if (T[e.to] - T[e.from] > mean) continue;   // sparse: costs the same for every cut
    far[e.from] = std::max(far[e.from], e.to);  // subgraph: contracted
  }
  std::vector<LayerRange> vertices;
  for (size_t i = 0; i < n;) {
    size_t end = far[i];
    for (size_t j = i; j <= end && j < n; ++j) end = std::max(end, far[j]);
    vertices.push_back({i, end + 1});
    i = end + 1;
  }
  return vertices;
}

KlPartition evaluate_kl_partition(const OpGraph& g, const Partition& partition, double bandwidth) {
  STRATA_CHECK_GT(bandwidth, 0.0) << "kl partition: bandwidth";
  const Costs c(g, bandwidth);
  KlPartition out;
  out.partition = partition;
  for (const LayerRange& r : partition) {
    out.stage_cost.push_back(c.stage(r.begin, r.end));
    out.max_stage_cost = std::max(out.max_stage_cost, out.stage_cost.back());
  }
  for (const OpGraph::Edge& e : g.edges) {
    size_t sf = 0, st = 0;
    for (size_t s = 0; s < partition.size(); ++s) {
      if (e.from >= partition[s].begin && e.from < partition[s].end) sf = s;
      if (e.to >= partition[s].begin && e.to < partition[s].end) st = s;
    }
    if (sf != st) out.edge_cut_bytes += e.bytes;
  }
  return out;
}

KlPartition kl_partition(const OpGraph& g, int stages, double bandwidth, bool use_coarsening) {
  const size_t n = g.time.size();
  STRATA_CHECK(stages >= 1 && static_cast<size_t>(stages) <= n)
      << "kl_partition: cannot cut " << n << " operators into " << stages << " stages";
  STRATA_CHECK_GT(bandwidth, 0.0) << "kl_partition: bandwidth";
  const Costs c(g, bandwidth);
  std::vector<LayerRange> vertices;
  if (use_coarsening) {
    vertices = coarsen(g, stages);
  } else {
    for (size_t i = 0; i < n; ++i) vertices.push_back({i, i + 1});
  }
  std::vector<size_t> points;  // boundaries between coarse vertices
  for (size_t v = 1; v < vertices.size(); ++v) points.push_back(vertices[v].begin);
  std::vector<size_t> cuts;
  bisect(c, 0, n, stages, points, &cuts);
  Partition p = from_cuts(cuts, n);
  const int moves = refine(c, &p);
  KlPartition out = evaluate_kl_partition(g, p, bandwidth);
  out.coarse_vertices = vertices.size();
  out.refinement_moves = moves;
  return out;
}

}  // namespace strata::parallel
