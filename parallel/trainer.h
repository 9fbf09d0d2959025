// The training driver of one rank: builds its stage of the model, runs the schedule's
// instruction list every step through the Executor, evaluates on the test split, and reports to
// an observer (on rank 0: the CLI's progress bar and metrics file; a user's program may bring its
// own). A single process is the layout G = 1 group x S = 1 stage with one micro-batch, and runs
// the same code.
//
// Layout: G data-parallel groups x S pipeline stages, world rank = g * S + s (parallel/topology.h).
// The global batch B is split into G group shards of B / G rows and each shard into M
// micro-batches. Runs with S * G * M > 1 drop the last partial batch of an epoch (so that every
// micro-batch has rows); the single-process run keeps it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/exec_context.h"
#include "graph/model.h"
#include "graph/optimizer.h"
#include "graph/param_store.h"
#include "io/dataset.h"
#include "io/proto/strata.pb.h"
#include "ops/cross_entropy.h"
#include "parallel/comm/communicator.h"
#include "parallel/grouped_dp.h"
#include "parallel/loss_scale.h"
#include "parallel/memory_replan.h"
#include "parallel/repartition_loop.h"
#include "parallel/runtime/executor.h"
#include "parallel/runtime/injector.h"
#include "parallel/runtime/memory_plan.h"
#include "parallel/runtime/update_sync.h"
#include "parallel/schedule/schedule.h"

