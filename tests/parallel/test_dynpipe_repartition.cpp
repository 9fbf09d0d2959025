// DynPipe's interference-aware re-partition (parallel/dynpipe/repartition.h), papers/dynpipe.md
// Sec. 5 items 12-13: condensation at the top-k anchors, the cycle-time simulator, propose()
// keeping an optimal current plan, moving layers off a slowed rank, the current plan winning when
// nothing improves, the dynamic program equal to enumerating every boundary combination,
// dynpipe-no-rf's measured slowdowns and the forest's per-stage predictions.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/check.h"
#include "parallel/dynpipe/repartition.h"
#include "parallel/dynpipe/slowdown_features.h"
#include "parallel/dynpipe/slowdown_model.h"
#include "parallel/dynpipe_test_util.h"

namespace strata::parallel::dynpipe {
namespace {

using testing::throws_message;

// Layers of forward f and backward 2f ms per sample, outputs of `bytes` per sample.
std::vector<LayerCost> layers_of(const std::vector<double>& forward, double bytes = 0.0) {
  std::vector<LayerCost> layers;
  for (size_t i = 0; i < forward.size(); ++i) {
    LayerCost c;
    c.name = "l" + std::to_string(i);
    c.forward_ms = forward[i];
    c.backward_ms = 2.0 * forward[i];
    c.output_bytes = bytes;
    layers.push_back(c);
  }
  return layers;
}

Partition cuts(const std::vector<size_t>& sizes) {
  Partition p;
  size_t b = 0;
  for (size_t s : sizes) {
    p.push_back({b, b + s});
    b += s;
  }
  return p;
}

TEST(DynPipeRepartition, CondensationBlocksEndAtTheAnchors) {
  // Times 1, 5, 1, 1, 7, 1, 1, 3: the top 3 are layers 4, 1 and 7.
  const auto layers = layers_of({1, 5, 1, 1, 7, 1, 1, 3});
  const std::vector<LayerRange> blocks = condense(layers, 3);
  const std::vector<LayerRange> expected = {{0, 2}, {2, 5}, {5, 8}};
  EXPECT_EQ(blocks, expected);
  // Top 2 (layers 4 and 1): a tail block after the last anchor.
  const std::vector<LayerRange> tail = {{0, 2}, {2, 5}, {5, 8}};
  EXPECT_EQ(condense(layers, 2), tail);
  const std::vector<LayerRange> two = condense(layers_of({1, 5, 1, 1, 7, 1, 1, 1}), 2);
  const std::vector<LayerRange> with_tail = {{0, 2}, {2, 5}, {5, 8}};
  EXPECT_EQ(two, with_tail);
  // Kept cuts (the current plan's) are block ends too; 0 anchors: every layer a block.
  const std::vector<LayerRange> kept = condense(layers, 1, cuts({3, 5}));
  const std::vector<LayerRange> kept_expected = {{0, 3}, {3, 5}, {5, 8}};
  EXPECT_EQ(kept, kept_expected);
  EXPECT_EQ(condense(layers, 0).size(), 8u);
  // Contiguous, covering, time preserved.
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0.1, 4.0);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<double> f(13);
    for (double& x : f) x = u(rng);
    const auto ls = layers_of(f);
    const auto bs = condense(ls, static_cast<size_t>(trial % 6));
    size_t next = 0;
    for (const LayerRange& b : bs) {
      EXPECT_EQ(b.begin, next);
      EXPECT_GT(b.end, b.begin);
      next = b.end;
    }
    EXPECT_EQ(next, ls.size());
    EXPECT_LE(bs.size(), static_cast<size_t>(trial % 6 == 0 ? 13 : trial % 6 + 1));
  }
}

TEST(DynPipeRepartition, SimulatorFoldsEq5OverTheStages) {
  // Stages of 3 and 6 ms (x mb 2), the second slowed 2x, a boundary of 2 x 2 x 1e6 B at 1 GB/s
  // = 4 ms: max(6, 24, (4 + 6 + 24) / 2) = 24.
  const auto layers = layers_of({1, 1, 1}, 1e6);
  RepartitionOptions o;
  o.micro_batch_size = 2;
  o.bandwidth_bps = 1e9;
  std::vector<double> stage_ms;
  EXPECT_DOUBLE_EQ(simulate_cycle(layers, cuts({1, 2}), per_rank_slowdown({1, 2}), o, &stage_ms),
                   24.0);
  EXPECT_EQ(stage_ms, (std::vector<double>{6.0, 24.0}));
  // Communication-bound: (c + W_p + W_l) / 2 with c = 40 ms at 0.1 GB/s: (40 + 6 + 12) / 2 = 29.
  o.bandwidth_bps = 1e8;
  EXPECT_DOUBLE_EQ(simulate_cycle(layers, cuts({1, 2}), per_rank_slowdown({1, 1}), o), 29.0);
}

