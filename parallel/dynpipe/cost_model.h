// DynPipe's per-iteration time with communication that is not hidden, and its planner
// (papers/dynpipe.md Sec. 2.4, Eqs. 4-7; the paper is Yuan et al., TPDS 2025, Sec. IV-C).
//
// The model: M layers, N GPUs, S stages, each stage a contiguous range of layers on a contiguous
// range of GPUs (stage 1 on the first GPUs), r GPUs per stage as r_data x r_tensor. One iteration
// is one minibatch of `micro_batch_size` samples through the pipeline (an update under async
// 1F1B); times are ms per iteration, from the per-sample costs of `strata profile` (LayerCost).
//
//   Eq. 6, a stage of layers [b, e) on r = d x t GPUs (the paper's sum runs to l, printed for
//   the last stage's M: either way a stage's own layers):
//     W_stage = (mb x sum_o (p_o^f + p_o^b) + p_AG) / (d t) + p_AR
//     p_AG = 2 (t - 1) x mb x sum_o out_bytes_o / b_mesh     (t > 1: every layer's output gathered
//            in the forward, its gradient in the backward; divided by d t in Eq. 6, this is each
//            GPU's share of the gather)
//     p_AR = 2 (d - 1) / d x (param_bytes / t) / b_mesh      (d > 1: ring all-reduce of the
//            stage's gradients, each tensor-parallel shard among its d replicas)
//     b_mesh = the slowest link between two GPUs of the stage.
//   Eq. 7, the boundary after layer l' between a stage on r' GPUs and one on r GPUs:
//     c = (A + G) / (r' r b_min),  A = G = mb x out_bytes_{l'}  (the activation sent forward and
//     the gradient of the same tensor sent back), b_min = the slowest link between the two meshes.
//   Eq. 4/5, a prefix pipeline of cycle time W_p followed by a last stage of time W_l, boundary c:
//     paper (kPaper):        (c + W_p + W_l) / 2  if W_l < W_p + c (case 1), else W_l (case 2)
//     corrected (kCorrected, the default): max(W_p, W_l, (c + W_p + W_l) / 2)
//   The paper's rule never lets the prefix alone bound the cycle: W_p = 10, W_l = 1, c = 1 gives
//   6 < 10, and its planner would load the first stages freely (papers/dynpipe.md Sec. 6 item 1).
//   Both rules are non-decreasing in W_p, so the minimal prefix is optimal for a fixed last stage
//   and boundary: the dynamic program below is exact for either.
//
// Meshes (Algorithm 1's Mesh(r), the paper's lower layer without Alpa): a stage's GPUs lie in one
// machine or are whole machines; its (data, tensor) shapes are the pairs d x t = r with t at most
// the GPUs of a machine (a tensor-parallel group inside a machine), tensor parallelism only when
// asked for (Strata's layers are not sharded, so by default t = 1). The best shape of a stage is
// the one of least W_stage (ties: more data parallelism).
//
// The planner (Eq. 5): W(l, s, r, i) = least cycle time of the first l layers as s stages on the
// first i GPUs, the last of them on r GPUs; W(S) = min_r W(M, S, r, N). Every GPU is used. One
// run gives W(s) for every s <= S in O(M^2 S N^3) time (the slowest links of every mesh and pair
// of meshes tabled first in O(N^3)); on the 2-core development machine 20 layers on 64 GPUs take
// 0.8 s, 100 layers on 32 GPUs 2.7 s, on 64 GPUs 35 s. Ties keep the earliest cut, then the
// narrowest previous stage.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "parallel/partition/partition.h"

namespace strata::parallel::dynpipe {

// GPUs and the bandwidth, bytes per second, between each pair (the diagonal is not read).
struct Cluster {
  int gpus = 1;
  int gpus_per_node = 1;
  std::vector<std::vector<double>> bandwidth;  // gpus x gpus

