// One stage's side of a live layer migration under async-1f1b, inside the executor (vPIPE §3.3,
// ../shared/papers/vpipe.md; the protocol and its replay: parallel/runtime/live_protocol.h).
//
// The stage's layers that never move (its core: the layers of its range before and after the
// migration) stay in the executor's ParamStore. Each block of layers that moves between this
// stage and a neighbour (a BoundaryMove of parallel/runtime/stage_layout.h) has a ParamStore,
// optimizer, weight versions and saved-tensor records of its own on each side: on the source
// from the start of the run until the hand-off; the target makes its own when the run starts
// (LiveTransfer's prepare/ready) and runs the layers from the hand-off on. Which parts
// a micro-batch's forward and backward run is StageLayout's per-micro-batch ranges, so the
// pipeline never drains: the stages keep running async-1f1b's programs while the layers move.
//
// For a move of layers L from `src` to `tgt` whose first backward on tgt is micro-batch K
// (F = K + S - src - 1 is the first forward of L on tgt):
//   - src runs the forwards of L for micro-batches j < F and their backwards for j < K. For
//     j in [K, F) (S - src - 1 micro-batches, vPIPE's p - n - 1 copies) it posts L's inputs with
//     the weights of L that the forward used (weight stashing) to tgt, and drops its own saved
//     tensors of L for j: tgt recomputes them (the forward replayed on the same inputs, weights
//     and ForwardOptions is bitwise the one src ran, as the recompute memory policy relies on).
//   - after its update of Backward(K - 1) (L's last backward at src), src posts the hand-off: L's
//     parameters, optimizer state and buffers (running statistics: every forward of L at src,
//     j < F, ran before it), and frees L.
//   - tgt waits for the hand-off (posted after the inputs, so all of them are there) at the
//     first instruction that needs L: Backward(K) for a move down, Forward(F) for a move up. The
//     weights of each shipped micro-batch become a stashed version of L; for a move up the
//     version of micro-batch F - 1 (K - 1 updates) is the one Forward(F) needs by Eq. 4.
//   - tgt's Backward(j) of L for j in [K, F) replays L's forward from the shipped inputs on the
//     stashed version (running statistics restored afterwards), then runs L's backward.
// Every forward of L uses the version Eq. 4 gives for the stage that runs it
// (async_forward_version), checked against the versions the block holds; every update of L is
// applied once, in micro-batch order, on the stage that ran the backward. The bytes go through
// LiveTransfer (a low-priority thread, in chunks with a window).
//
// Several migrations per run (LiveMigrationConfig::then): each starts after the previous one has
// switched every boundary (StageLayout: its first backward K' > every F before it). The layers
// are cut into pieces: maximal runs of layers that have the same stage in every partition. The
// core is the layers a stage holds in every partition; each other piece a stage ever holds is a
// block on it, with its hops: the migrations in which the piece moves to or from the stage, in
// order, each a move as above (K and F of the boundary move the piece is part of). A block that
// hands off and comes back later (a move down, then up) makes its store again at its hand-off
// and is filled by the later one. Every hop has a communicator of its own, of its two stages (a
// split of the migration's, made for every hop in the same order on every stage), so the
// transfers of different hops between the same two stages never match each other's messages.
//
// G data-parallel groups (GroPipe): every group's pipeline moves the same layers at the same
// micro-batch (each group's stages migrate among themselves). At each update of a block, the
// stage that holds it (the source before the hand-off, the target from it) sums the block's
// gradients over the groups and averages its running statistics (sum, then x 1/G, as GroupedDp
// does for the core's) on a data-parallel communicator of its own, before the block's optimizer
// step. Every group's rank of a stage runs the same program over the same layout, so the blocks
// meet in the same order on all of them.
//
// Migrations decided while the run goes (LiveMigrationConfig::open; the trainer's --repartition):
// no partition after the initial one is known when the run starts, so every layer of the stage is
// a block of its own from the start and the core is empty (the stage's store holds no layer). A
// migration added at run time (add_migration, called by every stage of the pipeline at the same
// point of the run, with the same partition and K) gives each layer it moves a hop, as above; a
// layer that comes to this stage gets a block then. Its K must be after every forward any stage
// has run or posted a receive for (the caller's to choose), and after the previous migration's
// last forward switch (StageLayout checks that).
//
// A stage may keep none of its layers through a migration (the core is then empty: its forwards
// and backwards run only blocks), as long as every layer moves at most one stage.
//
// Limits (refused by the caller, named): float32 stores (no mixed
// precision), no gradient clipping or --nan-policy skip (a global norm over the blocks), no
// --dp-delay, the keep memory policy for the moved layers, no tied parameters in them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/exec_context.h"
#include "engine/tape.h"
#include "graph/model.h"
#include "graph/optimizer.h"
#include "graph/param_store.h"
#include "parallel/comm/communicator.h"
#include "parallel/runtime/live_transfer.h"
#include "parallel/runtime/micro_batch_source.h"
#include "parallel/runtime/moving_layers.h"
#include "parallel/runtime/stage_layout.h"
#include "parallel/runtime/stage_memory.h"
#include "parallel/runtime/weight_versions.h"

