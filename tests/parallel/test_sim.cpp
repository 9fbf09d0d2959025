// The simulator (parallel/sim): closed forms reproduced exactly (pipeline bubble and makespan of
// balanced stages, ring and tree all-reduce, the swap window of vPIPE Eq. 2, recompute's extra
// forward), the instruction order equal to the schedule's programs, the checker's makespan for
// every kind, data-parallel overlap and delay, tied weights, deduplicated groups equal to the
// full simulation, and errors for layouts a cluster cannot hold.
#include "parallel/sim/simulator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/check.h"
#include "parallel/sim/collectives.h"

namespace strata::parallel::sim {
namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B,
                                   ScheduleKind::kAsync1F1B};

// `layers` identical layers: forward `f`, backward `b` seconds per micro-batch (fixed costs),
// `param_bytes` each, `act` bytes per sample of output and own tape.
CostModel uniform_costs(size_t layers, double f, double b, double param_bytes = 0.0,
                        double act = 0.0) {
  CostModel cm;
  for (size_t l = 0; l < layers; ++l) {
    LayerModel m;
    m.work.name = "l" + std::to_string(l);
    m.work.param_bytes = param_bytes;
    m.work.input_bytes = act;
    m.work.output_bytes = act;
    m.work.own_saved = {0.0, act};
    m.work.saves_input = true;
    m.forward_s = {f, 0.0};
    m.backward_s = {b, 0.0};
    cm.layers.push_back(m);
  }
  return cm;
}

// Free links: no latency, no bandwidth limit.
Cluster free_cluster(int gpus, int per_node = 8) {
  DeviceSpec d = builtin_device("h100");
  Cluster c = make_cluster(d, gpus, per_node);
  for (LinkSpec* l : {&c.intra, &c.inter, &c.local}) {
    l->latency_s = 0.0;
    l->bandwidth = 1e300;
  }
  return c;
}

Partition even(size_t layers, int stages) { return uniform_partition(layers, stages); }

SimConfig config(ScheduleKind kind, int stages, int64_t m, size_t layers, int groups = 1) {
  SimConfig c;
  c.schedule = kind;
  c.stages = stages;
  c.groups = groups;
  c.micro_batches = m;
  c.micro_batch_rows = 4;
  c.partition = even(layers, stages);
  return c;
}

TEST(Sim, BubbleAndMakespanOfBalancedStagesAreTheClosedForms) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int S : {1, 2, 3, 4, 8}) {
      for (int64_t M : {1, 2, 3, 4, 8, 16}) {
        const double f = 0.5, b = 1.0;  // per stage: two layers of 0.25 / 0.5
        const CostModel cm = uniform_costs(2 * S, f / 2, b / 2);
        const SimResult r = simulate(config(kind, S, M, 2 * S), cm, free_cluster(S));
        const double makespan = (M + S - 1) * (f + b);
        EXPECT_DOUBLE_EQ(r.step_time_s, makespan)
            << schedule_name(kind) << " S=" << S << " M=" << M;
        EXPECT_NEAR(r.bubble, theoretical_bubble_fraction(kind, S, M), 1e-12)
            << schedule_name(kind) << " S=" << S << " M=" << M;
        EXPECT_NEAR(r.bubble, (S - 1.0) / (M + S - 1.0), 1e-12);
      }
    }
  }
}

TEST(Sim, MakespanEqualsTheCheckersForEveryKind) {
  for (ScheduleKind kind : kKinds) {
    for (int S : {1, 2, 3, 5}) {
      for (int64_t M : {1, 2, 4, 7}) {
        const CostModel cm = uniform_costs(S, 1.0, 2.0);
        const SimResult r = simulate(config(kind, S, M, S), cm, free_cluster(S));
        const ScheduleCheck check = check_schedule(make_schedule(kind, S, M));
        ASSERT_TRUE(check.ok) << check.error;
        EXPECT_DOUBLE_EQ(r.step_time_s, check.makespan)
            << schedule_name(kind) << " S=" << S << " M=" << M;
        EXPECT_NEAR(r.bubble, check.bubble_fraction, 1e-12);
        for (int s = 0; s < S; ++s) {
          EXPECT_EQ(r.stages[s].max_in_flight, check.max_in_flight[s]);
        }
      }
    }
  }
}

