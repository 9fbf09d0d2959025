// vPIPE's memory and time models (Eq. 1-3) against hand-computed values, and the properties of
// Algorithm 2 the note's §5 item 5 asks for (parallel/vpipe/).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "parallel/vpipe/memory_model.h"
#include "parallel/vpipe/swap_recompute_planner.h"

namespace strata::parallel {
namespace {

constexpr MemoryPolicy K = MemoryPolicy::kKeep, S = MemoryPolicy::kSwap,
                       R = MemoryPolicy::kRecompute;

MemoryPlan plan_of(std::vector<MemoryPolicy> p) {
  MemoryPlan plan;
  plan.layers = std::move(p);
  return plan;
}

// Three layers: f = 1, 2, 3 ms; b = 2, 4, 6 ms; a = 1000, 2000, 4000 B; inputs 500, 1000,
// 2000 B; m = 100, 200, 300 B.
std::vector<LayerMemoryCost> three_layers() {
  std::vector<LayerMemoryCost> l(3);
  for (int i = 0; i < 3; ++i) {
    l[i].name = "l" + std::to_string(i);
    l[i].forward_s = 1e-3 * (i + 1);
    l[i].backward_s = 2e-3 * (i + 1);
    l[i].saved_bytes = 1000.0 * (1 << i);
    l[i].input_bytes = 500.0 * (1 << i);
    l[i].param_bytes = 100.0 * (i + 1);
  }
  return l;
}

StageSetting stage_1_of_4() {
  StageSetting s;
  s.stage = 1;
  s.stages = 4;
  s.micro_batches = 8;
  s.optimizer_slots = 2;
  s.bandwidth = 1e6;
  return s;
}

TEST(VpipeModel, Eq1CopiesAndConstantMemory) {
  const auto l = three_layers();
  StageSetting s = stage_1_of_4();
  // 1f1b: stage k of p keeps p - k = 3 copies; constant = 600 B x (param + grad + 2 slots).
  StageMemoryEstimate e = estimate_stage_memory(l, 0, plan_of({K, K, K}), s);
  EXPECT_EQ(e.copies, 3);
  EXPECT_DOUBLE_EQ(e.constant_bytes, 2400.0);
  EXPECT_DOUBLE_EQ(e.dependent_bytes, 7000.0);
  EXPECT_DOUBLE_EQ(e.eq1_bytes(), 2400.0 + 3 * 7000.0);
  // Swapped tensors count zero.
  e = estimate_stage_memory(l, 0, plan_of({K, K, S}), s);
  EXPECT_DOUBLE_EQ(e.eq1_bytes(), 2400.0 + 3 * 3000.0);
  // A recompute segment of layers 1-2 keeps its input (1000 B) instead of 6000 B of tapes.
  e = estimate_stage_memory(l, 0, plan_of({K, R, R}), s);
  EXPECT_DOUBLE_EQ(e.dependent_bytes, 1000.0 + 1000.0);
  // gpipe keeps all M = 8; async-1f1b also stashes p - k - 1 = 2 versions of the parameters,
  // and a backward on a stashed version keeps a copy of the current ones (the paper's Eq. 1
  // does not count that copy).
  s.schedule = ScheduleKind::kGPipe;
  EXPECT_EQ(estimate_stage_memory(l, 0, plan_of({K, K, K}), s).copies, 8);
  s.schedule = ScheduleKind::kAsync1F1B;
  e = estimate_stage_memory(l, 0, plan_of({K, K, K}), s);
  EXPECT_EQ(e.copies, 3);
  EXPECT_DOUBLE_EQ(e.constant_bytes, 2400.0 + 3 * 600.0);
  s.paper_model = true;
  EXPECT_DOUBLE_EQ(estimate_stage_memory(l, 0, plan_of({K, K, K}), s).constant_bytes,
                   2400.0 + 2 * 600.0);
  s.paper_model = false;
  // The last stage keeps one copy; mixed precision adds the 16-bit working weights and
  // gradients (half of m each).
  s.schedule = ScheduleKind::k1F1B;
  s.stage = 3;
  s.mixed = true;
  e = estimate_stage_memory(l, 0, plan_of({K, K, K}), s);
  EXPECT_EQ(e.copies, 1);
  EXPECT_DOUBLE_EQ(e.constant_bytes, 2400.0 + 600.0);
}

TEST(VpipeModel, SharedStoragesCountOnceWhileEitherLayerKeepsThem) {
  auto l = three_layers();
  l[2].shared_bytes = 1500.0;  // of layer 2's 4000 B, layer 1 keeps 1500 B too
  const StageSetting s = stage_1_of_4();
  EXPECT_DOUBLE_EQ(estimate_stage_memory(l, 0, plan_of({K, K, K}), s).dependent_bytes, 7000.0);
  // Layer 2 swapped: the shared part stays, as layer 1 keeps it.
  EXPECT_DOUBLE_EQ(estimate_stage_memory(l, 0, plan_of({K, K, S}), s).dependent_bytes,
                   3000.0 + 1500.0);
  // Layer 1 recomputed, layer 2 kept: the shared part stays with layer 2.
  EXPECT_DOUBLE_EQ(estimate_stage_memory(l, 0, plan_of({K, R, K}), s).dependent_bytes,
                   1000.0 + 4000.0 + 1000.0);
}

// The receive buffers come from the schedule's program and the executor's lookahead: under
// 1f1b the last stage of 4 has the next micro-batch's activations posted while a forward runs;
// under gpipe a middle stage's output gradients are all posted ahead of the first backward
// (within the lookahead), none during its forwards but the last ones.
TEST(VpipeModel, ReceiveBuffersFollowTheProgramAndTheLookahead) {
  StageSetting s = stage_1_of_4();
  s.stage = 3;
  ReceiveBuffers r = receive_buffers(s);
  EXPECT_EQ(r.forward.activations, 2);
  EXPECT_EQ(r.forward.gradients, 0);  // the last stage receives no gradients
  s.lookahead = 0;
  EXPECT_EQ(receive_buffers(s).forward.activations, 1);  // only the running one's
  s.stage = 0;
  EXPECT_EQ(receive_buffers(s).forward.activations, 0);  // the first stage reads data
  s.stage = 1;
  s.stages = 1;
  r = receive_buffers(s);
  EXPECT_EQ(
      r.forward.activations + r.forward.gradients + r.backward.activations + r.backward.gradients,
      0);
}

// The running micro-batch's worst moment: during the backward of layer j the layers after j have
// released their tapes, so the last stage (one copy) does not count a layer's tape twice.
TEST(VpipeModel, TheRunningMicroBatchHoldsWhatItsLayersUpToTheMomentKeep) {
  auto l = three_layers();
  for (auto& x : l) {
    x.output_bytes = 100.0;
    x.forward_peak_bytes = x.saved_bytes + 50.0;  // its tape and 50 B of temporaries
    x.backward_peak_bytes = 10.0;
  }
  StageSetting s = stage_1_of_4();
  s.stage = 3;
  s.lookahead = 0;
  const StageMemoryEstimate e = estimate_stage_memory(l, 0, plan_of({K, K, K}), s);
  // Forward of layer 2: tapes of layers 0-1 (3000) + its own peak (4050) + its received input
  // (500) = 7550, the worst moment (backward of layer 2: 7000 + 10; of layer 0: 1000 + its
  // output's gradient 100 + 10); less one micro-batch's dependent memory (7000).
  EXPECT_DOUBLE_EQ(e.transient_bytes, 550.0);
  // Boundary: the last stage's loss gradient of its one micro-batch in flight.
  EXPECT_DOUBLE_EQ(e.boundary_bytes, 100.0);
  EXPECT_DOUBLE_EQ(e.peak_bytes, e.constant_bytes + 7000.0 + 100.0 + 550.0);
}

TEST(VpipeModel, Eq2SwapInTheWindowIsFreeTheExcessIsExposedRecomputeAddsItsForward) {
  const auto l = three_layers();
  StageSetting s = stage_1_of_4();
  StageTimeEstimate t = estimate_stage_time(l, 0, plan_of({K, K, K}), s);
  EXPECT_NEAR(t.forward_s, 6e-3, 1e-15);
  EXPECT_NEAR(t.backward_s, 12e-3, 1e-15);
  // Layer 2 swapped at 1 MB/s: 2 x 4000 B = 8 ms of copies inside an 18 ms window.
  t = estimate_stage_time(l, 0, plan_of({K, K, S}), s);
  EXPECT_NEAR(t.backward_s, 12e-3, 1e-15);
  EXPECT_EQ(t.exposed_swap_s, 0.0);
  // At 200 kB/s the copies take 40 ms: 22 ms are exposed, 1:1.
  s.bandwidth = 2e5;
  t = estimate_stage_time(l, 0, plan_of({K, K, S}), s);
  EXPECT_NEAR(t.exposed_swap_s, 22e-3, 1e-12);
  EXPECT_NEAR(t.backward_s, 34e-3, 1e-12);
  // Recompute adds f_i: layer 1 (2 ms) and layer 2 (3 ms).
  t = estimate_stage_time(l, 0, plan_of({K, R, R}), s);
  EXPECT_NEAR(t.backward_s, 17e-3, 1e-15);
  EXPECT_NEAR(t.recompute_s, 5e-3, 1e-15);
  EXPECT_NEAR(t.step_s(8), 8 * 23e-3, 1e-12);
}

TEST(VpipePlanner, NoLimitOrRoomKeepsEverything) {
  const auto l = three_layers();
  const StageSetting s = stage_1_of_4();
  EXPECT_EQ(plan_stage(l, 0, 3, s, 0.0).plan, plan_of({K, K, K}));
  EXPECT_EQ(plan_stage(l, 0, 3, s, 1e9).plan, plan_of({K, K, K}));
}

// A layer whose one-way transfer outlasts its forward (a / P > f) is recomputed, otherwise
// swapped; swaps that fit the PCIe budget are taken first and cost nothing; planning stops as
// soon as the stage fits.
TEST(VpipePlanner, CheaperOpPerLayerHiddenSwapsFirstStopsOnceItFits) {
  auto l = three_layers();
  StageSetting s = stage_1_of_4();
  s.paper_model = true;  // Eq. (1) as written: the hand-computed values below
  s.bandwidth = 1e6;     // a / P = 1, 2, 4 ms against f = 1, 2, 3 ms: layer 2 is recomputed
  const double keep = estimate_stage_memory(l, 0, plan_of({K, K, K}), s).peak_bytes;
  // Freeing one micro-batch-copy of layer 1 (3 x 2000 B) is enough: a hidden swap of layer 1
  // (its gain ties with layer 0's, and its bytes are larger).
  StagePlan p = plan_stage(l, 0, 3, s, keep - 5000.0);
  ASSERT_TRUE(p.feasible);
  EXPECT_EQ(p.plan, plan_of({K, S, K}));
  EXPECT_EQ(p.time.exposed_swap_s, 0.0);
  // Tighter: layer 2 (the recompute candidate, highest gain) goes to its op too.
  p = plan_stage(l, 0, 3, s, keep - 15000.0);
  ASSERT_TRUE(p.feasible);
  EXPECT_EQ(p.plan.at(2), R);
  // Faster copies: every layer is a swap candidate.
  s.bandwidth = 1e9;
  p = plan_stage(l, 0, 3, s, 2400.0 + 1.0);  // only constant memory fits
  ASSERT_TRUE(p.feasible);
  EXPECT_EQ(p.plan, plan_of({S, S, S}));
  EXPECT_LE(p.time.swap_bytes, s.bandwidth * (p.time.forward_s + p.time.backward_s));
  // The full model also counts swapped tensors on their way out and back: under the same limit as
  // the first case, swapping layer 1 alone no longer fits, so the plan frees more.
  s.paper_model = false;
  s.bandwidth = 1e6;
  const StagePlan paper = [&] {
    StageSetting eq1 = s;
    eq1.paper_model = true;
    return plan_stage(l, 0, 3, eq1, keep - 5000.0);
  }();
  p = plan_stage(l, 0, 3, s, keep - 5000.0);
  ASSERT_TRUE(p.feasible);
  EXPECT_LE(p.memory.peak_bytes, keep - 5000.0);
  EXPECT_GT(p.memory.transient_bytes, 0.0);
  EXPECT_GT(estimate_stage_memory(l, 0, paper.plan, s).peak_bytes, keep - 5000.0);
  int changed = 0;
  for (size_t i = 0; i < 3; ++i) changed += p.plan.at(i) != K ? 1 : 0;
  EXPECT_GE(changed, 2);
}

// Whenever some plan meets Eq. (1), the planner's does (the paper's model: no transients). Brute
// force over all 3^n plans of random stages; the planner is deterministic.
TEST(VpipePlanner, MeetsEq1WheneverAnyPlanCanAndIsDeterministic) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int feasible_cases = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = 1 + rng() % 6;
    std::vector<LayerMemoryCost> l(n);
    for (size_t i = 0; i < n; ++i) {
      l[i].forward_s = 1e-3 * (0.1 + u(rng));
      l[i].backward_s = 2e-3 * (0.1 + u(rng));
      l[i].saved_bytes = std::floor(1e4 * u(rng));
      l[i].input_bytes = std::floor(l[i].saved_bytes * u(rng));
      l[i].param_bytes = std::floor(1e3 * u(rng));
    }
    StageSetting s;
    s.stages = 1 + static_cast<int>(rng() % 4);
    s.stage = static_cast<int>(rng() % s.stages);
    s.micro_batches = 1 + rng() % 8;
    s.bandwidth = 1e6 * (0.5 + 5 * u(rng));
    s.paper_model = true;
    const double limit = 1e3 + 6e4 * u(rng);
    // The smallest Eq. (1) memory over every plan.
    double best = 1e300;
    std::vector<MemoryPolicy> p(n, K);
    for (size_t code = 0; code < static_cast<size_t>(std::pow(3, n)); ++code) {
      size_t c = code;
      for (size_t i = 0; i < n; ++i, c /= 3) p[i] = c % 3 == 0 ? K : c % 3 == 1 ? S : R;
      best = std::min(best, estimate_stage_memory(l, 0, plan_of(p), s).peak_bytes);
    }
    const StagePlan a = plan_stage(l, 0, n, s, limit);
    const StagePlan b = plan_stage(l, 0, n, s, limit);
    EXPECT_EQ(a.plan, b.plan);
    if (best <= limit) {
      ++feasible_cases;
      EXPECT_TRUE(a.feasible) << "trial " << trial << ": a plan of " << best << " B exists under "
                              << limit << " B";
      EXPECT_LE(a.memory.peak_bytes, limit);
    } else {
      EXPECT_FALSE(a.feasible) << "trial " << trial;
    }
  }
  EXPECT_GT(feasible_cases, 50);
}

TEST(VpipePlanner, InfeasibleStageReportsTheSmallestPlan) {
  const auto l = three_layers();
  const StageSetting s = stage_1_of_4();
  const StagePlan p = plan_stage(l, 0, 3, s, 1000.0);  // below the constant 2400 B
  EXPECT_FALSE(p.feasible);
  EXPECT_GE(p.smallest_peak_bytes, 2400.0);
  const PipelinePlan pipe =
      plan_pipeline(l, Partition{{0, 1}, {1, 3}}, stage_1_of_4(), 2400.0 + 3 * 1000.0 + 10.0);
  ASSERT_EQ(pipe.stages.size(), 2u);
  EXPECT_EQ(pipe.plan.layers.size(), 3u);
}

}  // namespace
}  // namespace strata::parallel
