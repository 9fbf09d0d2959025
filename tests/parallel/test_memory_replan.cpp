// The memory plan made again when layers move (parallel/memory_replan.h): each layer's overhead
// under a plan, the partitions on the way between two, rank 0's plan reaching every rank, and
// vPIPE's policy scoring candidates with their own plans (Algorithm 1's alternation), dropping
// those no plan fits.
#include <gtest/gtest.h>

#include <mutex>

#include "parallel/comm/local_comm.h"
#include "parallel/memory_replan.h"
#include "parallel/repartition_loop.h"
#include "parallel/vpipe/repartition.h"
#include "testing/testing.h"

namespace strata::parallel {
namespace {

LayerMemoryCost layer(double forward, double backward, double saved) {
  LayerMemoryCost c;
  c.forward_s = forward;
  c.backward_s = backward;
  c.saved_bytes = saved;
  return c;
}

TEST(MemoryReplan, LayerOverheadsChargeRecomputeAndExposedSwap) {
  const std::vector<LayerMemoryCost> layers{layer(1, 2, 100), layer(1, 3, 100), layer(2, 2, 300),
                                            layer(1, 1, 100)};
  const Partition partition{{0, 2}, {2, 4}};
  PipelinePlan plan;
  plan.plan = MemoryPlan::uniform(4, MemoryPolicy::kKeep);
  plan.plan.layers[1] = MemoryPolicy::kRecompute;
  plan.plan.layers[2] = MemoryPolicy::kSwap;
  plan.plan.layers[3] = MemoryPolicy::kSwap;
  plan.stages.resize(2);
  plan.stages[1].time.exposed_swap_s = 2.0;  // shared 3:1 by the swapped layers' bytes
  const std::vector<double> o = layer_overheads(layers, plan, partition);
  ASSERT_EQ(o.size(), 4u);
  EXPECT_DOUBLE_EQ(o[0], 0.0);        // keep
  EXPECT_DOUBLE_EQ(o[1], 1.0 / 4.0);  // a replayed forward of 1 over 1 + 3
  EXPECT_DOUBLE_EQ(o[2], 1.5 / 4.0);  // 3/4 of the exposed 2 s over 2 + 2
  EXPECT_DOUBLE_EQ(o[3], 0.5 / 2.0);  // 1/4 of it over 1 + 1
  // A swap hidden in the window costs nothing.
  plan.stages[1].time.exposed_swap_s = 0.0;
  EXPECT_DOUBLE_EQ(layer_overheads(layers, plan, partition)[2], 0.0);
  EXPECT_DOUBLE_EQ(slowest_stage_with_overhead(partition, {1, 1, 1, 1}, {0, 1, 0.5, 0}), 3.0);
}

TEST(MemoryReplan, PartitionsBetweenMoveEveryBoundaryPartOfTheWay) {
  const std::vector<Partition> two = partitions_between({{0, 2}, {2, 8}}, {{0, 6}, {6, 8}});
  ASSERT_EQ(two.size(), 4u);
  EXPECT_EQ(two[0], (Partition{{0, 6}, {6, 8}}));  // the target first
  EXPECT_EQ(two[1], (Partition{{0, 5}, {5, 8}}));
  EXPECT_EQ(two[3], (Partition{{0, 3}, {3, 8}}));  // one layer from where it starts
  // Three stages, boundaries moving by 4 and 2: each step moves each its share; no empty stage.
  const std::vector<Partition> three =
      partitions_between({{0, 1}, {1, 5}, {5, 8}}, {{0, 5}, {5, 7}, {7, 8}});
  ASSERT_FALSE(three.empty());
  EXPECT_EQ(three[0], (Partition{{0, 5}, {5, 7}, {7, 8}}));
  for (const Partition& p : three) {
    for (const LayerRange& r : p) EXPECT_LT(r.begin, r.end);
    EXPECT_EQ(p.back().end, 8u);
  }
  EXPECT_TRUE(partitions_between({{0, 2}, {2, 4}}, {{0, 2}, {2, 4}}).empty());
}

// Rank 0's plan (its planner is the only one called) reaches every rank, with its refusal; a
// planner that throws stops every rank with its message.
TEST(MemoryReplan, EveryRankGetsRankZerosPlan) {
  const Partition to{{0, 1}, {1, 3}};
  for (const bool fits : {true, false}) {
    LocalWorld world(3);
    std::mutex mu;
    std::vector<PartitionMemory> got(3);
    int calls = 0;
    run_local_ranks(world, [&](LocalCommunicator& comm) {
      MemoryPlanner planner = [&](const Partition& p) {
        std::lock_guard<std::mutex> lock(mu);
        ++calls;
        EXPECT_EQ(p, to);
        PartitionMemory m;
        m.feasible = fits;
        m.refusal = fits ? "" : "stage 0 needs 9 MiB";
        m.plan = MemoryPlan::uniform(3, MemoryPolicy::kKeep);
        m.plan.layers[1] = MemoryPolicy::kRecompute;
        m.plan.layers[2] = MemoryPolicy::kSwap;
        return m;
      };
      PartitionMemory m = share_memory_plan(&comm, comm.rank(), planner, to, 3);
      std::lock_guard<std::mutex> lock(mu);
      got[static_cast<size_t>(comm.rank())] = std::move(m);
    });
    EXPECT_EQ(calls, 1);
    for (const PartitionMemory& m : got) {
      EXPECT_EQ(m.feasible, fits);
      EXPECT_EQ(m.refusal, fits ? "" : "stage 0 needs 9 MiB");
      ASSERT_EQ(m.plan.layers.size(), 3u);
      EXPECT_EQ(m.plan.at(0), MemoryPolicy::kKeep);
      EXPECT_EQ(m.plan.at(1), MemoryPolicy::kRecompute);
      EXPECT_EQ(m.plan.at(2), MemoryPolicy::kSwap);
    }
  }
  LocalWorld world(2);
  std::mutex mu;
  int thrown = 0;
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    MemoryPlanner broken = [](const Partition&) -> PartitionMemory {
      STRATA_THROW() << "no profile";
    };
    try {
      share_memory_plan(&comm, comm.rank(), broken, to, 3);
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_NE(std::string(e.what()).find("no profile"), std::string::npos) << e.what();
      ++thrown;
    }
  });
  EXPECT_EQ(thrown, 2);
}

