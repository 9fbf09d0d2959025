// Per-micro-batch layer ranges across live migrations (parallel/runtime/stage_layout.h), and the
// re-layout bookkeeping of parallel/runtime/relayout.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "parallel/runtime/relayout.h"
#include "parallel/runtime/stage_layout.h"

namespace strata::parallel {
namespace {

bool same(const LayerRange& a, size_t begin, size_t end) {
  return a.begin == begin && a.end == end;
}

// 3 stages of 3 layers; layer 2 moves down from stage 0 to 1 and layer 6 up from stage 2 to 1,
// with K = 4: the down move switches forwards at F = K + S - 0 - 1 = 6 (2 tapes move: micro-
// batches 4 and 5); the up move from the last stage at F = K + 3 - 2 - 1 = 4 (none move).
TEST(StageLayout, RangesSwitchAtTheFirstBackwardAndForwardOfEachMove) {
  StageLayout layout({{0, 3}, {3, 6}, {6, 9}});
  layout.add_live_migration({{0, 2}, {2, 7}, {7, 9}}, 4);
  ASSERT_EQ(layout.migrations().size(), 1u);
  ASSERT_EQ(layout.migrations()[0].size(), 2u);
  const BoundaryMove& down = layout.migrations()[0][0];
  EXPECT_EQ(down.src, 0);
  EXPECT_EQ(down.tgt, 1);
  EXPECT_EQ(down.first_forward, 6);
  const BoundaryMove& up = layout.migrations()[0][1];
  EXPECT_EQ(up.src, 2);
  EXPECT_EQ(up.tgt, 1);
  EXPECT_EQ(up.first_forward, 4);
  for (int64_t j = 0; j < 10; ++j) {
    SCOPED_TRACE(j);
    EXPECT_TRUE(same(layout.forward_range(0, j), 0, j < 6 ? 3 : 2));
    EXPECT_TRUE(same(layout.backward_range(0, j), 0, j < 4 ? 3 : 2));
    EXPECT_TRUE(same(layout.forward_range(1, j), j < 6 ? 3 : 2, j < 4 ? 6 : 7));
    EXPECT_TRUE(same(layout.backward_range(1, j), j < 4 ? 3 : 2, j < 4 ? 6 : 7));
    EXPECT_TRUE(same(layout.forward_range(2, j), j < 4 ? 6 : 7, 9));
    EXPECT_TRUE(same(layout.backward_range(2, j), j < 4 ? 6 : 7, 9));
    // Every micro-batch's ranges cover the layers once.
    size_t next = 0;
    for (int s = 0; s < 3; ++s) {
      EXPECT_EQ(layout.forward_range(s, j).begin, next);
      next = layout.forward_range(s, j).end;
    }
    EXPECT_EQ(next, 9u);
  }
  EXPECT_EQ(layout.final_partition()[1].begin, 2u);
}

// The copies that move: S - src - 1 per boundary (vPIPE's p - n - 1).
TEST(StageLayout, MovedTapesArePMinusNMinusOne) {
  for (int S = 2; S <= 5; ++S) {
    for (int src = 0; src + 1 < S; ++src) {
      Partition before, after;
      for (int s = 0; s < S; ++s) before.push_back({size_t(2 * s), size_t(2 * s + 2)});
      after = before;
      after[src].end -= 1;  // its last layer moves down to src + 1
      after[src + 1].begin -= 1;
      StageLayout layout(before);
      layout.add_live_migration(after, 10);
      const BoundaryMove& m = layout.migrations()[0][0];
      EXPECT_EQ(m.first_forward - m.first_backward, S - src - 1) << S << " stages, src " << src;
    }
  }
}

TEST(StageLayout, RefusesMovesOfMoreThanOneStageAndOverlappingMigrations) {
  StageLayout two_hops({{0, 3}, {3, 4}, {4, 6}});
  // Layer 2 would go from stage 0 to stage 2.
  EXPECT_THROW(two_hops.add_live_migration({{0, 1}, {1, 2}, {2, 6}}, 3), std::exception);
  StageLayout layout({{0, 2}, {2, 4}, {4, 6}});
  layout.add_live_migration({{0, 1}, {1, 4}, {4, 6}}, 3);  // switches forwards at 3 + 3 - 1 = 5
  EXPECT_THROW(layout.add_live_migration({{0, 2}, {2, 4}, {4, 6}}, 5), std::exception);
  layout.add_live_migration({{0, 2}, {2, 4}, {4, 6}}, 6);
  EXPECT_TRUE(same(layout.forward_range(0, 100), 0, 2));
}

// A move whose layers go more than one stage runs as a chain of moves of one stage each; the
// chain is empty when a stage would hold no layer on the way, or nothing moves.
TEST(StageLayout, OneStageStepsChainAMoveOfSeveralStages) {
  // conv2 (layer 4) goes from stage 2 to stage 0, bn2 (5) from 3 to 1, relu2 (6) from 3 to 2.
  const Partition from{{0, 1}, {1, 4}, {4, 5}, {5, 12}};
  const Partition to{{0, 5}, {5, 6}, {6, 7}, {7, 12}};
  const std::vector<Partition> steps = one_stage_steps(from, to);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0], (Partition{{0, 4}, {4, 5}, {5, 7}, {7, 12}}));
  EXPECT_EQ(steps[1], to);
  StageLayout layout(from);  // each of them a valid live migration after the one before
  layout.add_live_migration(steps[0], 4);
  layout.add_live_migration(steps[1], 12);
  // One stage at most: the move itself.
  EXPECT_EQ(one_stage_steps(from, steps[0]), std::vector<Partition>{steps[0]});
  EXPECT_TRUE(one_stage_steps(from, from).empty());
  // Between any two partitions of 8 layers on 2-4 stages: a chain of at most S - 1 moves, each a
  // valid live migration after the one before, ending at the goal (no stage ever empty: a
  // layer bound for stage s enters it or is already in it while the stage's own layers leave).
  std::mt19937 rng(7);
  for (int S = 2; S <= 4; ++S) {
    auto random_partition = [&] {
      std::vector<size_t> cuts;
      for (size_t c = 1; c < 8; ++c) cuts.push_back(c);
      std::shuffle(cuts.begin(), cuts.end(), rng);
      cuts.resize(static_cast<size_t>(S - 1));
      std::sort(cuts.begin(), cuts.end());
      Partition p;
      size_t b = 0;
      for (size_t c : cuts) p.push_back({b, c}), b = c;
      p.push_back({b, 8});
      return p;
    };
    for (int trial = 0; trial < 200; ++trial) {
      const Partition a = random_partition(), b = random_partition();
      const std::vector<Partition> chain = one_stage_steps(a, b);
      if (a == b) {
        EXPECT_TRUE(chain.empty());
        continue;
      }
      ASSERT_FALSE(chain.empty());
      EXPECT_LE(chain.size(), static_cast<size_t>(S - 1));
      EXPECT_EQ(chain.back(), b);
      StageLayout l(a);
      int64_t k = 1;
      for (const Partition& p : chain) {
        l.add_live_migration(p, k);
        k += 2 * S;  // after the previous move's last forward switch (K + S - 1 at most)
      }
    }
  }
}

TEST(Relayout, LayerMovesBetweenPartitions) {
  const std::vector<LayerMove> moves = layer_moves({{0, 3}, {3, 6}}, {{0, 2}, {2, 6}});
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].layer, 2u);
  EXPECT_EQ(moves[0].from_stage, 0);
  EXPECT_EQ(moves[0].to_stage, 1);
  EXPECT_EQ(describe_moves(moves, {"a", "b", "c", "d", "e", "f"}), "c 0->1");
  EXPECT_TRUE(layer_moves({{0, 3}, {3, 6}}, {{0, 3}, {3, 6}}).empty());
  EXPECT_THROW(layer_moves({{0, 3}, {3, 6}}, {{0, 6}}), std::exception);
}

}  // namespace
}  // namespace strata::parallel