TEST(Sim, ExecutesEveryRanksProgramInTheSchedulesOrder) {
  for (ScheduleKind kind : kKinds) {
    SimConfig c = config(kind, 3, 5, 6, 2);
    c.record_timeline = true;
    c.steps = is_synchronous(kind) ? 2 : 1;
    const CostModel cm = uniform_costs(6, 0.1, 0.2, 1024.0);
    const SimResult r = simulate(c, cm, free_cluster(6));
    ASSERT_EQ(r.executed.size(), 6u);
    for (int rank = 0; rank < 6; ++rank) {
      std::vector<SimInstruction> expected;
      for (int step = 0; step < c.steps; ++step) {
        const Schedule sc = make_schedule(kind, 3, 5, step);
        for (const Instruction& in : sc.programs[rank % 3]) {
          expected.push_back({to_sim_op(in.op), in.micro_batch});
        }
        expected.push_back({SimOp::kStepEnd, -1});
      }
      ASSERT_EQ(r.executed[rank].size(), expected.size())
          << schedule_name(kind) << " rank " << rank;
      for (size_t i = 0; i < expected.size(); ++i) {
        EXPECT_EQ(r.executed[rank][i].op, expected[i].op) << "rank " << rank << " at " << i;
        EXPECT_EQ(r.executed[rank][i].micro_batch, expected[i].micro_batch);
      }
    }
  }
}

TEST(Sim, RingAllReduceIsTheClosedForm) {
  Cluster c = make_cluster(builtin_device("h100"), 64, 8);
  const double bytes = 100e6;
  for (int n : {2, 3, 8}) {  // one node: NVLink
    std::vector<int> ranks;
    for (int i = 0; i < n; ++i) ranks.push_back(i);
    const double expected =
        2.0 * (n - 1) / n * bytes / c.intra.bandwidth + 2.0 * (n - 1) * c.intra.latency_s;
    EXPECT_DOUBLE_EQ(all_reduce_seconds(AllReduceAlgorithm::kRing, c, ranks, bytes), expected);
  }
  // Ranks 0, 8, 16, ...: one per node, the ring crosses InfiniBand.
  std::vector<int> ranks;
  for (int i = 0; i < 8; ++i) ranks.push_back(8 * i);
  const double expected = 2.0 * 7 / 8 * bytes / c.inter.bandwidth + 2.0 * 7 * c.inter.latency_s;
  EXPECT_DOUBLE_EQ(all_reduce_seconds(AllReduceAlgorithm::kRing, c, ranks, bytes), expected);
  const double tree = 2.0 * bytes / c.inter.bandwidth + 2.0 * 3 * c.inter.latency_s;
  EXPECT_DOUBLE_EQ(all_reduce_seconds(AllReduceAlgorithm::kTree, c, ranks, bytes), tree);
  EXPECT_EQ(all_reduce_seconds(AllReduceAlgorithm::kRing, c, {5}, bytes), 0.0);
}

TEST(Sim, DataParallelAllReduceAddsTheRingTimeAfterTheLastBackward) {
  // G groups of one stage, one micro-batch, one bucket: the all-reduce starts when the backward
  // ends and the optimizer step waits for it.
  for (int G : {2, 4, 16}) {
    const double bytes = 64e6;
    const CostModel cm = uniform_costs(1, 0.01, 0.02, bytes);
    SimConfig cfg = config(ScheduleKind::k1F1B, 1, 1, 1, G);
    cfg.grad_sync.bucket_mb = 0;  // one bucket
    const Cluster cluster = make_cluster(builtin_device("h100"), G, 8);
    std::vector<int> members;
    for (int g = 0; g < G; ++g) members.push_back(g);
    const double ring = all_reduce_seconds(AllReduceAlgorithm::kRing, cluster, members, bytes);
    const double barrier = 2.0 * std::ceil(std::log2(G)) *
                           (cluster.nodes() > 1 ? cluster.inter : cluster.intra).latency_s;
    const SimResult r = simulate(cfg, cm, cluster);
    EXPECT_DOUBLE_EQ(r.step_time_s, 0.01 + 0.02 + ring + barrier) << "G=" << G;
    EXPECT_DOUBLE_EQ(r.stages[0].dp_seconds, ring);
    EXPECT_NEAR(r.stages[0].dp_exposed_s, ring, 1e-15);
  }
}