namespace strata::parallel {

// A later migration of the same run.
struct LiveMigrationStep {
  Partition next;              // the partition after it
  int64_t first_backward = 0;  // its K
  std::string what;            // names it in errors
};

struct LiveMigrationConfig {
  Partition initial;           // the stages' layers before the migration
  Partition next;              // and after it
  int64_t first_backward = 0;  // K: the first micro-batch whose moved layers run backward on tgt
  std::vector<LiveMigrationStep> then;  // later migrations, in order (each after the previous)
  Communicator* comm = nullptr;         // the migration's channel (a split of the pipeline's)
  LiveTransferConfig transfer;
  std::string what = "live migration";  // names the migration in errors
  // Makes (and initializes, as the run initializes every store) a store of layers [begin, end):
  // a source's moved layers at the start; a target's before the hand-off fills it.
  std::function<std::unique_ptr<graph::ParamStore>(size_t begin, size_t end)> make_store;
  // --migration dynpipe (parallel/runtime/live_pause.h): the moved layers' updates pause from
  // micro-batch first_backward (P) and the take-over is agreed at run time, within the run's
  // `micro_batches`.
  bool paused = false;
  int64_t micro_batches = 0;
  // Migrations are added while the run goes (LiveStage::add_migration); `next` and `then` are
  // unused.
  bool open = false;
  // Called after every layer the blocks run, as StageMemory's (the injector's slowdowns).
  LayerObserver layer_observer;
};

// Counters for tests and the run's report.
struct LiveStageStats {
  int64_t inputs_sent = 0;         // source: micro-batches whose moved layers' inputs went out
  int64_t inputs_received = 0;     // target
  int64_t replayed_backwards = 0;  // target: backwards of moved layers from shipped inputs
  int64_t handoffs_sent = 0, handoffs_received = 0;
  int64_t moved_updates = 0;  // updates of moved layers' blocks on this stage
  // Source: bytes of the block's storages (parameters, gradients, optimizer state, buffers)
  // released when the block went (their last owner was the block).
  size_t freed_bytes = 0;
  size_t bytes_sent = 0, bytes_received = 0;
  double handoff_wait_seconds = 0.0;  // target: blocked on the hand-off
  // Per migration (after finish()): bytes sent and received, seconds blocked on hand-offs.
  std::vector<size_t> migration_bytes;
  std::vector<double> migration_wait_seconds;
  // --migration dynpipe (micro-batches, -1: not on this stage): P, the updates paused from; K, the
  // first backward on the target (agreed at run time); R, the target's first update (it applies
  // every gradient buffered since P). Gradients buffered here, and those the flush brought.
  int64_t pause_at = -1, take_over = -1, resume = -1;
  int64_t buffered_grads = 0, flushed_grads = 0;
};

class LiveStage : public MovingLayers {
 public:
  // `stage` of the initial partition's stages. `dp` (not owned; null or one rank: one group):
  // this stage in every group, for the blocks' gradient and statistics all-reduces only.
  LiveStage(ExecContext& ctx, graph::Model& model, int stage, const LiveMigrationConfig& config,
            const graph::OptimizerConfig& optimizer, Communicator* dp = nullptr);
  ~LiveStage() override;
  LiveStage(const LiveStage&) = delete;
  LiveStage& operator=(const LiveStage&) = delete;

