// Which layers each stage runs for each micro-batch, when layers move between stages while an
// asynchronous pipeline runs (vPIPE's live migration, ../shared/papers/vpipe.md §2.7, §3.3).
//
// A live migration moves the layers between one or more pairs of neighbouring stages, each layer
// one stage up or down. For a boundary whose layers L move from stage src to stage tgt, with K
// the first micro-batch whose backward of L runs on tgt:
//   - the backward of L runs on src for micro-batches j < K and on tgt for j >= K;
//   - the forward of L runs on src for j < F and on tgt for j >= F, with F = K + S - src - 1:
//     under async-1f1b stage s runs Forward(j + S - s) right after Backward(j)'s update, so F is
//     the first forward src runs after its update of Backward(K - 1), where it hands L over;
//   - the micro-batches in [K, F) (S - src - 1 of them: vPIPE's p - n - 1 copies) were forwarded
//     through L on src and run L's backward on tgt: their tapes of L move, with the weights their
//     forward used (weight stashing);
//   - src hands over after its OptimizerStep that follows Backward(K - 1): L's parameters and
//     optimizer state (updated by every backward of L so far), its running statistics, and those
//     tapes and weights. tgt waits for them before the first instruction that needs L: Backward(K)
//     or Forward(F), whichever it meets first (Forward(F) for a move up, Backward(K) for a move
//     down); neither waits for anything that waits for it, so the hand-off cannot deadlock.
// The forward versions of L follow vPIPE's Eq. (4): src's before F, tgt's (one update fresher for
// a move down, one older for a move up) from F on; every other layer is untouched. Each stage's
// forward and backward ranges stay contiguous at every micro-batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/partition/partition.h"

namespace strata::parallel {

// One boundary of a live migration: layers [begin, end) from stage `src` to stage `tgt`.
struct BoundaryMove {
  int src = 0, tgt = 0;
  size_t begin = 0, end = 0;   // the layers moving
  int64_t first_backward = 0;  // K
  int64_t first_forward = 0;   // F = K + S - src - 1
};

// The partitions a live move from `from` to `to` goes through, each moving every layer at most
// one stage toward `to` (its stage clamped to within one of the stage it is on), the last one `to`:
// one partition when no layer moves more than one stage, and none when the two are the same. At
// most S - 1 of them; no stage is ever empty on the way (both ends being partitions).
std::vector<Partition> one_stage_steps(const Partition& from, const Partition& to);

class StageLayout {
 public:
  explicit StageLayout(Partition initial);

  int stages() const { return static_cast<int>(initial_.size()); }
  // A live migration to `next`, whose first backward on the new stages is micro-batch K. Every
  // layer moves at most one stage; migrations must come in order, each starting after the
  // previous one's last forward switch. Throws naming the partitions otherwise.
  void add_live_migration(const Partition& next, int64_t first_backward);

  LayerRange forward_range(int stage, int64_t micro_batch) const;
  LayerRange backward_range(int stage, int64_t micro_batch) const;
  // The boundary moves of every migration, in order.
  const std::vector<std::vector<BoundaryMove>>& migrations() const { return moves_; }
  // The partition after every migration.
  const Partition& final_partition() const { return partitions_.back(); }

 private:
  // Boundary b (between stages b and b + 1) for a forward or backward of micro-batch j: the index
  // of the first layer of stage b + 1.
  size_t boundary(size_t b, int64_t j, bool forward) const;

  Partition initial_;
  std::vector<Partition> partitions_;             // initial, then after each migration
  std::vector<std::vector<BoundaryMove>> moves_;  // per migration
  std::vector<int64_t> first_backward_;           // K per migration
};

}  // namespace strata::parallel
