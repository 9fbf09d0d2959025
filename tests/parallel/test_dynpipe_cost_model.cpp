// DynPipe's cost model and planner (parallel/dynpipe/cost_model.h): Eq. 4's two cases and the
// corrected reading, Eq. 6/7's scaling, the exact set of mesh shapes, and the dynamic program of
// Eq. 5 against brute-force enumeration of every contiguous partition, GPU split and mesh shape
// for M <= 8 layers on N <= 4 GPUs (papers/dynpipe.md Sec. 5 items 2-4 and 7).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/check.h"
#include "parallel/dynpipe/cost_model.h"
#include "parallel/dynpipe_test_util.h"

namespace strata::parallel::dynpipe {
namespace {

using testing::throws_message;

constexpr double kInf = std::numeric_limits<double>::infinity();

LayerCost layer(const std::string& name, double fwd, double bwd, double out = 0.0,
                double params = 0.0) {
  LayerCost c;
  c.name = name;
  c.forward_ms = fwd;
  c.backward_ms = bwd;
  c.output_bytes = out;
  c.param_bytes = params;
  return c;
}

TEST(DynPipeCost, Eq4CasesOfThePaperNote) {
  // p1 = (2, 4), p2 = (1, 2), c = 3: stage 2 (3) < stage 1 + c (9): case 1, (3 + 6 + 3) / 2.
  EXPECT_EQ(eq4_case(6, 3, 3), 1);
  EXPECT_EQ(two_stage_time(6, 3, 3, TwoStageRule::kPaper), 6.0);
  EXPECT_EQ(two_stage_time(6, 3, 3, TwoStageRule::kCorrected), 6.0);
  // p1 = (1, 1), p2 = (5, 5), c = 1: case 2, W = p2f + p2b.
  EXPECT_EQ(eq4_case(2, 10, 1), 2);
  EXPECT_EQ(two_stage_time(2, 10, 1, TwoStageRule::kPaper), 10.0);
  EXPECT_EQ(two_stage_time(2, 10, 1, TwoStageRule::kCorrected), 10.0);
  // On the boundary p2 = p1 + c both cases give the same time.
  EXPECT_EQ(eq4_case(4, 7, 3), 2);
  EXPECT_EQ((3.0 + 4.0 + 7.0) / 2.0, 7.0);
  EXPECT_EQ(two_stage_time(4, 7, 3, TwoStageRule::kPaper), 7.0);
  EXPECT_EQ(two_stage_time(4, 6.999, 3, TwoStageRule::kPaper), (3 + 4 + 6.999) / 2.0);
  // A dominant first stage: the paper's rule says 6, less than the first stage alone.
  EXPECT_EQ(two_stage_time(10, 1, 1, TwoStageRule::kPaper), 6.0);
  EXPECT_EQ(two_stage_time(10, 1, 1, TwoStageRule::kCorrected), 10.0);
  EXPECT_EQ(parse_two_stage_rule("paper"), TwoStageRule::kPaper);
  EXPECT_NE(throws_message([] { parse_two_stage_rule("pipedream"); }).find("--dynpipe-rule"),
            std::string::npos);
}

TEST(DynPipeCost, Eq6ComputeShrinksWithTheMeshAndCollectivesAreAdded) {
  const Cluster one = Cluster::machines(8, 8, 1e9, 1e9);
  const std::vector<LayerCost> costs = {layer("a", 1.0, 2.0), layer("b", 3.0, 4.0)};
  const Profile profile(costs);
  CostOptions o;
  o.micro_batch_size = 4;
  // r = 1, no collectives: W = mb x sum(p^f + p^b).
  StageCost s = stage_cost(profile, one, 0, 2, 0, {1, 1}, o);
  EXPECT_EQ(s.time_ms, 4.0 * 10.0);
  EXPECT_EQ(s.all_reduce_ms + s.all_gather_ms, 0.0);
  // No parameters or outputs: every doubling of d x t halves the time.
  for (MeshShape shape : {MeshShape{2, 1}, MeshShape{1, 2}, MeshShape{4, 1}, MeshShape{2, 2},
                          MeshShape{8, 1}, MeshShape{1, 8}}) {
    s = stage_cost(profile, one, 0, 2, 0, shape, o);
    EXPECT_EQ(s.time_ms, 40.0 / (shape.data * shape.tensor)) << shape.data << "x" << shape.tensor;
  }
  // With parameters (1 MB) and outputs (1 kB per sample, 2 layers), at 1 GB/s:
  const std::vector<LayerCost> heavy = {layer("a", 1.0, 2.0, 1e3, 4e5),
                                        layer("b", 3.0, 4.0, 1e3, 6e5)};
  const Profile hp(heavy);
  // d = 2: ring all-reduce 2 (d - 1) / d x 1 MB = 1 MB at 1 GB/s = 1 ms, not divided by r.
  s = stage_cost(hp, one, 0, 2, 0, {2, 1}, o);
  EXPECT_DOUBLE_EQ(s.all_reduce_ms, 1.0);
  EXPECT_DOUBLE_EQ(s.time_ms, 20.0 + 1.0);
  // d = 4: 2 x 3/4 MB = 1.5 ms.
  EXPECT_DOUBLE_EQ(stage_cost(hp, one, 0, 2, 0, {4, 1}, o).time_ms, 10.0 + 1.5);
  // t = 2: all-gather 2 (t - 1) x mb x 2 kB = 16 kB = 0.016 ms, divided by d t with the compute.
  s = stage_cost(hp, one, 0, 2, 0, {1, 2}, o);
  EXPECT_DOUBLE_EQ(s.all_gather_ms, 0.016);
  EXPECT_DOUBLE_EQ(s.time_ms, (40.0 + 0.016) / 2.0);
  // d = 2, t = 2: each tensor shard (0.5 MB) all-reduced by 2 replicas: 0.5 ms.
  s = stage_cost(hp, one, 0, 2, 0, {2, 2}, o);
  EXPECT_DOUBLE_EQ(s.all_reduce_ms, 0.5);
  EXPECT_DOUBLE_EQ(s.time_ms, (40.0 + 0.016) / 4.0 + 0.5);
  // The best shape of 2 GPUs without tensor parallelism is data parallel; with it, the cheaper.
  EXPECT_EQ(best_stage_cost(hp, one, 0, 2, 0, 2, o).shape, (MeshShape{2, 1}));
  o.tensor_parallel = true;
  EXPECT_EQ(best_stage_cost(hp, one, 0, 2, 0, 2, o).shape, (MeshShape{1, 2}));
  // The collectives run at the slowest link of the mesh: 2 machines, 0.1 GB/s between them.
  const Cluster two = Cluster::machines(4, 2, 1e9, 1e8);
  EXPECT_DOUBLE_EQ(stage_cost(hp, two, 0, 2, 0, {4, 1}, o).all_reduce_ms, 15.0);
  EXPECT_DOUBLE_EQ(stage_cost(hp, two, 0, 2, 2, {2, 1}, o).all_reduce_ms, 1.0);
}

TEST(DynPipeCost, Eq7ScalesWithTheMeshesAndTheirSlowestLink) {
  // 2 machines of 2 GPUs: 10 GB/s inside, 1 GB/s between.
  const Cluster c = Cluster::machines(4, 2, 10e9, 1e9);
  const std::vector<LayerCost> costs = {layer("a", 1, 1, 1e6), layer("b", 1, 1, 5e5)};
  const Profile profile(costs);
  CostOptions o;
  o.micro_batch_size = 2;
  // A = G = mb x 1 MB: 4 MB over one link inside a machine (r' = r = 1): 0.4 ms.
  EXPECT_DOUBLE_EQ(boundary_comm_ms(profile, c, 1, 0, 1, 2, o), 0.4);
  // Across machines: 4 ms; with r' = 1, r = 2 (GPUs 1 | 2, 3): 2 ms; r' = r = 2: 1 ms.
  EXPECT_DOUBLE_EQ(boundary_comm_ms(profile, c, 1, 1, 2, 3, o), 4.0);
  EXPECT_DOUBLE_EQ(boundary_comm_ms(profile, c, 1, 1, 2, 4, o), 2.0);
  EXPECT_DOUBLE_EQ(boundary_comm_ms(profile, c, 1, 0, 2, 4, o), 1.0);
  // GPUs 0 | 1, 2: one of the links crosses machines, so the minimum is 1 GB/s: 4 MB / 2 / 1e9.
  EXPECT_DOUBLE_EQ(boundary_comm_ms(profile, c, 1, 0, 1, 3, o), 2.0);
  // One slow link in a custom matrix decides it, in either direction.
  Cluster custom = Cluster::machines(4, 4, 10e9, 10e9);
  custom.bandwidth[3][0] = 2e9;
  EXPECT_DOUBLE_EQ(custom.link_bandwidth(0, 2, 4), 2e9);
  EXPECT_DOUBLE_EQ(boundary_comm_ms(profile, custom, 1, 0, 2, 4, o), 4e6 / 4 / 2e9 * 1e3);
  // The boundary bytes are the last layer's outputs before the cut.
  EXPECT_DOUBLE_EQ(profile.boundary_bytes(2), 5e5);
}

TEST(DynPipeCost, MeshShapesAreTheDivisorPairsInsideAMachine) {
  const std::vector<MeshShape> eight = {{8, 1}, {4, 2}, {2, 4}, {1, 8}};
  EXPECT_EQ(mesh_shapes(8, 8), eight);
  EXPECT_EQ(mesh_shapes(6, 6), (std::vector<MeshShape>{{6, 1}, {3, 2}, {2, 3}, {1, 6}}));
  EXPECT_EQ(mesh_shapes(8, 2), (std::vector<MeshShape>{{8, 1}, {4, 2}}));
  EXPECT_EQ(mesh_shapes(8, 1), (std::vector<MeshShape>{{8, 1}}));
  const Cluster c = Cluster::machines(8, 4, 1e9, 1e9);
  EXPECT_TRUE(c.mesh_fits(0, 4));
  EXPECT_TRUE(c.mesh_fits(1, 3));
  EXPECT_FALSE(c.mesh_fits(2, 4));  // half of each machine
  EXPECT_TRUE(c.mesh_fits(0, 8));   // whole machines
  EXPECT_FALSE(c.mesh_fits(2, 6));
}

// Every composition of n into k positive parts.
void compositions(int n, int k, std::vector<int>& prefix, std::vector<std::vector<int>>& out) {
  if (k == 1) {
    prefix.push_back(n);
    out.push_back(prefix);
    prefix.pop_back();
    return;
  }
  for (int first = 1; first <= n - (k - 1); ++first) {
    prefix.push_back(first);
    compositions(n - first, k - 1, prefix, out);
    prefix.pop_back();
  }
}

std::vector<std::vector<int>> compositions(int n, int k) {
  std::vector<std::vector<int>> out;
  std::vector<int> prefix;
  if (k <= n) compositions(n, k, prefix, out);
  return out;
}

// The least W(S) over every contiguous partition, GPU split and shape per stage.
double brute_force(const std::vector<LayerCost>& costs, const Cluster& cluster, int stages,
                   const CostOptions& o) {
  double best = kInf;
  const int max_tensor = o.tensor_parallel ? cluster.gpus_per_node : 1;
  for (const std::vector<int>& sizes : compositions(static_cast<int>(costs.size()), stages)) {
    Partition partition;
    size_t at = 0;
    for (int n : sizes) {
      partition.push_back({at, at + n});
      at += n;
    }
    for (const std::vector<int>& widths : compositions(cluster.gpus, stages)) {
      std::vector<MeshShape> shapes(widths.size());
      std::function<void(size_t)> each = [&](size_t s) {
        if (s == widths.size()) {
          best = std::min(best,
                          evaluate_plan(costs, cluster, partition, widths, shapes, o).iteration_ms);
          return;
        }
        for (const MeshShape& shape : mesh_shapes(widths[s], max_tensor)) {
          shapes[s] = shape;
          each(s + 1);
        }
      };
      each(0);
    }
  }
  return best;
}

TEST(DynPipePlanner, OptimumEqualsBruteForceUpTo8LayersAnd4Gpus) {
  std::mt19937 rng(15);
  std::uniform_real_distribution<double> ms(0.1, 5.0), bytes(0.0, 4e6), params(0.0, 8e6);
  int compared = 0, feasible = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const int M = 1 + static_cast<int>(rng() % 8);
    const int N = 1 + static_cast<int>(rng() % 4);
    std::vector<int> per_node;
    for (int k = 1; k <= N; ++k) {
      if (N % k == 0) per_node.push_back(k);
    }
    const int gpn = per_node[rng() % per_node.size()];
    Cluster cluster = Cluster::machines(N, gpn, 10e9, 1e9 * (0.2 + (rng() % 10) / 5.0));
    if (trial % 3 == 0) {  // any links, not symmetric: the slowest of a pair decides
      for (auto& row : cluster.bandwidth) {
        for (double& b : row) b = 1e8 * static_cast<double>(1 + rng() % 200);
      }
    }
    std::vector<LayerCost> costs;
    for (int l = 0; l < M; ++l) {
      costs.push_back(layer("l" + std::to_string(l), ms(rng), 2.0 * ms(rng), bytes(rng),
                            rng() % 3 == 0 ? 0.0 : params(rng)));
    }
    CostOptions o;
    o.micro_batch_size = static_cast<double>(1 + rng() % 16);
    o.tensor_parallel = rng() % 2 == 0;
    o.rule = rng() % 2 == 0 ? TwoStageRule::kCorrected : TwoStageRule::kPaper;
    const std::vector<Plan> plans = plan_all_stages(costs, cluster, 4, o);
    ASSERT_EQ(plans.size(), 4u);
    for (int S = 1; S <= 4; ++S) {
      const Plan& plan = plans[S - 1];
      const double expected = brute_force(costs, cluster, S, o);
      ++compared;
      if (!std::isfinite(expected)) {
        EXPECT_FALSE(plan.feasible()) << "trial " << trial << " S " << S;
        EXPECT_EQ(plan.iteration_ms, kInf);
        continue;
      }
      ++feasible;
      ASSERT_TRUE(plan.feasible()) << "trial " << trial << " S " << S;
      EXPECT_NEAR(plan.iteration_ms, expected, 1e-9 * expected)
          << "trial " << trial << " M " << M << " N " << N << " S " << S << " per node " << gpn
          << " rule " << two_stage_rule_name(o.rule);
      // Contiguous stages covering every layer once, every GPU used.
      ASSERT_EQ(plan.stages.size(), static_cast<size_t>(S));
      size_t next = 0;
      int gpus = 0;
      for (const Stage& s : plan.stages) {
        EXPECT_EQ(s.layers.begin, next);
        EXPECT_GT(s.layers.end, s.layers.begin);
        EXPECT_EQ(s.first_gpu, gpus);
        next = s.layers.end;
        gpus += s.gpus;
      }
      EXPECT_EQ(next, costs.size());
      EXPECT_EQ(gpus, N);
      // The plan's own evaluation gives the DP's value.
      EXPECT_EQ(evaluate_plan(costs, cluster, plan.partition(), plan.widths(), {}, o).iteration_ms,
                plan.iteration_ms);
    }
  }
  EXPECT_EQ(compared, 480);
  EXPECT_GT(feasible, 200);  // the draw covers the feasible cases well
}

TEST(DynPipePlanner, OneStageIsTheWholeModelOnAllGpus) {
  const std::vector<LayerCost> costs = {layer("a", 1, 2, 10, 100), layer("b", 3, 4, 10, 100),
                                        layer("c", 1, 1, 10, 0)};
  const Cluster cluster = Cluster::machines(4, 4, 1e9, 1e9);
  const std::vector<Plan> plans = plan_all_stages(costs, cluster, 6, CostOptions{});
  ASSERT_EQ(plans.size(), 6u);
  ASSERT_TRUE(plans[0].feasible());
  ASSERT_EQ(plans[0].stages.size(), 1u);
  EXPECT_EQ(plans[0].stages[0].layers, (LayerRange{0, 3}));
  EXPECT_EQ(plans[0].stages[0].gpus, 4);
  // More stages than layers (or GPUs): no plan.
  EXPECT_TRUE(plans[2].feasible());
  for (int s = 4; s <= 6; ++s) {
    EXPECT_FALSE(plans[s - 1].feasible()) << s;
    EXPECT_EQ(plans[s - 1].iteration_ms, kInf);
  }
  // 2 machines of 2 GPUs, one stage: the mesh is both machines.
  const std::vector<Plan> two = plan_all_stages(costs, Cluster::machines(4, 2, 1e9, 1e9), 1, {});
  EXPECT_EQ(two[0].stages[0].gpus, 4);
}

TEST(DynPipePlanner, CorrectedRuleSeesADominantFirstStage) {
  // One heavy layer first, free links. The paper's rule rates every cut of two stages 8 ms, the
  // front-loaded "a b c | d" (14 ms of work on one GPU) as well as "a | b c d", and always less
  // than the first stage alone; the corrected rule prices each by its slowest stage.
  const std::vector<LayerCost> costs = {layer("a", 5, 5), layer("b", 1, 1), layer("c", 1, 1),
                                        layer("d", 1, 1)};
  const Cluster cluster = Cluster::machines(2, 2, 1e9, 1e9);
  CostOptions o;
  o.rule = TwoStageRule::kPaper;
  EXPECT_EQ(plan_all_stages(costs, cluster, 2, o)[1].iteration_ms, 8.0);
  EXPECT_EQ(evaluate_plan(costs, cluster, {{0, 3}, {3, 4}}, {1, 1}, {}, o).iteration_ms, 8.0);
  o.rule = TwoStageRule::kCorrected;
  EXPECT_EQ(evaluate_plan(costs, cluster, {{0, 3}, {3, 4}}, {1, 1}, {}, o).iteration_ms, 14.0);
  const Plan corrected = plan_all_stages(costs, cluster, 2, o)[1];
  EXPECT_EQ(corrected.iteration_ms, 10.0);
  EXPECT_EQ(corrected.partition(), (Partition{{0, 1}, {1, 4}}));
}

TEST(DynPipePlanner, BadInputIsNamed) {
  const std::vector<LayerCost> costs = {layer("a", 1, 1), layer("b", 1, 1)};
  const Cluster cluster = Cluster::machines(2, 2, 1e9, 1e9);
  EXPECT_NE(throws_message([] { Cluster::machines(6, 4, 1e9, 1e9); }).find("--gpus-per-node 4"),
            std::string::npos);
  EXPECT_NE(throws_message([] { Cluster::machines(0, 1, 1e9, 1e9); }).find("--gpus"),
            std::string::npos);
  EXPECT_NE(throws_message([] { Cluster::machines(2, 1, 0, 1e9); }).find("--node-bandwidth"),
            std::string::npos);
  EXPECT_NE(throws_message([] { Cluster::machines(2, 1, 1e9, -1); }).find("--bandwidth"),
            std::string::npos);
  const std::vector<LayerCost> bad = {layer("a", 1, 1), layer("conv9", -1, 1)};
  EXPECT_NE(throws_message([&] { plan_all_stages(bad, cluster, 2, {}); }).find("'conv9'"),
            std::string::npos);
  EXPECT_NE(throws_message([&] {
              evaluate_plan(costs, cluster, {{0, 1}, {1, 2}}, {1, 2}, {}, {});
            }).find("more than the cluster's 2 GPUs"),
            std::string::npos);
  EXPECT_NE(throws_message([&] {
              evaluate_plan(costs, cluster, {{0, 1}}, {2}, {}, {});
            }).find("covers 1 of 2 layers"),
            std::string::npos);
  EXPECT_NE(throws_message([&] {
              evaluate_plan(costs, cluster, {{0, 2}}, {2}, {{1, 1}}, {});
            }).find("shape d1 t1 for 2 GPUs"),
            std::string::npos);
}

}  // namespace
}  // namespace strata::parallel::dynpipe