TEST(Sim, OverlapHidesTheBucketsOfLaterLayersBehindEarlierBackwards) {
  // Two layers of 40 MB on one stage, buckets of 40 MiB: the last layer's bucket runs during
  // the first layer's backward.
  const double bytes = 40e6;
  const CostModel cm = uniform_costs(2, 0.001, 0.05, bytes);
  SimConfig cfg = config(ScheduleKind::k1F1B, 1, 1, 2, 2);
  cfg.grad_sync.bucket_mb = 40;
  const Cluster cluster = free_cluster(2);
  Cluster slow = cluster;
  slow.intra.bandwidth = 1e9;  // 40 ms per bucket over 2 ranks (2 x 1/2 x 40 MB / 1 GB/s)
  const SimResult on = simulate(cfg, cm, slow);
  cfg.grad_sync.overlap = false;
  const SimResult off = simulate(cfg, cm, slow);
  const double bucket = 0.04;
  EXPECT_DOUBLE_EQ(off.step_time_s, 0.002 + 0.1 + 2 * bucket);
  // On: bucket 0 starts at 0.002 + 0.05 and overlaps the second backward (0.05 > 0.04).
  EXPECT_DOUBLE_EQ(on.step_time_s, 0.002 + 0.1 + bucket);
  EXPECT_DOUBLE_EQ(on.stages[0].dp_exposed_s, bucket);
}

TEST(Sim, DelayedGradientsTakeTheAllReduceOffTheStep) {
  const double bytes = 64e6;
  const CostModel cm = uniform_costs(1, 0.01, 0.02, bytes);
  SimConfig cfg = config(ScheduleKind::k1F1B, 1, 1, 1, 2);
  Cluster slow = free_cluster(2);
  slow.intra.bandwidth = 2e9;  // 32 ms: longer than a step's compute (30 ms)
  const SimResult sync = simulate(cfg, cm, slow);
  cfg.grad_sync.delay = 2;
  const SimResult delayed = simulate(cfg, cm, slow);
  EXPECT_DOUBLE_EQ(sync.step_time_s, 0.03 + 0.032);
  // With D = 2 an all-reduce has two steps (60 ms) to finish: never waited for.
  EXPECT_DOUBLE_EQ(delayed.step_time_s, 0.03);
  EXPECT_EQ(delayed.stages[0].dp_exposed_s, 0.0);
}

TEST(Sim, RecomputeAddsTheForwardToTheBackward) {
  const CostModel cm = uniform_costs(4, 0.1, 0.2, 0.0, 1000.0);
  SimConfig cfg = config(ScheduleKind::kGPipe, 1, 1, 4);
  const SimResult keep = simulate(cfg, cm, free_cluster(1));
  cfg.policy.assign(4, MemoryPolicy::kRecompute);
  const SimResult rec = simulate(cfg, cm, free_cluster(1));
  EXPECT_DOUBLE_EQ(keep.step_time_s, 0.4 + 0.8);
  EXPECT_DOUBLE_EQ(rec.step_time_s, 0.4 + 0.8 + 0.4);
  // Recompute keeps only the stage's input: 4 rows x 1000 bytes, not the 4 layers' tapes.
  EXPECT_DOUBLE_EQ(rec.stages[0].micro_batch.keep, 4 * 1000.0);
  EXPECT_DOUBLE_EQ(keep.stages[0].micro_batch.keep,
                   4 * 1000.0 + 4 * (4 * 1000.0 + 4 * 1000.0) - 4 * 1000.0);
}

