// vPIPE's live migration under async-1f1b (parallel/runtime/live_protocol.h): the protocol
// replayed over the stages' programs with a mock transport of random delays, checked against
// Eq. (4) and the note's invariants; and its transfers (parallel/runtime/live_transfer.h) between
// local ranks: chunks, flow control, gating, refusals, a peer that never sends.
#include <gtest/gtest.h>

#include "live_transfer_checks.h"
#include "parallel/comm/local_comm.h"
#include "parallel/runtime/live_protocol.h"

namespace strata::parallel {
namespace {

Partition even(int stages, size_t per_stage) {
  Partition p;
  for (int s = 0; s < stages; ++s) {
    p.push_back({static_cast<size_t>(s) * per_stage, static_cast<size_t>(s + 1) * per_stage});
  }
  return p;
}

// Every rule of the protocol, for every move of `next` from `initial`, over several seeds.
void check_replay(const Partition& initial, const Partition& next, int64_t K, int64_t N) {
  const int S = static_cast<int>(initial.size());
  for (uint64_t seed = 0; seed < 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    LiveReplayOptions o;
    o.initial = initial;
    o.next = next;
    o.first_backward = K;
    o.micro_batches = N;
    o.seed = seed;
    o.max_delay = static_cast<int>(seed % 5);
    const LiveReplayResult r = replay_live_migration(o);
    for (const std::string& v : r.violations) ADD_FAILURE() << v;
    for (const LiveReplayResult::Move& m : r.moves) {
      SCOPED_TRACE("move " + std::to_string(m.src) + "->" + std::to_string(m.tgt));
      // Exactly p - n - 1 tapes move: micro-batches [K, K + S - src - 1).
      ASSERT_EQ(static_cast<int64_t>(m.tapes_moved.size()), S - m.src - 1);
      for (size_t i = 0; i < m.tapes_moved.size(); ++i) {
        EXPECT_EQ(m.tapes_moved[i], K + static_cast<int64_t>(i));
      }
      EXPECT_EQ(m.first_forward, K + S - m.src - 1);
      for (int64_t j = 0; j < N; ++j) {
        // Eq. (4): the forward's stage and version; the backward on the version it saw.
        const int fwd = j < m.first_forward ? m.src : m.tgt;
        EXPECT_EQ(m.forward_stage.at(j), fwd) << "micro-batch " << j;
        EXPECT_EQ(m.forward_version.at(j), async_forward_version(S, fwd, j)) << "micro-batch " << j;
        EXPECT_EQ(m.backward_runs.at(j), 1) << "micro-batch " << j;
        EXPECT_EQ(m.backward_stage.at(j), j < K ? m.src : m.tgt) << "micro-batch " << j;
        EXPECT_EQ(m.backward_version.at(j), m.forward_version.at(j)) << "micro-batch " << j;
      }
      // Updates once each, in micro-batch order, across the two stages.
      ASSERT_EQ(static_cast<int64_t>(m.update_order.size()), N);
      for (int64_t j = 0; j < N; ++j) EXPECT_EQ(m.update_order[static_cast<size_t>(j)], j);
      EXPECT_TRUE(m.handed_off);
      EXPECT_EQ(m.source_tapes_after, 0);
      EXPECT_EQ(m.source_versions_after, 0);
      // The pipeline did not drain while the move ran.
      EXPECT_GT(m.min_in_flight, 0);
    }
  }
}

TEST(LiveProtocol, Eq4VersionsBeforeAndAfterAMoveDown) {
  EXPECT_EQ(async_forward_version(4, 0, 2), 0);
  EXPECT_EQ(async_forward_version(4, 0, 7), 4);
  EXPECT_EQ(async_forward_version(4, 1, 7), 5);  // one stage down: one update fresher
  // 4 stages of 2 layers; layer 1 moves 0 -> 1 with K = 6: tapes 6, 7, 8 move (p - n - 1 = 3).
  check_replay(even(4, 2), {{0, 1}, {1, 4}, {4, 6}, {6, 8}}, 6, 20);
}

TEST(LiveProtocol, MovesUpIncludingFromTheLastStage) {
  // Layer 2 moves 1 -> 0 (2 tapes move; tgt's first forward needs the version before the
  // hand-off's update); from the last stage no tape moves.
  check_replay(even(4, 2), {{0, 3}, {3, 4}, {4, 6}, {6, 8}}, 5, 16);
  check_replay(even(4, 2), {{0, 2}, {2, 4}, {4, 7}, {7, 8}}, 5, 16);
  check_replay(even(2, 3), {{0, 4}, {4, 6}}, 3, 10);
}

TEST(LiveProtocol, SeveralLayersAndBothBoundariesAtOnce) {
  // Stage 1 takes two layers from stage 0 and one from stage 2 at once.
  check_replay(even(3, 3), {{0, 1}, {1, 7}, {7, 9}}, 4, 14);
  // K = 1: the move begins at the first micro-batch's backward.
  check_replay(even(3, 3), {{0, 2}, {2, 6}, {6, 9}}, 1, 8);
}

TEST(LiveProtocol, RefusesAMoveOfMoreThanOneStageAndAShortRun) {
  LiveReplayOptions o;
  o.initial = {{0, 1}, {1, 2}, {2, 6}};
  o.next = {{0, 3}, {3, 4}, {4, 6}};  // layer 2 would go from stage 2 to stage 0
  o.first_backward = 3;
  o.micro_batches = 10;
  EXPECT_THROW(replay_live_migration(o), Error);
  o.initial = even(3, 2);
  o.next = {{0, 1}, {1, 4}, {4, 6}};
  o.micro_batches = 4;  // F = 3 + 3 - 0 - 1 = 5: the run ends first
  EXPECT_THROW(replay_live_migration(o), Error);
}

void run_local(int n, const std::function<void(LocalCommunicator&)>& fn,
               std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  LocalWorld world(n);
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    comm.set_timeout(timeout);
    fn(comm);
  });
}