RepartitionInput input(std::vector<double> layers, Partition current, MemoryPlanner memory) {
  RepartitionInput in;
  in.step = 10;
  in.window_steps = 10;
  in.partition = std::move(current);
  in.layer_seconds = std::move(layers);
  in.stage_busy_seconds.assign(in.partition.size(), 1.0);
  in.memory = std::move(memory);
  return in;
}

// A stage fits `keep` layers keeping everything, up to `most` with each of its layers recomputed
// (overhead 0.5 each), no more.
MemoryPlanner toy_planner(size_t keep, size_t most, int* calls = nullptr) {
  return [=](const Partition& p) {
    if (calls != nullptr) ++*calls;
    PartitionMemory m;
    m.feasible = true;
    m.plan = MemoryPlan::uniform(p.back().end, MemoryPolicy::kKeep);
    m.layer_overhead.assign(p.back().end, 0.0);
    for (size_t s = 0; s < p.size(); ++s) {
      const size_t n = p[s].end - p[s].begin;
      if (n > most) {
        m.feasible = false;
        m.refusal = "stage " + std::to_string(s) + " of " + std::to_string(n) + " layers";
      } else if (n > keep) {
        for (size_t l = p[s].begin; l < p[s].end; ++l) {
          m.plan.layers[l] = MemoryPolicy::kRecompute;
          m.layer_overhead[l] = 0.5;
        }
      }
    }
    return m;
  };
}

