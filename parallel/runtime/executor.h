// The executor: runs one stage's instruction list (parallel/schedule/schedule.h).
//
// A stage is a contiguous range of the model's layers with its own ParamStore. The executor owns
// the per-micro-batch state (tapes, received activations and gradients, the last stage's loss
// gradient); its transfers with the neighbouring stages (receives posted ahead, sends kept alive
// until they complete, waits that name the instruction) are parallel/runtime/stage_transfers.h.
// With a trace, every instruction and transfer is recorded, so the trace shows whether transfers
// ran while the stage computed. On the last stage Forward also
// computes the loss: cross-entropy of the micro-batch divided by the normalizer of its optimizer
// step (the number of counted targets in the global batch), so that the micro-batch gradients add
// up to the gradient of the global mean, whatever the number of micro-batches and groups.
//
// The asynchronous schedule (async-1f1b) updates the weights after every backward. A micro-batch
// whose forward saw an older version of the weights runs its backward on that version: the
// executor stashes a copy of the weights whenever a version is still needed by a micro-batch in
// flight, and swaps it in for the backward (PipeDream's weight stashing). 2bw (PipeDream-2BW)
// updates once per step and runs the forwards and backwards of step t on the version of t - 1
// updates: at every update the executor keeps the version before it (the next step's) and drops
// the one before that, so a stage holds two versions at most (parallel/runtime/weight_versions.h).
//
// Instead of the all-reduce, an UpdateSync (ExecutorConfig::update_sync) may bring the replicas
// together after each local update (SDPipe, parallel/sdpipe/).
//
// Gradients across data-parallel groups (parallel/grouped_dp.h): with G > 1 the executor's
// GroupedDp all-reduces the stage's gradients bucket by bucket. The last Backward before a
// ReduceGrads (the step's last backward pass on this stage) carries a per-layer hook that
// launches each bucket as soon as its layers are done (--dp-overlap on); ReduceGrads launches
// whatever is left and OptimizerStep waits only for this stage's own all-reduces. With
// --dp-overlap off ReduceGrads first waits for every stage of the group to finish its backward
// (a barrier over the pipeline communicator), then launches every bucket and waits for them. Tied
// parameters split between stages are summed across those stages after the data-parallel sum.
// Without gradient clipping the optimizer step needs nothing from the other stages (the gradient
// norm is then reported through StepStats::grad_sq and summed by the trainer); with clipping it
// needs the global norm, an all-reduce over the pipeline.
//
// Mixed precision (a ParamStore whose layers compute in bf16 or f16, graph/param_store.h): the
// stage computes on 16-bit working weights, refreshed from the f32 masters at the start of every
// program and after every update of the asynchronous schedule; the first stage rounds floating
// inputs to 16 bits, activations and their gradients cross stages in 16 bits, the loss is f32.
// Every backward pass moves its 16-bit parameter gradients into the f32 master gradients (layer by
// layer when the data-parallel hook launches buckets early), so micro-batches accumulate in f32;
// running statistics go back to the masters before ReduceGrads averages them over the groups.
//
// CUDA stages. Ops run on the context's stream (the compute stream); transfers between stages
// run on streams of their own (parallel/runtime/stage_transfers.h, which also says why a
// stream-ordered backend posts its receives late and needs links between neighbouring stages);
// the tied-parameter and data-parallel all-reduces are ordered after the compute stream (their
// communicators' caller stream). The CPU path is the reference.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/exec_context.h"
#include "engine/tape.h"
#include "engine/uploader.h"
#include "graph/model.h"
#include "graph/optimizer.h"
#include "graph/param_store.h"
#include "ops/cross_entropy.h"
#include "parallel/comm/communicator.h"
#include "parallel/grouped_dp.h"
#include "parallel/runtime/copy_engine.h"
#include "parallel/runtime/injector.h"
#include "parallel/runtime/live_stage.h"
#include "parallel/runtime/memory_plan.h"
#include "parallel/runtime/micro_batch_source.h"
#include "parallel/runtime/stage_memory.h"
#include "parallel/runtime/stage_transfers.h"
#include "parallel/runtime/update_sync.h"
#include "parallel/runtime/weight_versions.h"
#include "parallel/schedule/schedule.h"

namespace strata::parallel {

class Trace;
}  // namespace strata::parallel

