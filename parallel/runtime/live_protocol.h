// vPIPE's live migration protocol under async-1f1b (../shared/papers/vpipe.md §2.7, §3.3), as a
// replay of the stages' own instruction lists with a mock transport.
//
// The protocol, for a boundary move of layers L from stage src to its neighbour tgt whose first
// backward on tgt is micro-batch K (parallel/runtime/stage_layout.h: F = K + S - src - 1 is the
// first forward of L on tgt):
//   0. prepare / ready: when src runs Forward(K) it sends `prepare`; tgt makes L and answers
//      `ready`. Nothing else moves before `ready`.
//   1. the tapes of L of micro-batches [K, F) (vPIPE's p - n - 1 copies), each with the weights
//      of L its forward used (ASP weight stashing), go to tgt as soon as they exist, in order,
//      on a low-priority channel (parallel/runtime/live_transfer.h); src frees each once sent.
//   2. hand-off: after src's OptimizerStep that follows Backward(K - 1) (the last backward of L at
//      src), src sends L's parameters and optimizer state (updated by every backward so far) and,
//      for a move up, the version before that update (tgt's first forward of L needs it, Eq. 4),
//      and drops L.
//   3. tgt gates: Backward(j) of L for j in [K, F) waits for tape j; the first instruction of tgt
//      that needs L's parameters (Forward(F) for a move up, Backward(K) for a move down) waits for
//      the hand-off. Updates of L from B(K) on are tgt's, in micro-batch order.
// Eq. (4): the forward of micro-batch j uses the weights after max(0, j - S + n + 1) updates on
// the stage n that runs it, n = src before F and tgt from F on; the backward uses the same
// version (stashed). async_forward_version is that formula, written out on its own so that a
// replay can be checked against it.
//
// replay_live_migration runs the S programs of async-1f1b (parallel/schedule/schedule.h) in a
// random interleaving (every message, training or migration, arrives after a random delay), with
// per-stage state for the moved layers: which stage holds them, their latest version, the stashed
// versions, the tapes. It executes the protocol above and records what happened, so that tests
// can check it against the invariants instead of trusting it: every forward and backward of L
// found the weights of its Eq. 4 version on its stage, every backward of L ran exactly once and
// on the right stage, L's updates were applied once each in micro-batch order, exactly p - n - 1
// tapes moved, the source held nothing of L afterwards, and micro-batches stayed in flight while
// the migration ran (the pipeline did not drain). A violation is recorded, not thrown.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "parallel/partition/partition.h"

namespace strata::parallel {

// Eq. (4) under async-1f1b: the updates applied to the weights that the forward of micro-batch
// `j` on `stage` of `stages` uses.
int64_t async_forward_version(int stages, int stage, int64_t j);

struct LiveReplayOptions {
  Partition initial;           // one layer range per stage
  Partition next;              // after the migration (each layer moves at most one stage)
  int64_t first_backward = 0;  // K
  int64_t micro_batches = 0;   // of the whole run
  uint64_t seed = 0;           // the interleaving and the delays
  int max_delay = 3;           // ticks a message takes, at most (uniform from 0)
  // The stop-and-restart baseline instead: the pipeline drains after micro-batch K - 1, the
  // layers move (no tape: none is in flight), a new run starts at K in the new layout.
  bool restart = false;
  // Ticks of a Forward and a Backward (the other instructions take none).
  int64_t forward_ticks = 1, backward_ticks = 1;
  // A link model instead of random delays (bandwidth > 0): every direction between neighbouring
  // stages moves `bandwidth` bytes a tick, one message at a time (a message once begun goes to
  // its end). Activations and gradients are `activation_bytes`; a moved tape `tape_bytes`, the
  // hand-off `param_bytes`, each cut into chunks of `chunk_bytes` (0: whole). With `priority`
  // the link serves training messages before migration chunks and holds at most `window_bytes`
  // of migration chunks queued (0: no cap); without it, one queue in order of posting.
  int64_t bandwidth = 0;
  int64_t activation_bytes = 0, tape_bytes = 0, param_bytes = 0, chunk_bytes = 0;
  bool priority = false;
  int64_t window_bytes = 0;
};

struct LiveReplayResult {
  // Per boundary move (in StageLayout's order), per micro-batch of the moved layers:
  struct Move {
    int src = 0, tgt = 0;
    int64_t first_backward = 0, first_forward = 0;
    std::map<int64_t, int> forward_stage;        // the stage that ran its forward
    std::map<int64_t, int64_t> forward_version;  // the version that forward used
    std::map<int64_t, int> backward_stage;
    std::map<int64_t, int64_t> backward_version;
    std::map<int64_t, int> backward_runs;  // how many times its backward ran
    std::vector<int64_t> update_order;     // the micro-batches whose update L got, in order
    std::vector<int64_t> tapes_moved;      // micro-batches whose tapes went src -> tgt
    int64_t stash_versions_moved = 0;      // weight versions that went with them / hand-off
    bool handed_off = false;
    int64_t source_tapes_after = -1;     // tapes of L src held right after the hand-off
    int64_t source_versions_after = -1;  // weight versions of L src held after it (0: freed)
    int64_t min_in_flight = -1;  // micro-batches in flight, at the least, while the move ran
  };
  std::vector<Move> moves;
  int64_t ticks = 0;
  // The tick each micro-batch's backward ended on stage 0 (its last instruction), by
  // micro-batch; and the ticks the migration began (prepare) and ended (everything arrived).
  std::vector<int64_t> done_at;
  int64_t migration_start = -1, migration_end = -1;
  std::vector<std::string> violations;  // empty when every rule held
};

LiveReplayResult replay_live_migration(const LiveReplayOptions& options);

}  // namespace strata::parallel
