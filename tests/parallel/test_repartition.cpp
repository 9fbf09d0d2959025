// --repartition: vPIPE's policy (Algorithm 3 on measured per-layer times, applied only when the
// predicted slowest stage improves by the threshold) and the loop's protocol (statistics on the
// step's metrics sum, rank 0's decision on the next one, the move on the step after), with the
// world's sums made by hand for two and four ranks.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <vector>

#include "graph/layers.h"
#include "graph/model.h"
#include "parallel/repartition_loop.h"
#include "parallel/vpipe/repartition.h"
#include "testing/testing.h"

namespace strata::parallel {
namespace {

RepartitionInput input(std::vector<double> layers, Partition current) {
  RepartitionInput in;
  in.step = 10;
  in.window_steps = 10;
  in.partition = std::move(current);
  in.layer_seconds = std::move(layers);
  for (const LayerRange& r : in.partition) {
    double t = 0;
    for (size_t l = r.begin; l < r.end; ++l) t += in.layer_seconds[l];
    in.stage_busy_seconds.push_back(t);
  }
  return in;
}

TEST(VpipeRepartition, MovesLayersOffTheSlowestStage) {
  auto policy = make_repartition_policy("vpipe", 0.05);
  EXPECT_STREQ(policy->name(), "vpipe");
  // Stage 1's layers take 3x: its slowest stage is 12 against 4.
  const RepartitionInput in = input({1, 1, 1, 1, 3, 3, 3, 3}, {{0, 4}, {4, 8}});
  const RepartitionDecision d = policy->propose(in);
  EXPECT_TRUE(d.apply) << d.reason;
  EXPECT_DOUBLE_EQ(d.current_cost, 12.0);
  EXPECT_DOUBLE_EQ(d.measured_slowest, 12.0);
  ASSERT_EQ(d.partition.size(), 2u);
  EXPECT_GT(d.partition[0].end, 4u);  // layers moved from stage 1 to stage 0
  EXPECT_EQ(d.partition[0].end, d.partition[1].begin);
  EXPECT_EQ(d.partition[1].end, 8u);
  EXPECT_DOUBLE_EQ(d.predicted_cost, slowest_stage_seconds(d.partition, in.layer_seconds));
  EXPECT_DOUBLE_EQ(d.predicted_cost, 9.0);  // the best cut: 1+1+1+1+3 | 3+3+3
  EXPECT_NEAR(d.gain(), 0.25, 1e-12);
  // Deterministic.
  const RepartitionDecision again = make_repartition_policy("vpipe", 0.05)->propose(in);
  EXPECT_EQ(again.partition, d.partition);
}

TEST(VpipeRepartition, KeepsABalancedPartitionAndHonoursTheThreshold) {
  auto policy = make_repartition_policy("vpipe", 0.05);
  const RepartitionDecision balanced = policy->propose(input({1, 1, 1, 1}, {{0, 2}, {2, 4}}));
  EXPECT_FALSE(balanced.apply);
  EXPECT_EQ(balanced.partition, (Partition{{0, 2}, {2, 4}}));
  // A 25% gain under a 30% threshold: proposed, not applied.
  const RepartitionDecision small =
      make_repartition_policy("vpipe", 0.3)
          ->propose(input({1, 1, 1, 1, 3, 3, 3, 3}, {{0, 4}, {4, 8}}));
  EXPECT_FALSE(small.apply);
  EXPECT_NE(small.reason.find("threshold"), std::string::npos) << small.reason;
  // Four stages, one slow in the middle.
  const RepartitionDecision four =
      policy->propose(input({1, 1, 1, 1, 4, 4, 1, 1}, {{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_TRUE(four.apply) << four.reason;
  EXPECT_LT(four.predicted_cost, 8.0);
  ASSERT_EQ(four.partition.size(), 4u);
  for (size_t s = 0; s < 4; ++s) EXPECT_LT(four.partition[s].begin, four.partition[s].end);
}

TEST(VpipeRepartition, RefusesUnknownPoliciesAndThresholds) {
  EXPECT_THROW(make_repartition_policy("dynpipe-x", 0.05), Error);
  EXPECT_THROW(make_repartition_policy("vpipe", 1.0), Error);
  EXPECT_THROW(make_repartition_policy("vpipe", -0.1), Error);
}

// The loop on S ranks of one group, the world's sum made here: statistics after step `every`,
// the decision on the next step, every rank due to move before the step after.
TEST(RepartitionLoop, EveryRankLearnsRankZerosDecisionAndMovesTogether) {
  const std::vector<std::string> names{"a", "b", "c", "d", "e", "f", "g", "h"};
  for (int S : {2, 4}) {
    SCOPED_TRACE(S);
    const Partition start = uniform_partition(names.size(), S);
    RepartitionLoop::Ranges ranges;
    for (const LayerRange& r : start) ranges.push_back({r.begin, r.end});
    RepartitionConfig config;
    config.policy = "vpipe";
    config.every = 4;
    std::vector<RepartitionLoop> loops;
    for (int r = 0; r < S; ++r) loops.emplace_back(config, names, r, r, S, 1, 20);
    // The last stage is slow: its layers take 5 ms per step, the others 1 ms.
    std::vector<StageMemoryStats> memory(S);
    std::vector<RepartitionRecord> records;
    std::vector<std::optional<Partition>> due(S);
    for (int64_t step = 0; step < 6; ++step) {
      std::vector<std::vector<double>> parts;
      for (int r = 0; r < S; ++r) {
        StageMemoryStats& m = memory[r];
        m.first_layer = start[r].begin;
        const size_t n = start[r].end - start[r].begin;
        m.layer_forward_seconds.resize(n);
        m.layer_backward_seconds.resize(n);
        for (size_t i = 0; i < n; ++i) {
          m.layer_forward_seconds[i] += r == S - 1 ? 0.002 : 0.0004;
          m.layer_backward_seconds[i] += r == S - 1 ? 0.003 : 0.0006;
        }
        parts.push_back(loops[r].contribution(step, m, 0.001, ranges));
      }
      for (int r = 1; r < S; ++r) ASSERT_EQ(parts[r].size(), parts[0].size()) << step;
      std::vector<double> sum(parts[0].size(), 0.0);
      for (const auto& p : parts) {
        for (size_t i = 0; i < p.size(); ++i) sum[i] += p[i];
      }
      EXPECT_EQ(sum.empty(), step != 3 && step != 4) << step;
      for (int r = 0; r < S; ++r) {
        const auto rec = loops[r].absorb(step, sum, ranges);
        if (rec) {
          EXPECT_EQ(r, 0);
          records.push_back(*rec);
        }
        if (step < 4) {
          EXPECT_FALSE(loops[r].due(step + 1)) << step;
        }
      }
    }
    ASSERT_EQ(records.size(), 1u);
    const RepartitionRecord& rec = records[0];
    EXPECT_EQ(rec.step, 4);
    EXPECT_EQ(rec.apply_step, 5);
    EXPECT_TRUE(rec.decision.apply) << rec.decision.reason;
    EXPECT_NEAR(rec.decision.measured_slowest, 0.001, 1e-12);
    // The policy saw per-step layer times: 5 ms for the slow stage's layers.
    EXPECT_NEAR(rec.decision.current_cost, 0.005 * (names.size() / S), 1e-9);
    for (int r = 0; r < S; ++r) {
      const auto p = loops[r].due(5);
      ASSERT_TRUE(p) << "rank " << r;
      ASSERT_EQ(p->size(), static_cast<size_t>(S));
      for (int s = 0; s < S; ++s) {
        EXPECT_EQ((*p)[s].first, rec.decision.partition[s].begin);
        EXPECT_EQ((*p)[s].second, rec.decision.partition[s].end);
      }
      EXPECT_LT((*p)[S - 1].second - (*p)[S - 1].first, start[S - 1].end - start[S - 1].begin);
      loops[r].migrated();
      EXPECT_FALSE(loops[r].due(5));
    }
  }
}

// The world's sum of a 3-step window's contributions: per-layer seconds and per-stage busy
// seconds, the window's length, then the layers' output and activation bytes (DynPipe's
// features; none here).
std::vector<double> sums(const std::vector<double>& layers, const std::vector<double>& busy) {
  std::vector<double> v;
  for (double x : layers) v.push_back(3 * x);
  for (double x : busy) v.push_back(3 * x);
  v.push_back(3);
  v.resize(v.size() + 2 * layers.size(), 0.0);
  return v;
}

// Rank 0's decisions from hand-made sums (4 layers, 2 stages, windows of 3 steps): a move that
// measures slower is undone at the next decision, and never applied again.
TEST(RepartitionLoop, AMoveThatMeasuresSlowerIsUndoneAndNotTriedAgain) {
  RepartitionConfig config;
  config.policy = "vpipe";
  config.every = 4;
  RepartitionLoop loop(config, {"a", "b", "c", "d"}, 0, 0, 2, 1, 40);
  const RepartitionLoop::Ranges start{{0, 2}, {2, 4}}, moved{{0, 3}, {3, 4}};
  auto first = loop.absorb(3, sums({1, 1, 3, 3}, {2, 6}), start);
  ASSERT_TRUE(first && first->decision.apply) << (first ? first->decision.reason : "");
  EXPECT_EQ(first->proposed, "a-c,d");
  EXPECT_FALSE(loop.absorb(4, {1, 3}, start));
  ASSERT_TRUE(loop.due(5));
  loop.migrated();
  // Measured slower after the move (7 > 6): back to the start.
  auto back = loop.absorb(7, sums({1, 1, 3, 3}, {7, 3}), moved);
  ASSERT_TRUE(back && back->decision.apply);
  EXPECT_EQ(back->proposed, "a-b,c-d");
  EXPECT_NE(back->decision.reason.find("moving back"), std::string::npos) << back->decision.reason;
  EXPECT_FALSE(loop.absorb(8, {1, 2}, moved));
  ASSERT_TRUE(loop.due(9));
  EXPECT_EQ(*loop.due(9), start);
  loop.migrated();
  // The policy proposes the same move again: kept.
  auto again = loop.absorb(11, sums({1, 1, 3, 3}, {2, 6}), start);
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->decision.apply);
  EXPECT_NE(again->decision.reason.find("measured slower"), std::string::npos)
      << again->decision.reason;
  EXPECT_FALSE(loop.absorb(12, {0, 0}, start));
  EXPECT_FALSE(loop.due(13));
}

// An asynchronous run's apply-step function (parallel/trainer_layout.cpp) names where a move goes:
// the record's apply_step, and due() and learned() on that step; no decision while that move has
// not gone; where the function names none, the move is not applied.
TEST(RepartitionLoop, AMoveGoesBeforeTheStepTheApplyStepFunctionNames) {
  RepartitionConfig config;
  config.policy = "vpipe";
  config.every = 2;
  RepartitionLoop loop(config, {"a", "b", "c", "d"}, 0, 0, 2, 1, 40);
  std::vector<int64_t> asked;
  loop.set_apply_step([&](int64_t earliest, const Partition& from, const Partition& to) {
    asked.push_back(earliest);
    EXPECT_EQ(from, (Partition{{0, 2}, {2, 4}}));
    EXPECT_NE(to, from);
    return earliest + 1;
  });
  const RepartitionLoop::Ranges start{{0, 2}, {2, 4}};
  auto rec = loop.absorb(3, sums({1, 1, 3, 3}, {2, 6}), start);
  ASSERT_TRUE(rec && rec->decision.apply) << (rec ? rec->decision.reason : "");
  EXPECT_EQ(rec->apply_step, 6);
  EXPECT_FALSE(loop.absorb(4, {1, 3}, start));
  EXPECT_EQ(asked, (std::vector<int64_t>{5, 5}));  // when deciding, and when told
  EXPECT_EQ(loop.learned(4), std::optional<int64_t>(6));
  EXPECT_FALSE(loop.learned(5));
  EXPECT_FALSE(loop.due(5));
  ASSERT_TRUE(loop.due(6));
  // The next window ends before the move went: no decision.
  auto waiting = loop.absorb(5, sums({1, 1, 3, 3}, {2, 6}), start);
  ASSERT_TRUE(waiting);
  EXPECT_FALSE(waiting->decision.apply);
  EXPECT_NE(waiting->decision.reason.find("before step 6"), std::string::npos)
      << waiting->decision.reason;
  loop.migrated();
  // A function that finds no step: the move is not applied, nothing is due.
  RepartitionLoop late(config, {"a", "b", "c", "d"}, 0, 0, 2, 1, 40);
  late.set_apply_step([](int64_t, const Partition&, const Partition&) { return int64_t{-1}; });
  auto kept = late.absorb(3, sums({1, 1, 3, 3}, {2, 6}), start);
  ASSERT_TRUE(kept);
  EXPECT_FALSE(kept->decision.apply);
  EXPECT_EQ(kept->apply_step, 0);
  EXPECT_NE(kept->decision.reason.find("drain"), std::string::npos) << kept->decision.reason;
  EXPECT_FALSE(late.absorb(4, {0, 0}, start));
  for (int64_t step = 4; step < 8; ++step) EXPECT_FALSE(late.due(step)) << step;
}

// The undo rule under noise (the default margin, 5%): a move measured slower by less than the
// margin stays; a partition rejected once is tried again when the layout it was rejected from
// measures more than 4 margins above its measurement then (here a slowdown began), not after
// noise. The old rule (any slower window undoes, a rejection lasts forever) fails both halves.
TEST(RepartitionLoop, NoiseBelowTheMarginNeitherUndoesNorLocksOutAMove) {
  RepartitionConfig config;
  config.policy = "vpipe";
  config.every = 4;
  ASSERT_DOUBLE_EQ(config.threshold, 0.05);
  const RepartitionLoop::Ranges start{{0, 2}, {2, 4}}, moved{{0, 3}, {3, 4}};
  {
    SCOPED_TRACE("a move measured 3% slower once stays");
    RepartitionLoop loop(config, {"a", "b", "c", "d"}, 0, 0, 2, 1, 40);
    auto first = loop.absorb(3, sums({1, 1, 3, 3}, {2, 6}), start);
    ASSERT_TRUE(first && first->decision.apply);
    EXPECT_FALSE(loop.absorb(4, {1, 3}, start));
    loop.migrated();
    auto after = loop.absorb(7, sums({1, 1, 3, 3}, {6.18, 3}), moved);
    ASSERT_TRUE(after);
    EXPECT_FALSE(after->decision.apply) << after->decision.reason;
    EXPECT_EQ(after->decision.reason.find("moving back"), std::string::npos)
        << after->decision.reason;
  }
  {
    SCOPED_TRACE("a rejected move is tried again once the measurements change");
    RepartitionLoop loop(config, {"a", "b", "c", "d"}, 0, 0, 2, 1, 40);
    ASSERT_TRUE(loop.absorb(3, sums({1, 1, 3, 3}, {2, 6}), start)->decision.apply);
    EXPECT_FALSE(loop.absorb(4, {1, 3}, start));
    loop.migrated();
    auto back = loop.absorb(7, sums({1, 1, 3, 3}, {7, 3}), moved);
    ASSERT_TRUE(back && back->decision.apply);
    EXPECT_NE(back->decision.reason.find("moving back"), std::string::npos);
    EXPECT_FALSE(loop.absorb(8, {1, 2}, moved));
    loop.migrated();
    // Noise: 10% below or above the 6 ms it measured (the retry margin is 4 x 5%): still kept,
    // so the loop does not oscillate between the two layouts.
    int64_t step = 11;
    for (double slowest : {5.4, 6.6}) {
      auto kept = loop.absorb(step, sums({1, 1, slowest / 2, slowest / 2}, {2, slowest}), start);
      ASSERT_TRUE(kept);
      EXPECT_FALSE(kept->decision.apply) << slowest << ": " << kept->decision.reason;
      EXPECT_NE(kept->decision.reason.find("measured slower"), std::string::npos)
          << kept->decision.reason;
      EXPECT_FALSE(loop.absorb(step + 1, {0, 0}, start));
      step += 4;
    }
    // Stage 1 slowed 1.5x: the start now measures 9, the same move predicts 6.5: applied.
    auto again = loop.absorb(step, sums({1, 1, 4.5, 4.5}, {2, 9}), start);
    ASSERT_TRUE(again);
    EXPECT_TRUE(again->decision.apply) << again->decision.reason;
    EXPECT_EQ(again->proposed, "a-c,d");
    EXPECT_NE(again->decision.reason.find("tried again"), std::string::npos)
        << again->decision.reason;
  }
}

TEST(RepartitionLoop, OffDoesNothingAndUnsupportedRunsAreRefused) {
  RepartitionLoop loop(RepartitionConfig{}, {"a", "b"}, 0, 0, 2, 1, 10);
  EXPECT_FALSE(loop.active());
  StageMemoryStats m;
  for (int64_t step = 0; step < 10; ++step) {
    EXPECT_TRUE(loop.contribution(step, m, 0.1, {{0, 1}, {1, 2}}).empty());
  }
  RepartitionLoop::check(RepartitionConfig{}, false, false, true);  // off: nothing refused
  RepartitionConfig on;
  on.policy = "vpipe";
  EXPECT_THROW(RepartitionLoop::check(on, false, false, false), Error);
  EXPECT_THROW(RepartitionLoop::check(on, false, true, true), Error);  // async: no swap
  RepartitionLoop::check(on, false, true, false);
  RepartitionLoop::check(on, false, false, false, true);  // async-1f1b moving live
}

// A live move keeps the executor: migrated(&now) starts the window from its layer times then, so
// the next window measures only its own steps (from zero, it would add every step before).
TEST(RepartitionLoop, AKeptExecutorsLayerTimesGoOnFromTheMove) {
  RepartitionConfig config;
  config.policy = "vpipe";
  config.every = 4;
  for (bool kept : {true, false}) {
    SCOPED_TRACE(kept ? "kept" : "from zero");
    RepartitionLoop loop(config, {"a", "b"}, 0, 0, 2, 1, 40);
    StageMemoryStats m;
    m.first_layer = 0;
    m.layer_forward_seconds = {0.0, 0.0};
    m.layer_backward_seconds = {0.0, 0.0};
    m.layer_output_bytes = {0.0, 0.0};
    m.layer_activation_bytes = {0.0, 0.0};
    for (int64_t step = 0; step < 2; ++step) {
      m.layer_forward_seconds[0] += 1.0;  // 1 s a step in layer a
      loop.contribution(step, m, 1.0, {{0, 1}, {1, 2}});
    }
    loop.migrated(kept ? &m : nullptr);
    std::vector<double> window;
    for (int64_t step = 2; step < 4; ++step) {
      m.layer_forward_seconds[0] += 1.0;
      window = loop.contribution(step, m, 1.0, {{0, 1}, {1, 2}});
    }
    ASSERT_FALSE(window.empty());  // the window ends after step 4
    EXPECT_DOUBLE_EQ(window[0], kept ? 2.0 : 4.0);
  }
}

// A slowdown that begins on the window's last step: the window measures the slowed stage at a
// mean of its steps, the monitor's latest interval (a sample per step here) at the slowed step's
// time. The move is judged against the latter, so the layout it leads to, slower than the
// window's mean (the slowdown goes on) but faster than the slowed layout, stays; judged against
// the window's mean it was undone ("moving back"), which undid dynpipe's moves made on fresh
// counters at the first decision after a load began (tools/bench/dynpipe_recovery.py).
TEST(RepartitionLoop, AMoveIsJudgedAgainstTheSlowdownThatBeganLateInTheWindow) {
  const std::vector<std::string> names{"l0", "l1", "l2", "l3", "l4", "l5", "l6", "l7"};
  graph::Model model("eight", Shape{4});
  for (const std::string& n : names) model.add(std::make_unique<graph::LinearLayer>(n, 4, 4, true));
  RepartitionConfig config;
  config.policy = "vpipe";
  config.every = 4;
  config.monitor_interval_ms = 1e-6;  // a sample at every step end
  std::vector<RepartitionLoop> loops;
  for (int r = 0; r < 2; ++r) loops.emplace_back(config, names, r, r, 2, 1, 40);
  for (RepartitionLoop& loop : loops) loop.describe(model, 2, 8.0);
  RepartitionLoop::Ranges ranges = {{0, 4}, {4, 8}};
  std::vector<StageMemoryStats> memory(2);
  const auto reset = [&] {
    for (int r = 0; r < 2; ++r) {
      memory[r] = StageMemoryStats{};
      memory[r].first_layer = ranges[r].first;
      memory[r].layer_forward_seconds.assign(ranges[r].second - ranges[r].first, 0.0);
      memory[r].layer_backward_seconds.assign(ranges[r].second - ranges[r].first, 0.0);
    }
  };
  reset();
  std::vector<RepartitionRecord> records;
  for (int64_t step = 0; step < 8; ++step) {
    if (loops[0].due(step)) {
      ranges = *loops[0].due(step);
      for (RepartitionLoop& loop : loops) loop.migrated();
      reset();
    }
    // Each layer 1 ms a step; rank 1's 3 ms from step 3 on (its layers, wherever they came from).
    std::vector<double> busy(2, 0.0);
    for (int r = 0; r < 2; ++r) {
      const double t = r == 1 && step >= 3 ? 0.003 : 0.001;
      for (double& f : memory[r].layer_forward_seconds) f += t;
      busy[r] = t * static_cast<double>(memory[r].layer_forward_seconds.size());
    }
    // The world's sum: rank 1's exchange runs inside rank 0's, and its sum adds both.
    std::vector<double> m0 = {1.0}, m1 = {1.0}, total;
    const auto rec = loops[0].exchange(step, memory[0], busy[0], ranges, &m0, [&](auto* v0) {
      const auto other = loops[1].exchange(step, memory[1], busy[1], ranges, &m1, [&](auto* v1) {
        ASSERT_EQ(v0->size(), v1->size());
        total = *v0;
        for (size_t i = 0; i < total.size(); ++i) total[i] += (*v1)[i];
        *v1 = total;
      });
      EXPECT_FALSE(other);
      *v0 = total;
    });
    if (rec) records.push_back(*rec);
  }
  ASSERT_EQ(records.size(), 2u);
  // After step 4: stage 1 measured (1 + 1 + 3) / 3 ms a layer, its latest step 3 ms: one layer
  // moves to stage 0, judged against 12 ms/step.
  EXPECT_TRUE(records[0].decision.apply) << records[0].decision.reason;
  EXPECT_NE(records[0].decision.reason.find("judged against the latest monitor interval's slowest "
                                            "stage, 12 ms/step"),
            std::string::npos)
      << records[0].decision.reason;
  // After step 8: stage 1 measures 9 ms/step (three slowed layers), above the window's mean
  // before the move (6.67 ms) but below the slowed layout's 12: kept.
  EXPECT_EQ(records[1].decision.reason.find("moving back"), std::string::npos)
      << records[1].decision.reason;
  EXPECT_EQ(records[1].current, records[0].proposed);
  EXPECT_EQ(records[1].decision.reason.find("too short"), std::string::npos)
      << records[1].decision.reason;
}

}  // namespace
}  // namespace strata::parallel