namespace strata::parallel {

// What a step with a non-finite loss or gradient does: stop with an error naming the step and the
// first layer with a non-finite gradient, or skip the update (counted) and go on. Either way the
// parameters and optimizer state are left as they were before the step.
enum class NanPolicy { kAbort, kSkip };
NanPolicy parse_nan_policy(const std::string& name);  // abort|skip; throws otherwise
const char* nan_policy_name(NanPolicy policy);

// Checkpoints (graph/checkpoint.h, parallel/checkpointing.h). Synchronous schedules only.
struct CheckpointConfig {
  std::string dir;         // root of the step-NNNNNN/ directories; empty: no checkpoints
  int64_t save_every = 0;  // steps between checkpoints; 0: only at the end and on request
  int keep_last = 0;       // checkpoints kept in `dir` (0: all)
  // "": a fresh start. "auto": the newest complete checkpoint in `dir`, or a fresh start when
  // there is none. Otherwise a checkpoint directory, or a root whose newest one is taken.
  std::string resume;
};

// Requests from outside the training loop, typically signal handlers: counters that only grow
// (lock-free atomics, safe to increment in a signal handler). The trainer polls them at every step
// boundary and the ranks agree on the decision (an all-reduce of the maxima), so every rank stops
// or saves at the same step. With a world of several processes, every rank must have one (or
// none).
struct RunControl {
  std::atomic<int64_t> stop{0};  // write a checkpoint (when a directory is set), then stop
  std::atomic<int64_t> save{0};  // write a checkpoint and go on (each increment: one)
};

struct TrainConfig {
  int64_t epochs = 1;
  int64_t steps = 0;        // > 0: stop after this many optimizer steps (across epochs)
  int64_t batch_size = 64;  // the global batch
  uint64_t seed = 0;
  int64_t log_every = 50;  // steps between log records
  int64_t eval_every = 0;  // steps between evaluations; 0: after each epoch only
  int64_t eval_batch_size = 500;
  int num_workers = 2;  // data-loader threads
  graph::OptimizerConfig optimizer;
  ops::CrossEntropyOptions loss;
  // A safetensors file of weights to start from (fine-tuning) instead of the seed's
  // initialization, under Hugging Face / torchvision or Strata names (models/weight_files.h).
  // The whole file is checked against the whole model; each stage loads only its own layers.
  std::string init_weights;
  CheckpointConfig checkpoint;
  // --save-weights: the final weights of every layer as one safetensors file (Strata names),
  // written by rank 0 at the end of the run; empty: none.
  std::string save_weights;
  NanPolicy nan_policy = NanPolicy::kAbort;
  LossScaleConfig loss_scale;  // --loss-scale (parallel/loss_scale.h)
  // --precision bf16|fp16: the layers compute in this dtype on 16-bit working copies of the f32
  // master weights (graph/param_store.h); kF32: no mixed precision.
  DType compute_dtype = DType::kF32;
  RunControl* control = nullptr;  // may be null
};

// --migrate-at STEP:PARTITION (vPIPE's repartition, ../shared/papers/vpipe.md §2.3): before step
// `step` (after `step` optimizer steps) the stages hold the layers of `partition`.
struct Migration {
  int64_t step = 0;
  std::vector<std::pair<size_t, size_t>> partition;
};

// How the layers move (--migration): live keeps the pipeline running; restart drains it first
// (stop injecting micro-batches, finish those in flight, move, start again: the non-live
// baseline). Synchronous schedules flush at every step boundary, where both move the same way.
// dynpipe (async-1f1b): DynPipe's transparent migration, the moved layers' updates paused while
// their state goes behind training (parallel/runtime/live_pause.h).
enum class MigrationMode { kLive, kRestart, kDynpipe };
// live|restart|dynpipe; throws otherwise
MigrationMode parse_migration_mode(const std::string& name);
const char* migration_mode_name(MigrationMode mode);

struct PipelineConfig {
  int stages = 1;
  int groups = 1;
  int64_t micro_batches = 1;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  // Stage boundaries: one [begin, end) layer range per stage, in order. Empty: one stage holding
  // every layer (S = 1 only); tools/ resolves --partition into ranges.
  std::vector<std::pair<size_t, size_t>> partition;
  std::string trace_path;  // Chrome trace of every instruction (written by rank 0)
  // Gradient all-reduce across the groups (parallel/grouped_dp.h): overlap, buckets, delay.
  GradSyncConfig grad_sync;
  GradSyncObserver grad_sync_observer;  // tests: called on every rank's threads
  // What each layer's saved tensors do between its forward and backward: keep, swap to a host
  // pool, or recompute (parallel/runtime/memory_plan.h); one entry per model layer, empty: keep.
  MemoryPlan memory_plan;
  // --memory-policy auto: the plan is made again for every partition the stages move to (a
  // --migrate-at move, one the repartition loop decides), on world rank 0 by `memory_planner`
  // (only rank 0's is called: parallel/memory_replan.h), and shared with every rank before the
  // layers move. Set on every rank alike; the planner is needed on rank 0 only.
  bool replan_memory = false;
  MemoryPlanner memory_planner;
  size_t swap_pool_bytes = size_t{8} << 30;  // the host pool of each rank that swaps
  bool weight_cache = false;          // --weight-cache on: stashed weight versions in the host pool
  int swap_lead = 1;                  // SwapIn(mb) this many forwards/backwards before Backward(mb)
  int prefetch_layers = 2;            // swapped layers on their way back at once during a backward
  std::vector<Migration> migrations;  // by step
  MigrationMode migration = MigrationMode::kLive;
  // A live migration's transfer (parallel/runtime/live_transfer.h): chunks of this many bytes (0:
  // whole tensors), at most this many bytes in flight (0: no flow control).
  size_t migration_chunk_bytes = size_t{1} << 20;
  size_t migration_window_bytes = size_t{4} << 20;
  // With G > 1: how the replicas of a stage agree instead of the gradient all-reduce (empty: the
  // all-reduce). Made on every rank when run() starts (parallel/runtime/update_sync.h; SDPipe and
  // its baselines: parallel/sdpipe/sync_config.h). Each group then normalizes its loss by its own
  // batch and updates locally, and no step waits for every pipeline: the ranks agree on metrics
  // only at log points, epoch ends and the last step.
  UpdateSyncFactory update_sync;
  // --inject: slowdowns around Forward and Backward (parallel/runtime/injector.h).
  std::vector<InjectSpec> inject;
  // --repartition: vPIPE's repartition loop (parallel/repartition_loop.h); the asynchronous
  // schedules need --migration restart; all-reduce synchronization, no --migrate-at.
  RepartitionConfig repartition;
};

// Steps that will run with this config over a dataset of `train_size` samples.
int64_t total_steps(const TrainConfig& config, const PipelineConfig& pipeline, int64_t train_size);

struct StepRecord {
  int64_t step = 0;  // optimizer steps done (1 after the first)
  int64_t total_steps = 0;
  int64_t epoch = 0;
  double loss = 0.0;  // mean over the steps since the last record
  double lr = 0.0;
  double grad_norm = 0.0;
  double samples_per_s = 0.0;  // over the steps since the last record
  double elapsed_s = 0.0;      // training time so far (evaluation excluded)
  double eta_s = 0.0;          // training time left at the current rate
  int64_t skipped_steps = 0;   // updates skipped for a non-finite loss or gradient, so far
  double loss_scale = 0.0;     // --loss-scale: the scale of the next step (0: off)
  // PipelineConfig::update_sync: what it did in this epoch so far (rank 0's view).
  std::optional<SyncStats> sync;
};

struct EvalRecord {
  std::string split;  // "test"
  int64_t step = 0;
  int64_t epoch = 0;
  double loss = 0.0;
  double accuracy = 0.0;  // top-1
  double top5 = 0.0;      // top-5 (0 with fewer than 5 classes)
  int64_t samples = 0;
  double seconds = 0.0;
};

// Per rank, gathered on rank 0 at the end of a run.
struct StageReport {
  int rank = 0, group = 0, stage = 0;
  size_t first_layer = 0, end_layer = 0;
  double busy_seconds = 0.0;  // compute instructions
  // From the start of each step's program to the end of the step on every rank (the step's
  // metrics are summed over the world, which waits for the last rank): the same makespan for
  // every rank, as in the schedule's simulation, so a rank that finishes its part of a step early
  // counts the rest of the step as idle.
  double wall_seconds = 0.0;
  double idle_fraction() const { return wall_seconds > 0 ? 1.0 - busy_seconds / wall_seconds : 0; }
  // Memory (parallel/runtime/stage_memory.h): the rank's peak device bytes (its allocator, which
  // --mem-limit caps), the bytes its swap-outs moved to the host pool and that pool's peak, the
  // time spent replaying recomputed forwards and waiting for swapped tensors, and the most
  // micro-batches whose saved tensors it held at once.
  double peak_bytes = 0.0;
  double swapped_bytes = 0.0;
  double swap_pool_peak_bytes = 0.0;
  double recompute_seconds = 0.0;
  double swap_wait_seconds = 0.0;
  double max_micro_batches = 0.0;
  // --inject: the rank's sleeps (every kind), of which kind=slow and kind=grow, and how long
  // kind=load's threads ran.
  double injected_seconds = 0.0;
  double slow_seconds = 0.0;
  double grow_seconds = 0.0;
  double load_seconds = 0.0;
};

// The evaluation record from metrics summed over the ranks: {loss sum, rows counted, top-1 hits,
// top-5 hits} (parallel/stage_reports.cpp).
EvalRecord summed_eval_record(const std::vector<double>& sums, int64_t step, int64_t epoch,
                              double seconds);

// Every rank's report, in rank order, from each rank's own (`mine`, the fields but `rank`): one
// all-reduce over `world` (null: a single process), so every rank must call it.
std::vector<StageReport> gather_stage_reports(Communicator* world, int rank,
                                              const StageReport& mine);

// One rank's part of a step (TrainObserver::on_rank_step).
struct RankStepRecord {
  int64_t step = 0;  // optimizer steps done
  int rank = 0, group = 0, stage = 0;
  double busy_seconds = 0.0;  // this rank's compute instructions in the step
  double wall_seconds = 0.0;  // the step, from its start to the end of its metrics' sum
};

// A re-layout, on every stage (rank 0 reports it): the layers that changed stage, the bytes this
// rank sent and received for them, and how long the move took here.
struct MigrationRecord {
  int64_t step = 0;       // before this step (optimizer steps done)
  std::string moves;      // "blocks.3 0->1, ..."
  std::string partition;  // the new one, "embed-blocks.2,blocks.3-head"
  MigrationMode mode = MigrationMode::kLive;
  double bytes = 0.0;    // sent + received, summed over the ranks
  double seconds = 0.0;  // the slowest rank's
  // --migration dynpipe: the micro-batches of the pause (P), the take-over (K, agreed at run
  // time) and the target's first update of the moved layers (R); -1 otherwise.
  int64_t pause_at = -1, take_over = -1, resume = -1;
  // PipelineConfig::replan_memory: the memory plan made for the new partition, per stage.
  std::vector<StageMemoryPlanRecord> memory_plan;
};

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_step(const StepRecord& record) {}  // after every step (progress display)
  virtual void on_log(const StepRecord& record) {}   // every log_every steps and the last
  virtual void on_eval(const EvalRecord& record) {}
  virtual void on_migration(const MigrationRecord& record) {}
  virtual void on_repartition(const RepartitionRecord& record) {}   // --repartition's decisions
  virtual void on_monitor(const dynpipe::MonitorSample& sample) {}  // --monitor-interval-ms
  // On every rank that has an observer (the others above: rank 0 only), after every step, once
  // its update, log record and evaluation are done and before its checkpoint. Every rank calls it
  // at the same steps, so an observer may run collectives on a communicator of its own (made
  // before the Trainer): per-rank metrics, text samples from a pipeline's stages.
  virtual void on_rank_step(const RankStepRecord& record) {}
};