TEST(LiveTransfer, MovesItemsInChunksUnderTheWindow) {
  run_local(2, [](LocalCommunicator& c) { live_checks::moves_items_in_chunks(c, 5, 4096, 16384); });
  run_local(3, [](LocalCommunicator& c) { live_checks::moves_items_in_chunks(c, 3, 1024, 2048); });
  // Whole tensors, no flow control.
  run_local(2, [](LocalCommunicator& c) { live_checks::moves_items_in_chunks(c, 4, 0, 0); });
}

TEST(LiveTransfer, BothEndsRefuseACountMismatch) {
  run_local(2, [](LocalCommunicator& c) { live_checks::refuses_a_count_mismatch(c); });
}

TEST(LiveTransfer, AGateOnAnItemNeverSentTimesOutNamingTheMigration) {
  run_local(
      2,
      [](LocalCommunicator& c) {
        const bool source = c.rank() == 0;
        LiveTransfer t(c, 1 - c.rank(),
                       source ? LiveTransfer::Role::kSource : LiveTransfer::Role::kTarget, 2,
                       "migration at step 3: conv2 1->0");
        if (source) {
          t.post(0, live_checks::item(0));  // item 1 never comes: the source "died"
          return;
        }
        t.expect(0, live_checks::layout(0));
        t.expect(1, live_checks::layout(1));
        EXPECT_NO_THROW(t.wait(0, "Backward(0)"));
        try {
          t.wait(1, "Backward(9)");
          ADD_FAILURE() << "the gate opened without the item";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("conv2 1->0"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("Backward(9)"), std::string::npos) << e.what();
        }
      },
      std::chrono::milliseconds(300));
}

TEST(LiveTransfer, RefusesOutOfOrderPostsAndABadPeer) {
  run_local(2, [](LocalCommunicator& c) {
    if (c.rank() == 0) {
      EXPECT_THROW(LiveTransfer(c, 0, LiveTransfer::Role::kSource, 1, "m"), Error);  // itself
    }
  });
}

}  // namespace
}  // namespace strata::parallel
