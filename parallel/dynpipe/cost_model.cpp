#include "parallel/dynpipe/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "engine/check.h"

namespace strata::parallel::dynpipe {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Bytes at `bps` bytes per second, in ms.
double transfer_ms(double bytes, double bps) { return bytes <= 0.0 ? 0.0 : 1e3 * bytes / bps; }

}  // namespace

Cluster Cluster::machines(int gpus, int gpus_per_node, double intra_bps, double inter_bps) {
  STRATA_CHECK(gpus >= 1) << "--gpus must be at least 1, got " << gpus;
  STRATA_CHECK(gpus_per_node >= 1) << "--gpus-per-node must be at least 1, got " << gpus_per_node;
  STRATA_CHECK(gpus % gpus_per_node == 0)
      << "--gpus " << gpus << " must be a multiple of --gpus-per-node " << gpus_per_node
      << " (whole machines)";
  STRATA_CHECK(std::isfinite(intra_bps) && intra_bps > 0)
      << "--node-bandwidth (links inside a machine) must be positive, got " << intra_bps / 1e9
      << " GB/s";
  STRATA_CHECK(std::isfinite(inter_bps) && inter_bps > 0)
      << "--bandwidth (links between machines) must be positive, got " << inter_bps / 1e9
      << " GB/s";
  Cluster c;
  c.gpus = gpus;
  c.gpus_per_node = gpus_per_node;
  c.bandwidth.assign(static_cast<size_t>(gpus), std::vector<double>(static_cast<size_t>(gpus)));
  for (int i = 0; i < gpus; ++i) {
    for (int j = 0; j < gpus; ++j) {
      c.bandwidth[i][j] = i / gpus_per_node == j / gpus_per_node ? intra_bps : inter_bps;
    }
  }
  return c;
}

void Cluster::check() const {
  STRATA_CHECK(gpus >= 1 && gpus_per_node >= 1)
      << "cluster: " << gpus << " GPUs, " << gpus_per_node << " per machine: both must be >= 1";
  STRATA_CHECK(bandwidth.size() == static_cast<size_t>(gpus))
      << "cluster: the bandwidth matrix has " << bandwidth.size() << " rows for " << gpus
      << " GPUs";
  for (int i = 0; i < gpus; ++i) {
    STRATA_CHECK(bandwidth[i].size() == static_cast<size_t>(gpus))
        << "cluster: row " << i << " of the bandwidth matrix has " << bandwidth[i].size()
        << " entries for " << gpus << " GPUs";
    for (int j = 0; j < gpus; ++j) {
      STRATA_CHECK(i == j || (std::isfinite(bandwidth[i][j]) && bandwidth[i][j] > 0))
          << "cluster: the bandwidth between GPUs " << i << " and " << j
          << " must be positive, got " << bandwidth[i][j];
    }
  }
}

Cluster Cluster::first(int count) const {
  STRATA_CHECK(count >= 1 && count <= gpus)
      << "cluster: the first " << count << " of " << gpus << " GPUs";
  Cluster c;
  c.gpus = count;
  c.gpus_per_node = gpus_per_node;
  for (int i = 0; i < count; ++i) {
    c.bandwidth.emplace_back(bandwidth[i].begin(), bandwidth[i].begin() + count);
  }
  return c;
}

double Cluster::mesh_bandwidth(int a, int width) const {
  double b = kInf;
  for (int i = a; i < a + width; ++i) {
    for (int j = a; j < a + width; ++j) {
      if (i != j) b = std::min(b, bandwidth[i][j]);
    }
  }
  return b;
}

double Cluster::link_bandwidth(int a, int m, int e) const {
  double b = kInf;
  for (int i = a; i < m; ++i) {
    for (int j = m; j < e; ++j) b = std::min({b, bandwidth[i][j], bandwidth[j][i]});
  }
  return b;
}