TEST(DynPipeRepartition, KeepsAnOptimalPlanWithoutInterference) {
  const auto layers = layers_of({1, 1, 1, 1, 1, 1, 1, 1});
  const Proposal p = propose(cuts({4, 4}), layers, std::vector<double>{1.0, 1.0}, {});
  EXPECT_FALSE(p.changed);
  EXPECT_EQ(p.partition, cuts({4, 4}));
  EXPECT_DOUBLE_EQ(p.cycle_ms, 12.0);
  EXPECT_DOUBLE_EQ(p.current_cycle_ms, 12.0);
}

TEST(DynPipeRepartition, MovesLayersOffASlowedRank) {
  const auto layers = layers_of({1, 1, 1, 1, 1, 1, 1, 1});
  // Rank 1 three times slower: 4 | 4 costs max(12, 36) = 36; 6 | 2 costs max(18, 18) = 18.
  const Proposal p = propose(cuts({4, 4}), layers, std::vector<double>{1.0, 3.0}, {});
  EXPECT_TRUE(p.changed);
  EXPECT_EQ(p.partition, cuts({6, 2}));
  EXPECT_DOUBLE_EQ(p.current_cycle_ms, 36.0);
  EXPECT_DOUBLE_EQ(p.cycle_ms, 18.0);
  EXPECT_EQ(p.stage_ms, (std::vector<double>{18.0, 18.0}));
  // The middle rank of four slowed: layers leave it for its neighbours.
  const auto twelve = layers_of(std::vector<double>(12, 1.0));
  const Proposal q = propose(cuts({3, 3, 3, 3}), twelve, std::vector<double>{1, 4, 1, 1}, {});
  EXPECT_TRUE(q.changed);
  EXPECT_EQ(q.partition[1].end - q.partition[1].begin, 1u);
  EXPECT_LT(q.cycle_ms, q.current_cycle_ms);
  // With condensation at 2 anchors plus the current cut, the blocks limit where layers go.
  RepartitionOptions o;
  o.top_k = 2;
  const auto uneven = layers_of({1, 1, 4, 1, 1, 5, 1, 1});
  const Proposal c = propose(cuts({4, 4}), uneven, std::vector<double>{1.0, 3.0}, o);
  EXPECT_EQ(c.blocks, 4u);  // ends after layers 2, 3 (current cut), 5, 7
  EXPECT_TRUE(c.changed);
  EXPECT_EQ(c.partition, cuts({6, 2}));
}

TEST(DynPipeRepartition, TheCurrentPlanWinsWhenNothingImproves) {
  // Every rank slowed alike: the balanced plan stays.
  const auto layers = layers_of({1, 1, 1, 1, 1, 1});
  const Proposal same = propose(cuts({2, 2, 2}), layers, std::vector<double>{2, 2, 2}, {});
  EXPECT_FALSE(same.changed);
  EXPECT_DOUBLE_EQ(same.cycle_ms, same.current_cycle_ms);
  // One heavy layer bounds every plan: moving the others cannot lower the cycle, so no move
  // (ties keep the current plan, even an unbalanced one).
  const auto heavy = layers_of({10, 1, 1, 1});
  const Proposal h = propose(cuts({1, 3}), heavy, std::vector<double>{1.0, 1.5}, {});
  EXPECT_FALSE(h.changed);
  EXPECT_EQ(h.partition, cuts({1, 3}));
  // A gain below the minimum does not move: at slowdowns (1, 1.5) 4 | 4 costs 18 and the best,
  // 5 | 3, max(15, 13.5) = 15 (17% better).
  const auto eight = layers_of(std::vector<double>(8, 1.0));
  RepartitionOptions o;
  o.min_gain = 0.2;
  EXPECT_FALSE(propose(cuts({4, 4}), eight, std::vector<double>{1.0, 1.5}, o).changed);
  o.min_gain = 0.1;
  EXPECT_TRUE(propose(cuts({4, 4}), eight, std::vector<double>{1.0, 1.5}, o).changed);
}

// Every contiguous partition of the blocks into `stages` stages.
void enumerate(const std::vector<LayerRange>& blocks, size_t stages, size_t first, Partition& now,
               const std::function<void(const Partition&)>& visit) {
  if (stages == 1) {
    now.push_back({blocks[first].begin, blocks.back().end});
    visit(now);
    now.pop_back();
    return;
  }
  for (size_t j = first + 1; j + stages - 1 <= blocks.size(); ++j) {
    now.push_back({blocks[first].begin, blocks[j - 1].end});
    enumerate(blocks, stages - 1, j, now, visit);
    now.pop_back();
  }
}

