// The runtime of `strata train --array` (issue 17, papers/arraypipe.md): K sibling jobs (their own
// lr, weight decay, momentum, batch size, seed) trained on one pipeline of S stages, one rank per
// stage (local threads or MPI processes).
//
// Each rank keeps one public layer structure for its stage and a Binder holding every job's block
// state (parallel/arraypipe/binder.h). An iteration runs one whole mini-batch of every job that
// still trains: the scheduler's task graph (--array-scheduler, parallel/arraypipe/scheduler.h)
// gives each stage the order of its 2K blocks, and the stage runs them in that order: the forward
// block of job j (the receives, forwards and sends of j's M micro-batches, M = --micro-batches,
// 1 by default: no micro-batching, as in the paper) and the backward block (receives, backwards,
// sends, then the job's optimizer update on this stage, just in time). Every block first binds the
// layers to the job's state. Each job has its own Executor, data loader (its batch size and
// seed) and pipeline communicators (split from the world), so the messages of different jobs
// never meet and any order the validator accepts runs without deadlock: sends never wait, and
// each stage's blocks keep the order of the schedule's start times, a topological order of the
// blocks. A job's update whose optimizer step meets the other stages (a tied parameter split
// between stages, whose gradient is summed between them) goes to the end of the iteration instead,
// every stage in job order, since a collective inside a block could wait on a block that the
// other stage schedules later.
//
// Per job, the arithmetic is that of the job trained alone with --schedule gpipe and the same
// --stages, partition and --micro-batches: the same programs (make_schedule's gpipe program cut
// between its forwards and its backwards), the same data order (the job's seed), the same dropout
// keys (seed, layer, step, sample) and the same updates, so each job ends bitwise equal to its
// solo run whatever the schedule.
//
// Checkpoints are per job, under DIR/job-j in a solo run's format, resumable alone or with the
// array (parallel/arraypipe/array_checkpoints.h). The memory manager (ArrayMemoryOptions::slots,
// parallel/arraypipe/state_slots.h) keeps K jobs' states on the device and the others in a host
// pool, moved before the blocks that need them; the arithmetic is the same.
//
// Gradient clipping (--clip-grad-norm) sums the norm over the stages inside the update: the
// updates then wait for the end of the iteration, as for a split tied parameter.
//
// Not supported with an array (refused by the CLI): several data-parallel groups, the async
// schedule's overlap, swap memory plans, nccl. --nan-policy applies to each job alone: under
// abort a job whose loss or gradient is not finite leaves the array; under skip its update is
// skipped (its global norm is summed over the stages inside the update, so its updates wait for
// the end of the iteration, as with clipping) and it goes on.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/exec_context.h"
#include "io/dataset.h"
#include "io/proto/strata.pb.h"
#include "parallel/arraypipe/binder.h"
#include "parallel/arraypipe/scheduler.h"
#include "parallel/arraypipe/state_slots.h"
#include "parallel/comm/communicator.h"
#include "parallel/trainer.h"