struct TrainSummary {
  int64_t first_step = 0;      // > 0: resumed from a checkpoint of that step
  int64_t steps = 0;           // the step the run ended at (counted from 0, not from first_step)
  int64_t samples = 0;         // training samples processed (all groups)
  double train_seconds = 0.0;  // evaluation excluded
  double wall_seconds = 0.0;
  std::optional<EvalRecord> last_eval;
  std::vector<StageReport> stages;  // rank 0: every rank's; others: their own
  // Mean idle fraction over the ranks: idle time / (ranks x makespan), the definition of
  // theoretical_bubble_fraction (parallel/schedule/schedule.h).
  double measured_bubble = 0.0;
  double theoretical_bubble = 0.0;  // the schedule's ideal idle fraction
  int64_t skipped_steps = 0;        // updates skipped (--nan-policy skip, loss-scale overflows),
                                    // resumed ones included
  int64_t overflow_steps = 0;       // of those, overflows of dynamic loss scaling (this run)
  double loss_scale = 0.0;          // the scale at the end (0: --loss-scale off)
  bool stopped = false;             // stopped early on a RunControl request
  std::string resumed_from;         // the checkpoint loaded, if any
  std::string last_checkpoint;      // the last checkpoint written, if any
  std::optional<SyncStats> sync;    // PipelineConfig::update_sync: the whole run (rank 0's view)
  double injected_seconds = 0.0;    // --inject: this rank's sleeps
};