TEST(DynPipeRepartition, DynamicProgramEqualsEnumeratingEveryBoundarySet) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> time(0.1, 3.0), slow(1.0, 4.0), bytes(0, 4e6);
  for (int trial = 0; trial < 60; ++trial) {
    const size_t m = 3 + rng() % 8, s = 1 + rng() % std::min<size_t>(4, m);
    std::vector<double> f(m);
    for (double& x : f) x = time(rng);
    std::vector<LayerCost> layers = layers_of(f);
    for (LayerCost& l : layers) l.output_bytes = bytes(rng);
    std::vector<double> factors(s);
    for (double& x : factors) x = slow(rng);
    RepartitionOptions o;
    o.bandwidth_bps = trial % 2 == 0 ? 1e9 : 0.0;
    o.top_k = static_cast<size_t>(trial % 4);
    o.rule = trial % 3 == 0 ? TwoStageRule::kPaper : TwoStageRule::kCorrected;
    // The current plan: equal layer counts (the remainder on the first stages).
    std::vector<size_t> sizes(s, m / s);
    for (size_t k = 0; k < m % s; ++k) ++sizes[k];
    const Partition current = cuts(sizes);
    const Proposal p = propose(current, layers, factors, o);
    const SlowdownFn fn = per_rank_slowdown(factors);
    double best = simulate_cycle(layers, current, fn, o);
    Partition now;
    enumerate(condense(layers, o.top_k, current), s, 0, now,
              [&](const Partition& c) { best = std::min(best, simulate_cycle(layers, c, fn, o)); });
    EXPECT_NEAR(p.cycle_ms, best, 1e-9 * best) << "trial " << trial;
    EXPECT_LE(p.cycle_ms, p.current_cycle_ms);
  }
}

TEST(DynPipeRepartition, NoRfUsesTheLastMeasuredSlowdown) {
  const auto layers = layers_of(std::vector<double>(8, 1.0));
  RepartitionOptions o;
  o.micro_batch_size = 2;
  // Solo stage times 24 and 24 ms; measured 24 and 72: factors 1 and 3.
  const std::vector<double> f = measured_slowdowns(layers, cuts({4, 4}), {24.0, 72.0}, o);
  EXPECT_EQ(f, (std::vector<double>{1.0, 3.0}));
  EXPECT_EQ(propose(cuts({4, 4}), layers, f, o).partition, cuts({6, 2}));
  EXPECT_NE(throws_message([&] {
              measured_slowdowns(layers, cuts({4, 4}), {24.0}, o);
            }).find("1 measured stage times for 2 stages"),
            std::string::npos);
  EXPECT_NE(throws_message([&] {
              measured_slowdowns(layers, cuts({4, 4}), {24.0, 0.0}, o);
            }).find("measured time of stage 1 must be positive"),
            std::string::npos);
}

TEST(DynPipeRepartition, BadInputIsNamed) {
  const auto layers = layers_of({1, 1, 1, 1});
  EXPECT_NE(throws_message([&] {
              propose(cuts({2, 1}), layers, std::vector<double>{1, 1}, {});
            }).find("covers 3 layers of 4"),
            std::string::npos);
  EXPECT_NE(throws_message([&] {
              propose(cuts({2, 2}), layers, std::vector<double>{1}, {});
            }).find("1 slowdowns for the 2 ranks"),
            std::string::npos);
  EXPECT_NE(throws_message([&] {
              propose(cuts({2, 2}), layers, std::vector<double>{1, -2}, {});
            }).find("slowdown of rank 1 must be positive"),
            std::string::npos);
  EXPECT_NE(throws_message([&] {
              propose({{0, 2}, {1, 4}}, layers, std::vector<double>{1, 1}, {});
            }).find("not contiguous"),
            std::string::npos);
}

TEST(DynPipeRepartition, ForestPredictsEachCandidateStagesSlowdown) {
  if (!forest_available()) GTEST_SKIP() << "built with -DSTRATA_WITH_XGBOOST=OFF";
  // Feature set kFeatureSet; slowdown = 1 + 2 x colocated_threads, whatever the layer.
  SlowdownData d;
  d.features = slowdown_features();
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0, 1), t(0.5, 5);
  for (int i = 0; i < 400; ++i) {
    const double util = u(rng);
    for (size_t k = 0; k < d.features.size(); ++k) {
      d.x.push_back(static_cast<float>(k == 0 ? t(rng) : k == 4 ? util : 0.5));
    }
    d.y.push_back(static_cast<float>(1 + 2 * util));
  }
  ForestOptions fo;
  fo.trees = 16;
  fo.threads = 1;
  const ForestModel forest = ForestModel::fit(d, fo);
  const auto layers = layers_of(std::vector<double>(8, 1.0));
  std::map<std::string, double> idle, busy;
  for (const std::string& n : counter_names()) idle[n] = busy[n] = 0.5;
  idle["colocated_threads"] = 0.0;
  busy["colocated_threads"] = 1.0;
  const SlowdownFn fn = make_forest_slowdown(forest, layers, {idle, busy});
  EXPECT_NEAR(fn(0, {0, 4}), 1.0, 0.15);
  EXPECT_NEAR(fn(1, {4, 8}), 3.0, 0.15);
  const Proposal p = propose(cuts({4, 4}), layers, fn, {});
  EXPECT_TRUE(p.changed);
  EXPECT_EQ(p.partition, cuts({6, 2}));
  busy.erase("colocated_threads");
  EXPECT_NE(throws_message([&] {
              make_forest_slowdown(forest, layers, {idle, busy});
            })
                .find("the counter 'colocated_threads' of feature set strata-cpu-3 is not among "
                      "rank 1's counters"),
            std::string::npos);
}

}  // namespace
}  // namespace strata::parallel::dynpipe