  // The layers no migration moves (the intersection of the stage's ranges in every partition;
  // empty, at the stage's first layer, when there is none or the migrations are open).
  static LayerRange core_range(const LiveMigrationConfig& config, int stage);
  // The partitions: the initial one, then after each migration.
  static std::vector<Partition> partitions(const LiveMigrationConfig& config);
  const StageLayout& layout() const override { return layout_; }
  // An open run's next migration (see the header's comment): to `next`, its first backward on the
  // new stages micro-batch `first_backward`; `what` names it in errors. Collective over the
  // migration's communicator.
  void add_migration(const Partition& next, int64_t first_backward,
                     const std::string& what) override;

  // MovingLayers (see there).
  TensorList forward(int64_t mb, const TensorList& inputs, const graph::ForwardOptions& options,
                     const CoreForward& core, MicroBatchSource& source) override;
  TensorList backward(int64_t mb, const TensorList& grads, const graph::ForwardOptions& options,
                      const CoreBackward& core, MicroBatchSource& source) override;
  // After the core's update of micro-batch `mb`'s backward (`step`: the optimizer step index):
  // updates the blocks whose backward ran; the source's hand-off. Returns the blocks' share of
  // the squared gradient norm.
  double update(int64_t step) override;
  // Puts the latest weights back into the blocks' stores (between programs).
  void restore_latest() override;
  // Checks that nothing is left (every block's records consumed, every transfer through).
  void finish() override;

  LiveStageStats stats() const override { return stats_; }
  void add_layer_stats(StageMemoryStats* whole) const override;
  int64_t live_records() const override;
  // The stores of the moved layers this stage holds now (the latest weights between programs).
  std::vector<const graph::ParamStore*> stores() const override;

 private:
  struct Hop;
  struct Block;
  // The block's stores (parameters, optimizer, saved tensors, weight versions), made afresh.
  void make_block_stores(Block& b);
  // The hop of layers [begin, end) in `whole`, a boundary move of migration `migration`, over
  // `comm` (of the hop's two stages).
  Hop make_hop(const BoundaryMove& whole, size_t begin, size_t end, size_t migration,
               Communicator& comm, const std::string& name);
  void receive_handoff(Block& b, const std::string& waiter, MicroBatchSource& source);
  void expect_items(Block& b, Hop& h, int64_t up_to, MicroBatchSource& source);
  void release_unneeded(Block& b);
  void hand_off(Block& b, const Tensor& before);
  // G > 1: the block's gradients summed and its statistics averaged over the groups.
  void reduce_over_groups(Block& b, int64_t step);

  ExecContext& ctx_;
  graph::Model& model_;
  int stage_;
  LiveMigrationConfig config_;
  graph::OptimizerConfig optimizer_;
  Communicator* dp_;
  StageLayout layout_;
  LayerRange core_;
  std::vector<std::unique_ptr<Communicator>> hop_comms_;  // this stage's hops' communicators
  std::vector<std::unique_ptr<Block>> blocks_;            // in layer order
  LiveStageStats stats_;
  // Over every layer of the model: the statistics of the blocks this stage handed off (their
  // StageMemory goes with them), without their bytes.
  StageMemoryStats handed_;
};

}  // namespace strata::parallel