bool Cluster::mesh_fits(int a, int width) const {
  if (a / gpus_per_node == (a + width - 1) / gpus_per_node) return true;
  const int end = a + width;
  return a % gpus_per_node == 0 && (end % gpus_per_node == 0 || end == gpus);
}

std::vector<MeshShape> mesh_shapes(int gpus, int max_tensor) {
  std::vector<MeshShape> shapes;
  for (int t = 1; t <= gpus && t <= max_tensor; ++t) {
    if (gpus % t == 0) shapes.push_back({gpus / t, t});
  }
  return shapes;
}

int eq4_case(double prefix_ms, double last_ms, double comm_ms) {
  return last_ms < prefix_ms + comm_ms ? 1 : 2;
}

double two_stage_time(double prefix_ms, double last_ms, double comm_ms, TwoStageRule rule) {
  const double half = (comm_ms + prefix_ms + last_ms) / 2.0;
  if (rule == TwoStageRule::kPaper) {
    return eq4_case(prefix_ms, last_ms, comm_ms) == 1 ? half : last_ms;
  }
  return std::max({prefix_ms, last_ms, half});
}

TwoStageRule parse_two_stage_rule(const std::string& name) {
  if (name == "corrected") return TwoStageRule::kCorrected;
  if (name == "paper") return TwoStageRule::kPaper;
  STRATA_THROW() << "--dynpipe-rule must be corrected or paper, got '" << name << "'";
}

const char* two_stage_rule_name(TwoStageRule rule) {
  return rule == TwoStageRule::kPaper ? "paper" : "corrected";
}

Profile::Profile(const std::vector<LayerCost>& costs) {
  STRATA_CHECK(!costs.empty()) << "dynpipe: the profile has no layers";
  compute_.push_back(0.0);
  output_.push_back(0.0);
  params_.push_back(0.0);
  for (const LayerCost& c : costs) {
    for (double v : {c.forward_ms, c.backward_ms, c.output_bytes, c.param_bytes}) {
      STRATA_CHECK(std::isfinite(v) && v >= 0)
          << "dynpipe: layer '" << c.name << "' has a negative or non-finite cost (" << v << ")";
    }
    names_.push_back(c.name);
    compute_.push_back(compute_.back() + c.forward_ms + c.backward_ms);
    output_.push_back(output_.back() + c.output_bytes);
    params_.push_back(params_.back() + c.param_bytes);
  }
}