// Where a run stands when a checkpoint is written: what its manifest says beside the layout and
// the optimizer (the Trainer's, and each job's of an array:
// parallel/arraypipe/array_checkpoints.h).
struct CheckpointRun {
  int64_t step = 0;  // optimizer steps done
  int64_t total = 0;
  int64_t per_epoch = 1;
  int64_t train_samples = 0;
  std::string dataset;
  int64_t samples_seen = 0;
};

// A checkpoint's manifest, everything but the tensors and the run's counters that only some runs
// have (skipped steps, the loss scale, delayed gradients: the caller sets those): the model, the
// layout of `pipeline`, `run`, and `config`'s optimizer with its state `slots`.
proto::CheckpointManifest describe_checkpoint(const proto::ModelSpec& spec,
                                              const graph::Model& model, const TrainConfig& config,
                                              const PipelineConfig& pipeline,
                                              const std::vector<std::string>& slots,
                                              const CheckpointRun& run, const std::string& reason);

// Makes the whole model (every rank builds it and keeps its stage's layers' parameters).
using ModelBuilder = std::function<std::unique_ptr<graph::Model>()>;

class Trainer {
 public:
  // Builds this rank's stage of the model described by `spec` (layers in pipeline.partition for
  // stage world->rank() % S) with parameters initialized from config.seed, or loaded from
  // config.init_weights. `world` has
  // groups * stages ranks; null for a single process. `test` may be null (no evaluation).
  // `observer` is called on world rank 0 only, but for on_rank_step (every rank that has one).
  // The context's allocator holds the stage.
  // With config.checkpoint.resume, the constructor also loads the checkpoint (collective).
  Trainer(ExecContext& ctx, const proto::ModelSpec& spec, std::shared_ptr<const io::Dataset> train,
          std::shared_ptr<const io::Dataset> test, const TrainConfig& config,
          const PipelineConfig& pipeline, Communicator* world, TrainObserver* observer);
  // The same for a model made in C++ (layers that no ModelSpec names: a program's own layers).
  // `build` must give every rank the same model.
  Trainer(ExecContext& ctx, const ModelBuilder& build, std::shared_ptr<const io::Dataset> train,
          std::shared_ptr<const io::Dataset> test, const TrainConfig& config,
          const PipelineConfig& pipeline, Communicator* world, TrainObserver* observer);
  ~Trainer();