namespace strata::parallel::arraypipe {

// Reports on world rank 0.
class ArrayObserver {
 public:
  virtual ~ArrayObserver() = default;
  // Job `job`'s step record, every log_every steps of the job and at its last step.
  virtual void on_job_log(int job, const StepRecord& record) {}
  // Job `job`'s evaluation on the test split: at the end of each of its epochs, every
  // eval_every steps and at its last step, as its solo run evaluates.
  virtual void on_job_eval(int job, const EvalRecord& record) {}
  // A job stopped early (its loss is not finite): it leaves the array, the others go on.
  virtual void on_job_stopped(int job, int64_t step, const std::string& why) {}
};

// The memory manager (parallel/arraypipe/state_slots.h).
struct ArrayMemoryOptions {
  // Block-state slots per stage; 0 (or as many as the jobs): every job's state stays on the
  // device and nothing moves.
  int slots = 0;
  size_t host_pool_bytes = size_t{8} << 30;  // the limit of the host pool the others live in
  // Tests and benchmarks: every state copy lasts at least this long (CPU).
  std::chrono::microseconds copy_delay{0};
};

struct ArrayJobSummary {
  int64_t steps = 0;  // optimizer steps done
  double last_loss = std::nan("");
  bool stopped = false;  // left the array early (diverged)
  std::string why;
  std::string weights_path;     // --save-weights: this job's file
  std::string resumed_from;     // the checkpoint it resumed (empty: a fresh start)
  std::string last_checkpoint;  // the last one it wrote
  std::optional<EvalRecord> last_eval;
};

struct ArraySummary {
  ScheduleResult schedule;  // the first iteration's task graph (rank 0's decision)
  std::vector<ArrayJobSummary> jobs;
  int64_t iterations = 0;
  int64_t reschedules = 0;  // new task graphs after jobs left
  double train_seconds = 0.0;
  int64_t switches = 0;       // this rank's binder switches
  double busy_seconds = 0.0;  // this rank's blocks
  SlotStats slots;            // this rank's memory manager
  // Every rank's allocator peak (bytes; the device memory --mem-limit caps) and host pool peak.
  std::vector<double> peak_bytes, host_pool_peak_bytes;
};

// --save-weights PATH for job i: PATH with "-job-i" before its extension ("w.safetensors" ->
// "w-job-2.safetensors"; without an extension, appended).
std::string job_weights_path(const std::string& path, int job);

// Whether a tied parameter of `model` has its sides on different stages of `pipeline` (its
// summed gradient waits for the end of the iteration: the jobs' gradients stay on the device).
bool splits_tied_parameter(const graph::Model& model, const PipelineConfig& pipeline);

class ArrayTrainer {
 public:
  // `test` may be null (no evaluation). `jobs`: each job's resolved configuration (batch size,
  // seed, optimizer); steps, epochs, log_every, loss and save_weights come from each one too.
  // `pipeline`: the shared layout (one group; the partition resolved). `world`: S ranks, null for
  // one stage.
  ArrayTrainer(ExecContext& ctx, const proto::ModelSpec& spec,
               std::shared_ptr<const io::Dataset> train, std::shared_ptr<const io::Dataset> test,
               std::vector<TrainConfig> jobs, const PipelineConfig& pipeline,
               const SchedulerOptions& scheduler, Communicator* world, ArrayObserver* observer,
               const ArrayMemoryOptions& memory = {});
  // The same for a model made in C++ (benchmarks' timed layers); `build` gives every rank the
  // same model.
  ArrayTrainer(ExecContext& ctx, const ModelBuilder& build,
               std::shared_ptr<const io::Dataset> train, std::shared_ptr<const io::Dataset> test,
               std::vector<TrainConfig> jobs, const PipelineConfig& pipeline,
               const SchedulerOptions& scheduler, Communicator* world, ArrayObserver* observer,
               const ArrayMemoryOptions& memory = {});
  ~ArrayTrainer();

  ArraySummary run();
  Binder& binder() { return *binder_; }

 private:
  struct Job;
  // The task graph of the jobs `members` (array indices, in order), decided on rank 0 and sent to
  // every rank (collective); its blocks name the jobs by their array index.
  ScheduleResult make_task_graph(const std::vector<int>& members, const SchedulerOptions& options);
  void run_block(Job& job, const Block& block, int64_t step);
  void update(Job& job, int64_t step);
  // Forward only over the test split with the job's state, in evaluation mode (collective: every
  // rank, jobs in order, after the iteration, when no training message is in flight).
  EvalRecord evaluate(Job& job, int64_t step, int64_t epoch);
  // Per-job checkpoints (parallel/arraypipe/array_checkpoints.h); collective.
  void resume(Job& job);
  void save(Job& job, int64_t done);

  ExecContext& ctx_;
  proto::ModelSpec spec_;  // empty for a model from a builder
  ModelBuilder build_;
  std::shared_ptr<const io::Dataset> train_, test_;
  std::vector<TrainConfig> configs_;
  PipelineConfig pipeline_;
  SchedulerOptions scheduler_;
  Communicator* world_;
  ArrayObserver* observer_;
  int stage_ = 0;
  std::unique_ptr<graph::Model> model_;
  std::unique_ptr<Binder> binder_;
  std::unique_ptr<Allocator> host_pool_;
  std::unique_ptr<CopyEngine> copies_;
  std::unique_ptr<StateSlots> slots_;
  std::vector<std::unique_ptr<Job>> jobs_;
  bool deferred_updates_ = false;  // a tied parameter split between stages
  double busy_seconds_ = 0.0;
};

}  // namespace strata::parallel::arraypipe