namespace {

// Eq. 6 with the mesh's slowest link `bw`.
StageCost stage_cost_at(const Profile& profile, size_t b, size_t e, MeshShape shape, double bw,
                        const CostOptions& options) {
  StageCost s;
  s.shape = shape;
  const double mb = options.micro_batch_size;
  const double d = shape.data, t = shape.tensor;
  s.compute_ms = mb * profile.compute_ms(b, e);
  if (shape.tensor > 1)
    s.all_gather_ms = transfer_ms(2.0 * (t - 1.0) * mb * profile.output_bytes(b, e), bw);
  if (shape.data > 1)
    s.all_reduce_ms = transfer_ms(2.0 * (d - 1.0) / d * profile.param_bytes(b, e) / t, bw);
  s.time_ms = (s.compute_ms + s.all_gather_ms) / (d * t) + s.all_reduce_ms;
  return s;
}

StageCost best_stage_cost_at(const Profile& profile, size_t b, size_t e, int width, double bw,
                             int max_tensor, const CostOptions& options) {
  StageCost best;
  best.shape = {width, 1};
  best.time_ms = kInf;
  // Increasing tensor: a strict improvement is needed to give up data parallelism.
  for (const MeshShape& shape : mesh_shapes(width, max_tensor)) {
    const StageCost s = stage_cost_at(profile, b, e, shape, bw, options);
    if (s.time_ms < best.time_ms) best = s;
  }
  return best;
}

// Eq. 7 with the slowest link `bw` between meshes of r_prev and r GPUs.
double comm_at(const Profile& profile, size_t l, int r_prev, int r, double bw,
               const CostOptions& options) {
  const double bytes = 2.0 * options.micro_batch_size * profile.boundary_bytes(l);
  return transfer_ms(bytes / (static_cast<double>(r_prev) * r), bw);
}

// The slowest link of every mesh [a, a + w) and between every two adjacent meshes [a, m) and
// [m, e), in O(N^3), for the planner's inner loops.
class LinkTable {
 public:
  explicit LinkTable(const Cluster& c) : n_(c.gpus) {
    const size_t n1 = static_cast<size_t>(n_) + 1;
    mesh_.assign(n1 * n1, kInf);
    link_.assign(n1 * n1 * n1, kInf);
    const auto both = [&](int x, int y) { return std::min(c.bandwidth[x][y], c.bandwidth[y][x]); };
    for (int a = 0; a < n_; ++a) {
      for (int w = 2; a + w <= n_; ++w) {
        double m = mesh_[a * n1 + w - 1];
        for (int x = a; x < a + w - 1; ++x) m = std::min(m, both(x, a + w - 1));
        mesh_[a * n1 + w] = m;
      }
    }
    std::vector<double> row(n1);
    for (int m = 1; m < n_; ++m) {
      std::fill(row.begin(), row.end(), kInf);
      for (int e = m + 1; e <= n_; ++e) {
        double below = kInf;
        for (int a = m - 1; a >= 0; --a) {
          row[a] = std::min(row[a], both(a, e - 1));  // min over [m, e) of a's links
          below = std::min(below, row[a]);
          link_[(a * n1 + m) * n1 + e] = below;
        }
      }
    }
  }
  double mesh(int a, int w) const { return mesh_[a * (n_ + 1) + w]; }
  double link(int a, int m, int e) const { return link_[(a * (n_ + 1) + m) * (n_ + 1) + e]; }

 private:
  int n_;
  std::vector<double> mesh_, link_;
};

int max_tensor_of(const Cluster& cluster, const CostOptions& options) {
  return options.tensor_parallel ? cluster.gpus_per_node : 1;
}

}  // namespace

StageCost stage_cost(const Profile& profile, const Cluster& cluster, size_t b, size_t e, int gpu,
                     MeshShape shape, const CostOptions& options) {
  const int width = shape.data * shape.tensor;
  if (!cluster.mesh_fits(gpu, width)) {
    StageCost s;
    s.shape = shape;
    s.time_ms = kInf;
    return s;
  }
  return stage_cost_at(profile, b, e, shape, cluster.mesh_bandwidth(gpu, width), options);
}

StageCost best_stage_cost(const Profile& profile, const Cluster& cluster, size_t b, size_t e,
                          int gpu, int width, const CostOptions& options) {
  if (!cluster.mesh_fits(gpu, width)) {
    StageCost best;
    best.shape = {width, 1};
    best.time_ms = kInf;
    return best;
  }
  return best_stage_cost_at(profile, b, e, width, cluster.mesh_bandwidth(gpu, width),
                            max_tensor_of(cluster, options), options);
}

double boundary_comm_ms(const Profile& profile, const Cluster& cluster, size_t l, int a, int m,
                        int e, const CostOptions& options) {
  return comm_at(profile, l, m - a, e - m, cluster.link_bandwidth(a, m, e), options);
}

Partition Plan::partition() const {
  Partition p;
  for (const Stage& s : stages) p.push_back(s.layers);
  return p;
}

std::vector<int> Plan::widths() const {
  std::vector<int> w;
  for (const Stage& s : stages) w.push_back(s.gpus);
  return w;
}

