// DynPipe's transparent layer migration inside an async-1f1b run (--migration dynpipe;
// ../shared/papers/dynpipe.md §2.10): the moved layers' updates pause, their state goes to the
// target in chunks behind training, the target takes the layers over once it holds the state, and
// the gradients buffered meanwhile are applied there once, together.
//
// One boundary move of layers L from stage `src` to its neighbour `tgt` (StageLayout's
// BoundaryMove), P the first micro-batch of the move's step:
//   1. pause: src applies the updates of L for micro-batches j < P as usual; from Backward(P) on
//      it adds L's gradients into its store's gradients (a buffer) and updates nothing, so L's
//      weights and optimizer state after P updates are frozen. Right after the update of
//      Backward(P - 1) src posts that frozen state (parameters and optimizer slots) to tgt:
//      LiveTransfer, a low-priority thread in chunks with a window, over the emulated link as bulk
//      traffic when there is one. Training goes on meanwhile on the old placement.
//   2. take-over K (agreed at micro-batch boundaries): the upstream stage u = min(src, tgt)
//      decides at one of its forwards j >= P, once the target holds the frozen state: K = j + S.
//      A move up (tgt = u) knows it (LiveTransfer::arrived); for a move down tgt tells src with an
//      acknowledgement per backward j in [P, K) (a one-number message from tgt's Backward(j) to
//      src's, the arrival flag). u sends a one-number control message at every forward j >= P up
//      to the decision (-1, or K), which the downstream stage receives at its Forward(j). Both
//      then add the migration to their StageLayout at K: F = K + S - src - 1 as in vPIPE, and
//      every receive posted before the decision (a few instructions ahead, at most micro-batch
//      j + 1) is of a micro-batch before K. K is late enough that every forward of L whose
//      backward runs on tgt used the frozen weights (version P). The one exception: at the last
//      forward j at which the move still ends inside the run (F < the run's micro-batches), u
//      decides anyway, and the target waits for the state there (the wait is in the stats).
//   3. from K: tgt runs L's backwards (those of [K, F) replayed from the inputs src ships; no
//      weights travel with them: they are the frozen ones) and its forwards from F, on the frozen
//      weights, adding the gradients into its own store's. After its update of Backward(K - 1),
//      its last backward of L, src posts the flush (its buffered gradients, the sum over
//      [P, K), and their count) and frees L.
//   4. resume R: at each of its updates from Backward(K) on tgt checks whether the flush has
//      arrived; at the first that finds it (R), tgt adds the flush to its own buffered gradients
//      (those of [K, R]) and takes one optimizer step with the sum: every gradient computed for L
//      since P applied once. The updates of L go on one per micro-batch from R + 1. If the run
//      ends first, tgt waits for the flush and applies it at the end (R = the last micro-batch).
// Every forward of L uses the weights its stage holds at the time (the latest version: after j
// - S + s + 1 updates before P, P during the pause, P + 1 + (j - S + s - R) after R) and its
// backward the same version (weight stashing). P, K and R go into the stats (the migration
// record), so a one-process replay can apply the same gradient sequence.
//
// Limits (named when refused): one migration of one boundary per run, one data-parallel group,
// moved layers without running statistics or tied parameters, float32 stores. The rest as
// LiveStage's (parallel/runtime/live_stage.h), whose checks the caller runs.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/exec_context.h"
#include "graph/model.h"
#include "graph/optimizer.h"
#include "graph/param_store.h"
#include "parallel/comm/communicator.h"
#include "parallel/runtime/live_stage.h"
#include "parallel/runtime/live_transfer.h"
#include "parallel/runtime/moving_layers.h"
#include "parallel/runtime/stage_layout.h"
#include "parallel/runtime/stage_memory.h"
#include "parallel/runtime/weight_versions.h"

namespace strata::parallel {

class PausedStage : public MovingLayers {
 public:
  // `stage` of the partitions' stages; `dp` must be null or of one rank (one group).
  PausedStage(ExecContext& ctx, graph::Model& model, int stage, const LiveMigrationConfig& config,
              const graph::OptimizerConfig& optimizer, Communicator* dp = nullptr);
  ~PausedStage() override;
  PausedStage(const PausedStage&) = delete;
  PausedStage& operator=(const PausedStage&) = delete;

  const StageLayout& layout() const override { return layout_; }
  TensorList forward(int64_t mb, const TensorList& inputs, const graph::ForwardOptions& options,
                     const CoreForward& core, MicroBatchSource& source) override;
  TensorList backward(int64_t mb, const TensorList& grads, const graph::ForwardOptions& options,
                      const CoreBackward& core, MicroBatchSource& source) override;
  double update(int64_t step) override;
  // Refused: the take-over is agreed at run time, for the one migration laid out before it.
  void add_migration(const Partition& next, int64_t first_backward,
                     const std::string& what) override;
  void restore_latest() override;
  void finish() override;
  LiveStageStats stats() const override { return stats_; }
  void add_layer_stats(StageMemoryStats* whole) const override;
  int64_t live_records() const override;
  std::vector<const graph::ParamStore*> stores() const override;

 private:
  bool in_hop() const { return role_ != Role::kNone; }
  bool upstream() const { return stage_ == std::min(move_.src, move_.tgt); }
  int64_t inputs() const { return move_.first_forward - move_.first_backward; }  // F - K, known
  void make_stores();
  // Target: takes the frozen state into the store once it has arrived (`block`: waits for it).
  bool take_state(bool block);
  // Both: K is known: the layout, and (target) the micro-batches whose backward replays here.
  void decided(int64_t k);
  void expect_inputs(int64_t up_to, MicroBatchSource& source);
  void send_control(int tag, int64_t value);
  int64_t receive_control(int tag, const std::string& waiter);
  void post_flush();
  void apply_flush(int64_t mb, int64_t step, const std::string& waiter);
  void step_layers(int64_t step);

  enum class Role { kNone, kSource, kTarget };
  ExecContext& ctx_;
  graph::Model& model_;
  int stage_;
  LiveMigrationConfig config_;
  graph::OptimizerConfig optimizer_;
  StageLayout layout_;  // the initial partition, then the migration once K is agreed
  LayerRange core_;
  BoundaryMove move_;  // src, tgt and the layers; K and F once agreed (-1 before)
  Role role_ = Role::kNone;
  std::string what_;
  std::unique_ptr<Communicator> transfer_comm_, control_comm_;
  std::unique_ptr<LiveTransfer> transfer_;
  std::deque<std::pair<Tensor, std::unique_ptr<Request>>> sends_;  // control messages in flight

  bool live_ = false;  // holds L now
  std::unique_ptr<graph::ParamStore> store_;
  std::unique_ptr<graph::Optimizer> optimizer_state_;
  std::unique_ptr<StageMemory> memory_;
  std::unique_ptr<WeightVersions> versions_;
  int64_t latest_ = 0;                  // updates applied to L
  std::map<int64_t, int64_t> pending_;  // micro-batch -> version: backward still to run here
  bool grads_pending_ = false;          // a backward of L ran since the last update
  int64_t last_backward_ = -1;          // the micro-batch of this stage's last backward
  int64_t last_step_ = 0;               // the step index of the last update
  bool state_posted_ = false, state_taken_ = false;
  bool acked_ = false;    // source (move down): the target said it holds the state
  int64_t expected_ = 0;  // target: items expected (the state is item 0)
  bool resumed_ = false, flushed_ = false;
  LiveStageStats stats_;
};

}  // namespace strata::parallel