  // `nodes` machines of `gpus_per_node` GPUs: intra_bps inside a machine, inter_bps between two.
  // Throws strata::Error naming the flags (--gpus, --gpus-per-node, --bandwidth,
  // --node-bandwidth) for counts below 1, GPUs that do not fill whole machines or bandwidths that
  // are not positive.
  static Cluster machines(int gpus, int gpus_per_node, double intra_bps, double inter_bps);
  // Throws unless the matrix is gpus x gpus with positive finite off-diagonal entries (the last
  // machine may be partly used: see first()).
  void check() const;
  // The first `count` GPUs (1 <= count <= gpus) and their links.
  Cluster first(int count) const;
  // Slowest link between GPUs [a, a + width) (infinity for one GPU), and between [a, m) and
  // [m, e).
  double mesh_bandwidth(int a, int width) const;
  double link_bandwidth(int a, int m, int e) const;
  // GPUs [a, a + width) lie in one machine or are whole machines.
  bool mesh_fits(int a, int width) const;
};

struct MeshShape {
  int data = 1;
  int tensor = 1;
  bool operator==(const MeshShape& o) const { return data == o.data && tensor == o.tensor; }
};
// The (data, tensor) pairs of `gpus` GPUs with tensor <= max_tensor, by increasing tensor.
std::vector<MeshShape> mesh_shapes(int gpus, int max_tensor);

enum class TwoStageRule { kCorrected, kPaper };
// Eq. 4: 1 when W_last < W_prefix + c, else 2.
int eq4_case(double prefix_ms, double last_ms, double comm_ms);
// Eq. 4/5 under `rule` (see the file comment).
double two_stage_time(double prefix_ms, double last_ms, double comm_ms,
                      TwoStageRule rule = TwoStageRule::kCorrected);
// "corrected" | "paper"; throws strata::Error naming --dynpipe-rule otherwise.
TwoStageRule parse_two_stage_rule(const std::string& name);
const char* two_stage_rule_name(TwoStageRule rule);

struct CostOptions {
  double micro_batch_size = 1.0;  // samples per iteration
  bool tensor_parallel = false;   // consider shapes with tensor > 1
  TwoStageRule rule = TwoStageRule::kCorrected;
};

// Eq. 6's terms for one stage.
struct StageCost {
  MeshShape shape;
  double compute_ms = 0.0;     // mb x sum (p^f + p^b), one GPU
  double all_gather_ms = 0.0;  // p_AG
  double all_reduce_ms = 0.0;  // p_AR
  double time_ms = 0.0;        // W_stage
};

// Prefix sums of a profile for O(1) stage costs.
class Profile {
 public:
  explicit Profile(const std::vector<LayerCost>& costs);
  size_t layers() const { return names_.size(); }
  // Sums over layers [b, e), per sample.
  double compute_ms(size_t b, size_t e) const { return compute_[e] - compute_[b]; }
  double output_bytes(size_t b, size_t e) const { return output_[e] - output_[b]; }
  double param_bytes(size_t b, size_t e) const { return params_[e] - params_[b]; }
  // What a stage ending after layer l - 1 sends on, per sample.
  double boundary_bytes(size_t l) const { return output_[l] - output_[l - 1]; }
  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<std::string> names_;
  std::vector<double> compute_, output_, params_;
};

// Eq. 6 for layers [b, e) on GPUs [gpu, gpu + shape.data x shape.tensor).
StageCost stage_cost(const Profile& profile, const Cluster& cluster, size_t b, size_t e, int gpu,
                     MeshShape shape, const CostOptions& options);
// The best shape of Mesh(width) for the stage (infinite time when the mesh does not fit).
StageCost best_stage_cost(const Profile& profile, const Cluster& cluster, size_t b, size_t e,
                          int gpu, int width, const CostOptions& options);
// Eq. 7 for the boundary after layer `l` - 1 (layers [.., l) | [l, ..)) between GPUs [a, m) and
// [m, e).
double boundary_comm_ms(const Profile& profile, const Cluster& cluster, size_t l, int a, int m,
                        int e, const CostOptions& options);

struct Stage {
  LayerRange layers;
  int first_gpu = 0;
  int gpus = 1;
  StageCost cost;
  double comm_in_ms = 0.0;  // Eq. 7 of the boundary before it (0 for the first stage)
  double cycle_ms = 0.0;    // W of the pipeline of the stages up to this one
};

struct Plan {
  std::vector<Stage> stages;  // empty: no plan (more stages than layers or GPUs, no mesh fits)
  double iteration_ms = 0.0;  // W(S), infinite when there is no plan
  Partition partition() const;
  std::vector<int> widths() const;
  bool feasible() const { return !stages.empty(); }
};

// The cost of a given plan: its partition of the layers, GPUs per stage (summing to the
// cluster's) and, per stage, a shape (empty: each stage's best). Throws strata::Error for a
// partition that does not cover the profile, widths that do not sum to the GPUs or a shape that
// does not match its width; a mesh that does not fit a machine gives an infinite time.
Plan evaluate_plan(const std::vector<LayerCost>& costs, const Cluster& cluster,
                   const Partition& partition, const std::vector<int>& widths,
                   const std::vector<MeshShape>& shapes, const CostOptions& options);

// Eq. 5 by dynamic programming: element s - 1 is the best plan of s stages, s = 1..max_stages
// (infeasible where s > layers or s > GPUs). Throws strata::Error for an empty profile, a
// negative or non-finite cost, max_stages < 1 or a bad cluster.
std::vector<Plan> plan_all_stages(const std::vector<LayerCost>& costs, const Cluster& cluster,
                                  int max_stages, const CostOptions& options);

// "conv1-pool1 x2 | fc1-fc2 x1 (d2 t1)"-style summary: the partition, GPUs and shapes.
std::string describe_plan(const Plan& plan, const std::vector<std::string>& names);

}  // namespace strata::parallel::dynpipe