Plan evaluate_plan(const std::vector<LayerCost>& costs, const Cluster& cluster,
                   const Partition& partition, const std::vector<int>& widths,
                   const std::vector<MeshShape>& shapes, const CostOptions& options) {
  cluster.check();
  const Profile profile(costs);
  STRATA_CHECK(!partition.empty()) << "dynpipe: the plan has no stages";
  STRATA_CHECK(widths.size() == partition.size())
      << "dynpipe: " << widths.size() << " stage widths for " << partition.size() << " stages";
  STRATA_CHECK(shapes.empty() || shapes.size() == partition.size())
      << "dynpipe: " << shapes.size() << " mesh shapes for " << partition.size() << " stages";
  int gpu = 0;
  size_t layer = 0;
  Plan plan;
  for (size_t s = 0; s < partition.size(); ++s) {
    const LayerRange r = partition[s];
    STRATA_CHECK(r.begin == layer && r.end > r.begin && r.end <= costs.size())
        << "dynpipe: stage " << s << " holds layers [" << r.begin << ", " << r.end
        << "), expected a non-empty range from layer " << layer << " within " << costs.size();
    STRATA_CHECK(widths[s] >= 1) << "dynpipe: stage " << s << " has " << widths[s] << " GPUs";
    Stage st;
    st.layers = r;
    st.first_gpu = gpu;
    st.gpus = widths[s];
    STRATA_CHECK(gpu + widths[s] <= cluster.gpus)
        << "dynpipe: the stage widths use more than the cluster's " << cluster.gpus << " GPUs";
    if (shapes.empty()) {
      st.cost = best_stage_cost(profile, cluster, r.begin, r.end, gpu, widths[s], options);
    } else {
      STRATA_CHECK(shapes[s].data >= 1 && shapes[s].tensor >= 1 &&
                   shapes[s].data * shapes[s].tensor == widths[s])
          << "dynpipe: stage " << s << " has shape d" << shapes[s].data << " t" << shapes[s].tensor
          << " for " << widths[s] << " GPUs";
      st.cost = stage_cost(profile, cluster, r.begin, r.end, gpu, shapes[s], options);
    }
    if (s == 0) {
      st.cycle_ms = st.cost.time_ms;
    } else {
      const Stage& prev = plan.stages.back();
      st.comm_in_ms = boundary_comm_ms(profile, cluster, r.begin, prev.first_gpu, gpu,
                                       gpu + widths[s], options);
      st.cycle_ms = two_stage_time(prev.cycle_ms, st.cost.time_ms, st.comm_in_ms, options.rule);
    }
    plan.stages.push_back(st);
    gpu += widths[s];
    layer = r.end;
  }
  STRATA_CHECK(layer == costs.size())
      << "dynpipe: the plan covers " << layer << " of " << costs.size() << " layers";
  STRATA_CHECK(gpu == cluster.gpus)
      << "dynpipe: the stage widths sum to " << gpu << " GPUs, the cluster has " << cluster.gpus;
  plan.iteration_ms = plan.stages.back().cycle_ms;
  return plan;
}