TEST(Sim, SwapIsFreeInsideItsWindowAndExposedBeyondIt) {
  // One stage, gpipe, M = 2: SwapIn(0) is issued when Forward(1) starts (one compute
  // instruction ahead), after SwapOut(0). Transfer x each way; the window is Forward(1)'s f:
  // Backward(0) waits max(0, 2x - f) (vPIPE Eq. 2's exposed swap time).
  const double f = 0.1;
  for (double x : {0.01, 0.05, 0.08, 0.2}) {
    CostModel cm = uniform_costs(1, f, 2 * f, 0.0, 1e6);
    SimConfig cfg = config(ScheduleKind::kGPipe, 1, 2, 1);
    cfg.policy.assign(1, MemoryPolicy::kSwap);
    Cluster cluster = free_cluster(1);
    const double swapped = cfg.micro_batch_rows * 2e6;  // own tape + the saved input
    cluster.device.host_bandwidth = swapped / x;
    const SimResult r = simulate(cfg, cm, cluster);
    const double exposed = std::max(0.0, 2 * x - f);
    EXPECT_NEAR(r.stages[0].swap_exposed_s, exposed, 1e-12) << "x=" << x;
    EXPECT_NEAR(r.step_time_s, 2 * f + 2 * 2 * f + exposed + std::max(0.0, x - 2 * f), 1e-12)
        << "x=" << x;
  }
}

TEST(Sim, TiedParametersSplitBetweenStagesAreAllReducedBeforeTheUpdate) {
  CostModel cm = uniform_costs(4, 0.01, 0.02);
  cm.layers[0].work.param_bytes = 1e8;
  cm.layers[3].work.param_bytes = 1e8;
  cm.layers[3].work.tied_bytes = 1e8;
  cm.layers[3].work.tied_owner = 0;
  Cluster cluster = free_cluster(2);
  cluster.intra.bandwidth = 1e10;  // 10 ms for 100 MB over 2 ranks (2 x 1/2 x 1e8 / 1e10)
  const SimResult split = simulate(config(ScheduleKind::kGPipe, 2, 1, 4), cm, cluster);
  const SimResult one = simulate(config(ScheduleKind::kGPipe, 1, 1, 4), cm, cluster);
  EXPECT_DOUBLE_EQ(split.step_time_s, 4 * 0.01 + 4 * 0.02 + 0.01);
  EXPECT_NEAR(split.stages[0].tied_exposed_s, 0.01, 1e-15);
  EXPECT_DOUBLE_EQ(one.step_time_s, 4 * 0.01 + 4 * 0.02);
  // One stage holds the owner and its alias: one copy of the weight.
  EXPECT_DOUBLE_EQ(one.stages[0].static_memory.params, 1e8);
  EXPECT_DOUBLE_EQ(split.stages[1].static_memory.params, 1e8);
}

TEST(Sim, DedupedGroupsGiveTheFullSimulationsTimes) {
  // 6 stages on nodes of 4 GPUs: groups straddle nodes differently.
  const CostModel cm = uniform_costs(12, 0.002, 0.004, 4e6, 3e5);
  const Cluster cluster = make_cluster(builtin_device("a100"), 48, 4);
  for (ScheduleKind kind : kKinds) {
    SimConfig cfg = config(kind, 6, 8, 12, 8);
    const SimResult fast = simulate(cfg, cm, cluster);
    cfg.dedupe_groups = false;
    const SimResult full = simulate(cfg, cm, cluster);
    EXPECT_LT(fast.simulated_groups, full.simulated_groups);
    EXPECT_EQ(full.simulated_groups, 8);
    EXPECT_DOUBLE_EQ(fast.step_time_s, full.step_time_s) << schedule_name(kind);
    EXPECT_DOUBLE_EQ(fast.bubble, full.bubble);
    EXPECT_DOUBLE_EQ(fast.peak_bytes, full.peak_bytes);
  }
}

TEST(Sim, RefusesLayoutsTheClusterCannotHold) {
  const CostModel cm = uniform_costs(4, 0.1, 0.2);
  try {
    simulate(config(ScheduleKind::k1F1B, 4, 2, 4, 4), cm, free_cluster(8));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 16 ranks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--gpus 8"), std::string::npos) << e.what();
  }
  EXPECT_THROW(builtin_device("v100"), Error);
  try {
    parse_link_class("token-ring");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nvlink, pcie, infiniband"), std::string::npos);
  }
  SimConfig bad = config(ScheduleKind::k1F1B, 2, 2, 4);
  bad.partition = {{0, 1}, {2, 4}};
  EXPECT_THROW(simulate(bad, cm, free_cluster(2)), Error);
}

}  // namespace
}  // namespace strata::parallel::sim