namespace strata::parallel {

struct ExecutorConfig {
  ScheduleKind kind = ScheduleKind::k1F1B;
  uint64_t seed = 0;
  ops::CrossEntropyOptions loss;
  graph::OptimizerConfig optimizer;
  int lookahead = 4;       // instructions ahead whose receives are posted early
  int64_t first_step = 0;  // optimizer steps already done (a resumed run)
  // All-reduce the gradient norm over the stages before every update even without clipping, so
  // that every stage skips the same non-finite updates (--nan-policy skip). Otherwise a stage's
  // update waits for no other stage.
  bool global_norm = false;
  GradSyncConfig grad_sync;             // the data-parallel all-reduce (G > 1)
  GradSyncObserver grad_sync_observer;  // tests: launches, all-reduces, backward ends
  // What each layer's saved tensors do between its forward and backward (keep, swap,
  // recompute: parallel/runtime/stage_memory.h); empty: keep every layer.
  MemoryPlan memory_plan;
  // The host pool swapped tensors go to (needed when a layer of the stage swaps), and how many
  // swapped layers are on their way back at once during a backward.
  Allocator* swap_pool = nullptr;
  int prefetch_layers = 2;
  // Replaces the data-parallel gradient all-reduce when set (not owned; synchronous schedules,
  // no data-parallel communicator): called when each update's last Backward begins and after
  // each OptimizerStep's local update (parallel/runtime/update_sync.h: SDPipe and its baselines).
  UpdateSync* update_sync = nullptr;
  // --inject (not owned; may be null): called before and after every Forward and Backward
  // (parallel/runtime/injector.h).
  Injector* injector = nullptr;
  // --weight-cache on (async-1f1b, 2bw): the stashed weight versions live in `swap_pool`, the
  // device caches the one the next instruction needs (parallel/runtime/weight_versions.h).
  bool weight_cache = false;
  // A live migration inside this async-1f1b run (not owned; null: none): the stage's store holds
  // its core layers, parallel/runtime/live_stage.h the moving ones.
  const LiveMigrationConfig* live = nullptr;
};

struct StepStats {
  // Last stage only (zero elsewhere): sum over micro-batches of their normalized losses, and the
  // counts for accuracy (top1/top5: evaluate() only).
  double loss = 0.0;
  int64_t counted = 0;
  int64_t top1 = 0;
  int64_t top5 = 0;
  // Every stage.
  double lr = 0.0;
  double grad_norm = 0.0;  // with clipping: global norm before clipping, at the last update
  double grad_sq = 0.0;    // this stage's share of the squared norm (tied copies once)
  int64_t optimizer_steps = 0;
  // Updates skipped for a non-finite gradient (graph::OptimizerConfig::skip_non_finite), and the
  // first parameter of this stage with one at the last of them (empty: finite here).
  int64_t skipped_steps = 0;
  std::string first_non_finite;
  // Forward, Backward, ReduceGrads, OptimizerStep, less the time they block in collectives (the
  // all-reduces of gradients and of the global gradient norm wait for the other ranks).
  double busy_seconds = 0.0;
  double wall_seconds = 0.0;  // the whole program, waits included
};

class Executor {
 public:
  Executor(ExecContext& ctx, graph::Model& model, graph::ParamStore& store, StageRange range,
           StageComms comms, const ExecutorConfig& config, Trace* trace = nullptr);
  ~Executor();

  // Runs one program: a step of a synchronous schedule, or a segment of the asynchronous one
  // (micro-batches may stay in flight from one segment to the next). Gradients must be zero
  // before the first Backward of an update (they are zeroed after every OptimizerStep).
  StepStats run(const Program& program, MicroBatchSource& source);
  // Waits for every send to complete and checks that no receive or micro-batch is left over: the
  // end of a synchronous step, or of an asynchronous run.
  void finish();
  // --dp-delay D > 0: applies the gradients still in flight at the end of a run (up to D
  // updates). Every rank must call it at the same point. Returns the updates applied.
  int64_t flush_gradients();
  // --dp-delay D > 0, for checkpoints (every rank at the same step boundary): the all-reduced
  // gradients still waiting to be applied, oldest first (at most D; empty without delay or with
  // one group), each laid out like the store's gradient buffer. Waits for their all-reduces.
  std::vector<Tensor> delayed_gradients();
  // Loss scaling (parallel/loss_scale.h): the loss gradient of the next Backward passes is
  // multiplied by `scale` and the next update divides the gradients by it. Synchronous schedules
  // without --dp-delay only; set between steps.
  void set_loss_scale(double scale);
  // A resumed run, before its first step: makes `reduced` (oldest first, as delayed_gradients()
  // returned them when the checkpoint was written) the pending gradients, so that the next
  // updates apply them as the interrupted run would have. The optimizer's step counter
  // (ExecutorConfig::first_step) must count applied gradients only.
  void restore_delayed_gradients(const std::vector<Tensor>& reduced);