std::vector<Plan> plan_all_stages(const std::vector<LayerCost>& costs, const Cluster& cluster,
                                  int max_stages, const CostOptions& options) {
  cluster.check();
  STRATA_CHECK(max_stages >= 1) << "dynpipe: at least one stage, got " << max_stages;
  STRATA_CHECK(std::isfinite(options.micro_batch_size) && options.micro_batch_size > 0)
      << "dynpipe: the micro-batch size must be positive, got " << options.micro_batch_size;
  const Profile profile(costs);
  const int M = static_cast<int>(profile.layers());
  const int N = cluster.gpus;
  const int S = std::min({max_stages, M, N});
  // W[s][l][i][r], s = 1..S, l = 1..M, i = 1..N, r = 1..i, flattened; back pointers (l', r').
  const auto at = [&](int s, int l, int i, int r) {
    return ((static_cast<size_t>(s) * (M + 1) + l) * (N + 1) + i) * (N + 1) + r;
  };
  const size_t size = at(S + 1, 0, 0, 0);
  std::vector<double> W(size, kInf);
  std::vector<int> from_l(size, -1), from_r(size, -1);
  const LinkTable links(cluster);
  const int max_tensor = max_tensor_of(cluster, options);
  const auto last_stage_ms = [&](int b, int e, int gpu, int width) {
    if (!cluster.mesh_fits(gpu, width)) return kInf;
    return best_stage_cost_at(profile, b, e, width, links.mesh(gpu, width), max_tensor, options)
        .time_ms;
  };
  for (int l = 1; l <= M; ++l) {
    for (int i = 1; i <= N; ++i) W[at(1, l, i, i)] = last_stage_ms(0, l, 0, i);
  }
  for (int s = 2; s <= S; ++s) {
    for (int l = s; l <= M; ++l) {
      for (int i = s; i <= N; ++i) {
        for (int r = 1; r <= i - (s - 1); ++r) {
          const int m = i - r;  // the last stage runs on GPUs [m, i)
          double best = kInf;
          int best_l = -1, best_r = -1;
          for (int lp = s - 1; lp < l; ++lp) {
            const double last = last_stage_ms(lp, l, m, r);
            if (!std::isfinite(last)) continue;
            for (int rp = 1; rp <= m - (s - 2); ++rp) {
              const double prefix = W[at(s - 1, lp, m, rp)];
              if (!std::isfinite(prefix)) continue;
              const double c = comm_at(profile, lp, rp, r, links.link(m - rp, m, i), options);
              const double w = two_stage_time(prefix, last, c, options.rule);
              if (w < best) {
                best = w;
                best_l = lp;
                best_r = rp;
              }
            }
          }
          W[at(s, l, i, r)] = best;
          from_l[at(s, l, i, r)] = best_l;
          from_r[at(s, l, i, r)] = best_r;
        }
      }
    }
  }
  std::vector<Plan> plans(static_cast<size_t>(max_stages));
  for (int s = 1; s <= S; ++s) {
    double best = kInf;
    int best_r = -1;
    for (int r = 1; r <= N; ++r) {
      if (W[at(s, M, N, r)] < best) {
        best = W[at(s, M, N, r)];
        best_r = r;
      }
    }
    Plan& plan = plans[s - 1];
    plan.iteration_ms = best;
    if (best_r < 0) continue;
    // Walk the back pointers from the last stage to the first.
    Partition partition(static_cast<size_t>(s));
    std::vector<int> widths(static_cast<size_t>(s));
    int l = M, i = N, r = best_r;
    for (int k = s; k >= 1; --k) {
      const int lp = k == 1 ? 0 : from_l[at(k, l, i, r)];
      const int rp = k == 1 ? 0 : from_r[at(k, l, i, r)];
      partition[k - 1] = {static_cast<size_t>(lp), static_cast<size_t>(l)};
      widths[k - 1] = r;
      l = lp;
      i -= r;
      r = rp;
    }
    plan = evaluate_plan(costs, cluster, partition, widths, {}, options);
  }
  for (int s = S + 1; s <= max_stages; ++s) plans[s - 1].iteration_ms = kInf;
  return plans;
}

std::string describe_plan(const Plan& plan, const std::vector<std::string>& names) {
  if (!plan.feasible()) return "none";
  std::string out;
  for (const Stage& s : plan.stages) {
    if (!out.empty()) out += " | ";
    out += names[s.layers.begin];
    if (s.layers.end - s.layers.begin > 1) out += "-" + names[s.layers.end - 1];
    char buf[64];
    std::snprintf(buf, sizeof(buf), " on %d GPU%s", s.gpus, s.gpus == 1 ? "" : "s");
    out += buf;
    if (s.gpus > 1) {
      std::snprintf(buf, sizeof(buf), " (dp %d x tp %d)", s.cost.shape.data, s.cost.shape.tensor);
      out += buf;
    }
  }
  return out;
}

}  // namespace strata::parallel::dynpipe