TEST(VpipeRepartitionWithMemory, ScoresEachCandidateWithItsOwnPlanAndDropsWhatCannotFit) {
  auto policy = make_repartition_policy("vpipe", 0.05);
  const std::vector<double> layers{1, 1, 1, 1, 3, 3, 3, 3};
  // Without memory the best cut is 5 | 3 (slowest 9: VpipeRepartition.MovesLayers...). Stages of
  // up to 8 layers keeping everything: the same.
  const RepartitionDecision free =
      policy->propose(input(layers, {{0, 4}, {4, 8}}, toy_planner(8, 8)));
  EXPECT_TRUE(free.apply) << free.reason;
  EXPECT_EQ(free.partition, (Partition{{0, 5}, {5, 8}}));
  EXPECT_DOUBLE_EQ(free.predicted_cost, 9.0);
  EXPECT_TRUE(free.infeasible.empty());
  // A stage of 5 layers must recompute them all (x1.5): 5 | 3 costs 10.5, still better than 12.
  const RepartitionDecision recompute =
      policy->propose(input(layers, {{0, 4}, {4, 8}}, toy_planner(4, 8)));
  EXPECT_TRUE(recompute.apply) << recompute.reason;
  EXPECT_EQ(recompute.partition, (Partition{{0, 5}, {5, 8}}));
  EXPECT_DOUBLE_EQ(recompute.current_cost, 12.0);
  EXPECT_DOUBLE_EQ(recompute.predicted_cost, 10.5);
  // No stage may hold more than 4 layers: every move is dropped, nothing applied, and the record
  // names what was dropped.
  const RepartitionDecision none =
      policy->propose(input(layers, {{0, 4}, {4, 8}}, toy_planner(4, 4)));
  EXPECT_FALSE(none.apply) << none.reason;
  EXPECT_EQ(none.partition, (Partition{{0, 4}, {4, 8}}));
  ASSERT_FALSE(none.infeasible.empty());
  EXPECT_EQ(none.infeasible[0].partition, (Partition{{0, 5}, {5, 8}}));
  EXPECT_EQ(none.infeasible[0].why, "stage 0 of 5 layers");
  EXPECT_NE(none.reason.find("no plan fits --mem-limit"), std::string::npos) << none.reason;
}

// The measured times include the current plan's overhead (a replay counts in its layer's
// backward): the policy takes it out before the partitions are compared. Stage 1 recomputes
// (its 4 layers measure 1.5 each, base 1), stage 0 keeps (base 1). The measured times alone
// (4 against 6) move a layer to stage 0; with the plans, stage 0 would then recompute its 5
// layers (7.5 against 6), so nothing moves.
TEST(VpipeRepartitionWithMemory, TakesTheCurrentPlansOverheadOutOfTheMeasuredTimes) {
  auto policy = make_repartition_policy("vpipe", 0.05);
  MemoryPlanner planner = [](const Partition& p) {
    PartitionMemory m;
    m.feasible = true;
    m.plan = MemoryPlan::uniform(8, MemoryPolicy::kKeep);
    m.layer_overhead.assign(8, 0.0);
    // Stage 1 always recomputes; stage 0 recomputes once it holds more than 4 layers.
    for (size_t s = 0; s < p.size(); ++s) {
      if (s == 0 && p[s].end - p[s].begin <= 4) continue;
      for (size_t l = p[s].begin; l < p[s].end; ++l) m.layer_overhead[l] = 0.5;
    }
    return m;
  };
  const RepartitionDecision d =
      policy->propose(input({1, 1, 1, 1, 1.5, 1.5, 1.5, 1.5}, {{0, 4}, {4, 8}}, planner));
  EXPECT_FALSE(d.apply) << d.reason;
  EXPECT_DOUBLE_EQ(d.current_cost, 6.0);
  // Without the planner the measured times move a layer.
  EXPECT_TRUE(make_repartition_policy("vpipe", 0.05)
                  ->propose(input({1, 1, 1, 1, 1.5, 1.5, 1.5, 1.5}, {{0, 4}, {4, 8}}, {}))
                  .apply);
}

TEST(RepartitionLoop, SwappedLayersAreRefusedOnlyUnderAsynchronousSchedules) {
  RepartitionConfig on;
  on.policy = "vpipe";
  RepartitionLoop::check(on, true, false, true);  // synchronous: swap is planned again per move
  try {
    RepartitionLoop::check(on, false, true, true);
    ADD_FAILURE() << "async-1f1b with swapped layers was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("swapped layers"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::parallel