  // Forward only, in evaluation mode, of micro-batches [first, first + count) (no tape kept):
  // RecvAct/Forward/SendAct in order. Returns the last stage's loss sum and counts.
  StepStats evaluate(int64_t first, int64_t count, MicroBatchSource& source);

  bool first_stage() const { return range_.stage == 0; }
  // `t` on this rank's device: itself when it is there already, else a copy (data-loader
  // batches are host tensors), ordered on the stream without waiting for the device
  // (engine/uploader.h).
  Tensor on_device(const Tensor& t) { return uploader_.upload(t); }
  bool last_stage() const { return range_.stage == range_.stages - 1; }
  int64_t optimizer_steps() const { return optimizer_steps_; }
  // The stage's saved-tensor records and what swap and recompute did so far.
  // A live migration: per-layer vectors over every layer of the model (first_layer 0), the
  // core's and the moved layers' (MovingLayers::add_layer_stats).
  StageMemoryStats memory_stats() const;
  CopyEngine::Stats copy_stats() const { return copies_ ? copies_->stats() : CopyEngine::Stats{}; }
  // Weight versions this stage held at once, at most (the store's and the stashed ones).
  int64_t weight_versions_peak() const { return versions_.peak(); }
  // The live migration's side of this stage (null without one).
  const MovingLayers* live() const { return live_.get(); }
  MovingLayers* live() { return live_.get(); }

 private:
  struct InFlight;
  void* compute_stream() const;
  void execute(const Instruction& in, MicroBatchSource& source, StepStats* stats);
  void execute_op(const Instruction& in, MicroBatchSource& source, StepStats* stats);
  void forward(int64_t mb, MicroBatchSource& source, bool training, StepStats* stats);
  void backward(int64_t mb, bool last_of_update, MicroBatchSource& source);
  graph::ForwardOptions training_options(int64_t mb, MicroBatchSource& source) const;
  void check_live() const;
  void reduce_gradients();
  void optimizer_step(StepStats* stats);
  void apply_update(StepStats* stats);
  // Adds the losses of the program's micro-batches (in their order) to stats->loss.
  void collect_losses(StepStats* stats);
  // Weight cache: prefetches the version of the next Forward or Backward after instruction i.
  void prefetch_weights(const Program& program, size_t i, MicroBatchSource& source);
  std::string describe(const Instruction& in) const { return transfers_.describe(in); }
  InFlight& state(int64_t mb);

  ExecContext& ctx_;
  graph::Model& model_;
  graph::ParamStore& store_;
  StageRange range_;
  StageComms comms_;
  ExecutorConfig config_;
  Trace* trace_;
  graph::Optimizer optimizer_;
  int64_t optimizer_steps_ = 0;
  double collective_seconds_ = 0.0;  // blocked in collectives, since construction

  std::map<int64_t, std::unique_ptr<InFlight>> in_flight_;
  StageTransfers transfers_;
  std::unique_ptr<CopyEngine> copies_;  // null when no layer of the stage swaps
  StageMemory memory_;
  // Weight stashing (async-1f1b, 2bw): versions still needed by micro-batches, and with the
  // weight cache the engine that moves them between the host and the device (declared first:
  // the versions' copies go before it).
  std::unique_ptr<CopyEngine> weight_copies_;
  WeightVersions versions_;
  // 2bw: the step of the first micro-batch this executor forwarded in training (the start of its
  // run: step t of the run uses the version of t - 1 updates since then), -1 before it.
  int64_t run_first_step_ = -1;
  int64_t run_first_version_ = 0;
  // Tied parameters split between the first and last stage: this store's gradient views.
  std::vector<Tensor> tied_grads_;
  bool tied_owner_side_ = false;
  // Data-parallel gradient all-reduce (null with one group); updates_ counts ReduceGrads.
  std::unique_ptr<GroupedDp> grouped_dp_;
  int64_t updates_ = 0;
  double loss_scale_ = 1.0;
  bool last_backward_ = false;  // the Backward being executed is the last before a ReduceGrads
  Uploader uploader_;           // batches to the device
  // The last stage's loss of each micro-batch of the running program, read when it ends.
  std::vector<Tensor> losses_;
  // The communicators whose caller stream this executor set (reset when it goes).
  std::vector<Communicator*> stream_users_;
  // G > 1: the live migration's all-reduces of the moved layers (a split of comms.dp).
  std::unique_ptr<Communicator> live_dp_;
  std::unique_ptr<MovingLayers> live_;  // LiveStage, or PausedStage (--migration dynpipe)
};

}  // namespace strata::parallel