  TrainSummary run();

  graph::Model& model() { return *model_; }
  graph::ParamStore& store() { return *store_; }
  int stage() const { return stage_; }
  int group() const { return group_; }
  // Optimizer steps already done when run() starts: the step of the checkpoint loaded, or 0.
  int64_t start_step() const { return start_step_; }

 private:
  EvalRecord evaluate(int64_t step, int64_t epoch);
  void make_communicators();
  // The communicator of the first and last stage when a tied parameter is split between them
  // (collective over the world; made again when a re-layout moves the tied layers).
  void make_tied_communicator();
  // The asynchronous schedule's program for this stage, one per step, cut at the --migrate-at
  // restarts (parallel/trainer_layout.cpp).
  std::vector<Program> async_programs(int64_t total_steps) const;
  // The asynchronous run's parts (parallel/trainer_layout.cpp). `first`: the run's partition at
  // its start (after a move, the prefetches of a plan made again go in). Stage `stage`'s
  // segments of the run of steps [begin, end) in `partition`; where the stretch that holds step
  // `step` ends (the next --migrate-at restart, or `total`); the first step e >= `next` at which
  // the stretch from `begin` can be cut once steps [begin, next) ran (every stage's segments of
  // those steps unchanged; -1: none before the stretch ends); and the segments of steps
  // [next, ...) replaced by those of the run cut at e, then of the run from e in `to`.
  using Ranges = std::vector<std::pair<size_t, size_t>>;
  std::vector<Program> async_stretch(int stage, int64_t begin, int64_t end, const Ranges& partition,
                                     const Ranges& first) const;
  int64_t async_stretch_end(int64_t step, int64_t total) const;
  int64_t async_cut_step(int64_t begin, int64_t next, int64_t total, const Ranges& first) const;
  void async_recut(std::vector<Program>* programs, int64_t begin, int64_t next, int64_t e,
                   int64_t total, const Ranges& to, const Ranges& first) const;
  // Moves the layers to `migration`'s partition (collective over the world; the executor gone).
  MigrationRecord relayout(const Migration& migration, Trace* trace);
  // --migrate-at (parallel/trainer_live.cpp): the partitions checked before training, and a live
  // migration inside an async-1f1b run: whether there is one, the layers of this stage's store
  // (its core), a store as the run makes them, the executor's configuration, and the final
  // layout's store once the run has drained (collective; the executor goes; a record per move
  // to the observer).
  void check_migrations(const PipelineConfig& pipeline);
  bool migrates_live() const;
  // What a live migration inside async-1f1b does not support, refused naming `what`.
  void check_live_limits(const PipelineConfig& pipeline, const std::string& what) const;
  // --repartition under async-1f1b with --migration live: the decided moves are added to the
  // running executor (an open live migration: LiveStage::add_migration). The step before which a
  // move from `from` to `to` decided with `earliest` goes (the run's program from step `begin`;
  // the previous move's last forward switch `last_forward`): the first whose first micro-batch
  // comes after every forward any stage has run once steps [begin, earliest) ran; -1 if the move
  // (its chain of one-stage moves, one_stage_steps) cannot end in the run.
  bool repartitions_live() const;
  void check_live_repartition() const;
  // The run's live moves: the moves, the last one's last forward switch (micro-batch), and the
  // step before which every layer of it has switched (the loop's window starts again there).
  struct LiveMoves {
    std::vector<Migration> moves;
    int64_t last_forward = -1, switched = -1;
  };
  // Every rank, when the loop tells it the move before step `e`: added to the running executor
  // (K: the first micro-batch of step e), as a chain of one-stage moves where a layer goes further
  // (each at the first step after the last forward switch of the one before). Before each step:
  // the partition in effect from each move's step on, and the window restarted once every layer
  // switched.
  void live_move_learned(LiveMoves* live, Executor& executor, const RepartitionLoop& loop,
                         int64_t e) const;
  void live_step_begins(LiveMoves* live, const Executor& executor, RepartitionLoop& loop,
                        int64_t step);
  int64_t live_apply_step(int64_t begin, int64_t earliest, int64_t total, int64_t last_forward,
                          const Partition& from, const Partition& to) const;
  std::pair<size_t, size_t> store_range() const;
  std::unique_ptr<graph::ParamStore> make_store(size_t begin, size_t end);
  std::unique_ptr<LiveMigrationConfig> live_migration_config();
  // `moves`: the live migrations the run made, from `initial` (the run's partition at its start;
  // copies: the trainer's own are cleared here).
  void settle_live_migration(std::unique_ptr<Executor>& executor, std::vector<Migration> moves,
                             Ranges initial);
  void resume();
  void check_resumable(const proto::CheckpointManifest& manifest) const;
  // The state slots holding a checkpoint's delayed gradients (--dp-delay), oldest first.
  static std::vector<std::string> delayed_slot_names(int64_t pending);
  proto::CheckpointManifest describe_run(int64_t step, int64_t total, int64_t per_epoch,
                                         int64_t samples, const std::string& reason) const;

  ExecContext& ctx_;
  std::shared_ptr<const io::Dataset> train_, test_;
  TrainConfig config_;
  PipelineConfig pipeline_;
  Communicator* world_;
  TrainObserver* observer_;
  int rank_ = 0, stage_ = 0, group_ = 0;
  std::unique_ptr<graph::Model> model_;
  std::unique_ptr<graph::ParamStore> store_;
  std::unique_ptr<Communicator> pipe_, dp_, dp_last_, tied_, eval_pipe_;
  std::unique_ptr<Communicator> migrate_;  // --migrate-at: the stages' exchange of moved layers
  // The host pool of swapped tensors (pinned memory on a GPU), when a layer of this stage swaps.
  std::unique_ptr<Allocator> swap_pool_;
  // Stream-ordered backends (nccl): a communicator per direction between neighbouring stages,
  // for training and for evaluation (StageComms links, parallel/runtime/executor.h).
  StageLinks links_, eval_links_;
  proto::ModelSpec spec_;
  ModelBuilder build_;              // another instance of the model (the final weights' writer)
  std::vector<std::string> slots_;  // optimizer state slot names
  int64_t start_step_ = 0;
  int64_t skipped_before_ = 0;  // skipped steps of the run that wrote the checkpoint
  int64_t samples_before_ = 0;  // samples seen by it
  int64_t resumed_pending_ = 0;
  LossScaler scaler_;
  int previous_log_rank_ = -2;  // the thread's log rank before this Trainer (set_thread_log_rank)
                                // // delayed gradients (--dp-delay) in the checkpoint loaded
  std::string resumed_from_;
};

}  // namespace strata::parallel
