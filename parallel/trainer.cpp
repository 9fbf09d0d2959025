// One rank's training loop over the Executor.
//
// Synchronous schedules (gpipe, 1f1b): every step runs the stage's program for that step's M
// micro-batches and ends with ReduceGrads and OptimizerStep, so all ranks agree on the weights at
// step boundaries. The asynchronous schedules (async-1f1b, 2bw) run one program for the whole
// run, cut into segments of one step's updates (M, or 2bw's one) for reporting; segments overlap
// (no flush), which is the point.
//
// Metrics (loss, counts) live on the last stages; one all-reduce over the world per step sums
// them over the groups and hands them to rank 0, which reports. Evaluation runs on group 0 only
// (forward in evaluation mode, one micro-batch per evaluation batch, pipelined across batches on
// a separate communicator so its messages never meet the training ones).
//
// Resuming exactly. Step k reads batch (k mod P) of epoch (k div P) of an order drawn from
// (seed, epoch); dropout masks are keyed by (seed, layer, step, sample); the learning rate and
// AdamW's bias correction by the step. So a checkpoint of step k (parameters, buffers, optimizer
// state) plus the seed is the whole state: a resumed run continues at step k with the same
// micro-batch ids, data and random streams as the uninterrupted one, and ends bitwise equal on
// the CPU. Checkpoints are written at step boundaries, where a synchronous schedule has flushed.
#include "parallel/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <iomanip>
#include <sstream>

#include "engine/check.h"
#include "engine/cuda_runtime.h"
#include "engine/log.h"
#include "graph/model_spec.h"
#include "models/weight_files.h"
#include "parallel/checkpointing.h"
#include "parallel/final_weights.h"
#include "parallel/micro_batches.h"
#include "parallel/runtime/executor.h"
#include "parallel/trace.h"

namespace strata::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// The (owner, user) stages of the tied parameters whose two sides sit on different stages, if
// any; at most one such pair of stages is supported.
std::optional<std::pair<int, int>> split_tied_stages(const graph::Model& model,
                                                     const PipelineConfig& pipeline) {
  auto stage_of = [&](size_t layer) {
    int stage = 0;
    for (size_t s = 0; s < pipeline.partition.size(); ++s) {
      if (layer >= pipeline.partition[s].first && layer < pipeline.partition[s].second) {
        stage = static_cast<int>(s);
      }
    }
    return stage;
  };
  std::optional<std::pair<int, int>> split;
  for (const graph::Model::TiedParam& t : model.tied_params()) {
    const std::pair<int, int> stages{stage_of(t.owner), stage_of(t.user)};
    if (stages.first == stages.second) continue;
    STRATA_CHECK(!split || *split == stages)
        << "tied parameters split over more than one pair of stages are not supported";
    split = stages;
  }
  return split;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Sums `values` over the world (every rank must call it).
void world_sum(Communicator* world, std::vector<double>* values, const std::string& what) {
  if (world == nullptr || world->size() == 1) return;
  Tensor t = Tensor::from_vector(*values, {static_cast<int64_t>(values->size())});
  auto r = world->all_reduce(t);
  r->wait(world->timeout(), what);
  *values = t.to_vector<double>();
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace

NanPolicy parse_nan_policy(const std::string& name) {
  if (name == "abort") return NanPolicy::kAbort;
  if (name == "skip") return NanPolicy::kSkip;
  STRATA_THROW() << "unknown --nan-policy '" << name << "' (valid: abort, skip)";
}

const char* nan_policy_name(NanPolicy policy) {
  return policy == NanPolicy::kAbort ? "abort" : "skip";
}

int64_t total_steps(const TrainConfig& config, const PipelineConfig& pipeline, int64_t train_size) {
  STRATA_CHECK_GT(config.batch_size, 0) << "--batch-size must be positive";
  if (config.steps > 0) return config.steps;
  STRATA_CHECK_GT(config.epochs, 0) << "--epochs or --steps must be positive";
  const bool drop_last = pipeline.stages * pipeline.groups * pipeline.micro_batches > 1;
  const int64_t per_epoch = drop_last ? train_size / config.batch_size
                                      : (train_size + config.batch_size - 1) / config.batch_size;
  return config.epochs * per_epoch;
}

Trainer::Trainer(ExecContext& ctx, const proto::ModelSpec& spec,
                 std::shared_ptr<const io::Dataset> train, std::shared_ptr<const io::Dataset> test,
                 const TrainConfig& config, const PipelineConfig& pipeline, Communicator* world,
                 TrainObserver* observer)
    : Trainer(
          ctx, [&spec] { return graph::build_model(spec); }, std::move(train), std::move(test),
          config, pipeline, world, observer) {
  spec_ = spec;  // recorded in checkpoints (a model from a C++ builder has none)
  build_ = [spec] { return graph::build_model(spec); };
}

Trainer::Trainer(ExecContext& ctx, const ModelBuilder& build,
                 std::shared_ptr<const io::Dataset> train, std::shared_ptr<const io::Dataset> test,
                 const TrainConfig& config, const PipelineConfig& pipeline, Communicator* world,
                 TrainObserver* observer)
    : ctx_(ctx),
      train_(std::move(train)),
      test_(std::move(test)),
      config_(config),
      pipeline_(pipeline),
      world_(world),
      observer_(observer),
      build_(build),
      scaler_(config.loss_scale) {
  STRATA_CHECK(train_ != nullptr) << "Trainer needs a training dataset";
  if (scaler_.enabled()) {
    STRATA_CHECK(is_synchronous(pipeline.schedule))
        << "--loss-scale " << loss_scale_name(config.loss_scale)
        << " needs a synchronous schedule (gpipe, 1f1b): " << schedule_name(pipeline.schedule)
        << " updates between the steps where the scale is decided";
    STRATA_CHECK(pipeline.grad_sync.delay == 0)
        << "--loss-scale " << loss_scale_name(config.loss_scale) << " cannot be combined with "
        << "--dp-delay " << pipeline.grad_sync.delay
        << ": a delayed gradient would be unscaled by a later step's scale";
  }
  STRATA_CHECK(config.log_every > 0) << "--log-every must be positive";
  STRATA_CHECK(config.eval_every >= 0) << "--eval-every must be >= 0";
  const int S = pipeline.stages, G = pipeline.groups;
  STRATA_CHECK(S >= 1 && G >= 1) << "--stages and --groups must be at least 1";
  const int world_size = world != nullptr ? world->size() : 1;
  STRATA_CHECK_EQ(world_size, S * G) << "the world has " << world_size << " ranks but --groups "
                                     << G << " x --stages " << S << " needs " << S * G;
  STRATA_CHECK_GE(pipeline.micro_batches, 1) << "--micro-batches must be at least 1";
  STRATA_CHECK_EQ(config.batch_size % G, 0)
      << "--batch-size " << config.batch_size << " is not divisible by --groups " << G;
  STRATA_CHECK_EQ((config.batch_size / G) % pipeline.micro_batches, 0)
      << "--micro-batches " << pipeline.micro_batches << " does not divide the batch of each "
      << "group (" << config.batch_size << " / " << G << " = " << config.batch_size / G << ")";
  rank_ = world != nullptr ? world->rank() : 0;
  stage_ = rank_ % S;
  group_ = rank_ / S;
  model_ = build();
  STRATA_CHECK(model_ != nullptr && model_->size() > 0) << "Trainer: the model has no layers";
  // A vocabulary padded inside the engine: the loss counts the real classes (as train_step does).
  if (config_.loss.num_classes == 0) config_.loss.num_classes = model_->loss_classes();
  if (pipeline_.partition.empty()) {
    STRATA_CHECK_EQ(S, 1) << "a pipeline of " << S << " stages needs a partition";
    pipeline_.partition = {{0, model_->size()}};
  }
  STRATA_CHECK_EQ(static_cast<int>(pipeline_.partition.size()), S)
      << "the partition has " << pipeline_.partition.size() << " stages, --stages is " << S;
  size_t expect = 0;
  for (int s = 0; s < S; ++s) {
    const auto [b, e] = pipeline_.partition[s];
    STRATA_CHECK(b == expect && e > b && e <= model_->size())
        << "stage " << s << " has layers [" << b << ", " << e << "): stages must cover the "
        << model_->size() << " layers in order, each at least one layer";
    expect = e;
  }
  STRATA_CHECK_EQ(expect, model_->size()) << "the partition leaves layers after " << expect;
  check_migrations(pipeline);  // --migrate-at
  TrainConfig epoch = config;  // --repartition-every's default window (pipedream-re: an epoch)
  epoch.steps = 0, epoch.epochs = 1;
  pipeline_.repartition.every = RepartitionConfig::resolve_every(
      pipeline_.repartition, total_steps(epoch, pipeline, train_->size()));
  RepartitionLoop::check(pipeline_.repartition, is_synchronous(pipeline.schedule),
                         pipeline.migration == MigrationMode::kRestart,
                         pipeline_.memory_plan.uses(MemoryPolicy::kSwap, 0, model_->size()),
                         repartitions_live());
  if (repartitions_live()) check_live_repartition();
  STRATA_CHECK(pipeline.schedule != ScheduleKind::k2BW ||
               pipeline.micro_batches >= pipeline.stages - 1)
      << "--schedule 2bw needs --micro-batches >= --stages - 1 (got " << pipeline.micro_batches
      << " on " << pipeline.stages << " stages): with fewer, a forward would need a weight "
      << "version that is not generated yet";
  const auto [begin, end] = store_range();  // a live migration's core layers, or the stage's
  store_ = make_store(begin, end);
  // This thread's rank (local ranks are threads of one process; under MPI the same as the
  // process's), restored when the Trainer goes.
  previous_log_rank_ = set_thread_log_rank(world != nullptr && world->size() > 1 ? rank_ : -1);
  make_communicators();
  STRATA_CHECK(is_synchronous(pipeline.schedule) ||
               (config.checkpoint.dir.empty() && config.checkpoint.resume.empty()))
      << "checkpoints need a schedule that flushes at step boundaries (gpipe, 1f1b), not "
      << schedule_name(pipeline.schedule);
  // --dp-delay D: a checkpoint holds the all-reduced gradients not applied yet, per parameter
  // (see describe_run). A tied parameter split between stages has one gradient per side until
  // the update sums them, and a checkpoint keys both sides by the owner: refused rather than
  // resumed inexactly.
  const bool checkpointing = !config.checkpoint.dir.empty() || !config.checkpoint.resume.empty();
  if (pipeline.grad_sync.delay > 0 && checkpointing && pipeline.stages > 1) {
    const std::optional<std::pair<int, int>> split = split_tied_stages(*model_, pipeline);
    STRATA_CHECK(!split) << "--dp-delay " << pipeline.grad_sync.delay
                         << " with checkpoints: a tied parameter is split between stages "
                         << (split ? split->first : 0) << " and " << (split ? split->second : 0)
                         << ", whose delayed gradients a checkpoint cannot hold apart; keep its "
                            "layers on one stage (--partition) or drop --dp-delay";
  }
  if (pipeline.update_sync && pipeline.groups > 1) {
    // Replicas that differ between synchronizations: one stage's tied copy could drift from its
    // owner, a checkpoint would keep group 0's replica only, and the skips of loss scaling and
    // the delayed all-reduce need every pipeline to agree at every step.
    const std::optional<std::pair<int, int>> split = split_tied_stages(*model_, pipeline);
    STRATA_CHECK(!split) << "--sync other than allreduce: a tied parameter is split between "
                         << "stages " << (split ? split->first : 0) << " and "
                         << (split ? split->second : 0)
                         << ", whose replicas would be averaged apart; keep its layers on one "
                            "stage (--partition)";
    STRATA_CHECK(is_synchronous(pipeline.schedule))
        << "--sync other than allreduce needs a schedule that flushes every step (gpipe, 1f1b), "
           "not "
        << schedule_name(pipeline.schedule);
    STRATA_CHECK(pipeline.grad_sync.delay == 0)
        << "--dp-delay delays the gradient all-reduce, which --sync other than allreduce replaces";
    STRATA_CHECK(checkpointing == false)
        << "checkpoints (--checkpoint-dir, --resume) are not supported with --sync other than "
           "allreduce";
    STRATA_CHECK(!scaler_.enabled())
        << "--loss-scale needs every pipeline to agree at every step, which --sync other than "
           "allreduce avoids; use --precision bf16 or --loss-scale off";
  }
  STRATA_CHECK(config.checkpoint.save_every >= 0 && config.checkpoint.keep_last >= 0)
      << "--save-every and --keep-last must be >= 0";
  STRATA_CHECK(config.checkpoint.save_every == 0 || !config.checkpoint.dir.empty())
      << "--save-every needs --checkpoint-dir";
  // The optimizer's state exists from here on (zero), so that a checkpoint can fill it.
  slots_ = graph::optimizer_slot_names(config.optimizer);
  store_->ensure_state(slots_.size());
  // --dp-delay D over several groups: D more state slots, where the delayed gradients are put to
  // be written (and read back on resume).
  if (pipeline.grad_sync.delay > 0 && pipeline.groups > 1 && checkpointing) {
    store_->ensure_state(slots_.size() + static_cast<size_t>(pipeline.grad_sync.delay));
  }
  if (!config.checkpoint.resume.empty()) resume();
  // A run resumed past re-layouts starts in the layout of its step (checkpoints are keyed by
  // layer, so they load into any layout).
  const Migration* due = nullptr;
  for (const Migration& m : pipeline_.migrations) {
    if (m.step <= start_step_) due = &m;
  }
  if (due != nullptr && due->partition != pipeline_.partition) relayout(*due, nullptr);
}

Trainer::~Trainer() { set_thread_log_rank(previous_log_rank_); }

void Trainer::make_communicators() {
  if (world_ == nullptr || world_->size() == 1) return;
  pipe_ = world_->split(group_, stage_);
  dp_ = world_->split(stage_, group_);
  eval_pipe_ = pipe_->split(0, stage_);
  if (!pipeline_.migrations.empty() || pipeline_.repartition.policy != "off") {
    migrate_ = pipe_->split(0, stage_);
  }
  make_tied_communicator();
  // A stream-ordered backend (nccl) runs a communicator's transfers one after another: the
  // executors need a communicator per direction between neighbouring stages.
  if (pipeline_.stages > 1 && pipe_->stream_ordered()) {
    links_ = make_stage_links(*pipe_, stage_, pipeline_.stages);
    eval_links_ = make_stage_links(*eval_pipe_, stage_, pipeline_.stages);
  }
}

void Trainer::make_tied_communicator() {
  // Tied parameters whose owner and user sit on different stages.
  const std::optional<std::pair<int, int>> split = split_tied_stages(*model_, pipeline_);
  const int owner_stage = split ? split->first : -1, user_stage = split ? split->second : -1;
  const bool tied_here = owner_stage >= 0 && (stage_ == owner_stage || stage_ == user_stage);
  tied_ = world_->split(tied_here ? group_ : -1, stage_ == owner_stage ? 0 : 1);
}

EvalRecord Trainer::evaluate(int64_t step, int64_t epoch) {
  const auto start = Clock::now();
  std::vector<double> metrics(4, 0.0);  // loss sum, counted, top1, top5
  if (group_ == 0) {
    io::DataLoaderOptions options;
    options.batch_size = config_.eval_batch_size;
    options.allocator = &ctx_.host_allocator();  // page-locked on a GPU: uploaded in place
    options.num_workers = (stage_ == 0 || stage_ == pipeline_.stages - 1) ? config_.num_workers : 0;
    const bool loads = stage_ == 0 || stage_ == pipeline_.stages - 1;
    LoaderMicroBatches source(test_, options, 1, loads, nullptr, config_.loss.ignore_index);
    StageComms comms;
    comms.pipe = eval_pipe_.get();
    eval_links_.attach(&comms);
    ExecutorConfig ec;
    ec.seed = config_.seed;
    ec.loss = config_.loss;
    ec.optimizer = config_.optimizer;
    Executor executor(ctx_, *model_, *store_,
                      {stage_, pipeline_.stages, pipeline_.partition[stage_].first,
                       pipeline_.partition[stage_].second},
                      comms, ec);
    const StepStats s = executor.evaluate(0, source.steps_per_epoch(), source);
    executor.finish();
    metrics = {s.loss, static_cast<double>(s.counted), static_cast<double>(s.top1),
               static_cast<double>(s.top5)};
  }
  world_sum(world_, &metrics, "evaluation metrics");
  return summed_eval_record(metrics, step, epoch, seconds_since(start));
}

TrainSummary Trainer::run() {
  const auto wall_start = Clock::now();
  const int S = pipeline_.stages, G = pipeline_.groups;
  const int64_t M = pipeline_.micro_batches;
  const bool loads = stage_ == 0 || stage_ == S - 1;
  io::DataLoaderOptions options;
  options.batch_size = config_.batch_size;
  options.allocator = &ctx_.host_allocator();  // page-locked on a GPU: uploaded in place
  options.shuffle = true;
  options.seed = config_.seed;
  options.num_workers = loads ? config_.num_workers : 0;
  options.shard_index = group_;
  options.shard_count = G;
  options.drop_last = S * G * M > 1;
  // Synchronous schedules and 2bw normalize by the step's global batch; async-1f1b updates per
  // micro-batch, so each micro-batch is its own mean. Replicas that update locally
  // (PipelineConfig::update_sync) normalize by their group's batch.
  const bool local_updates = pipeline_.update_sync && G > 1;
  LoaderMicroBatches source(train_, options, M, loads,
                            stage_ == S - 1 && !local_updates ? dp_.get() : nullptr,
                            config_.loss.ignore_index, updates_per_step(pipeline_.schedule, M) > 1);
  const int64_t total = total_steps(config_, pipeline_, train_->size());
  const int64_t per_epoch = source.steps_per_epoch();
  if (start_step_ > 0) source.start_at(start_step_);

  std::unique_ptr<Trace> trace;
  if (!pipeline_.trace_path.empty()) trace = std::make_unique<Trace>(rank_, group_, stage_);
  // Local updates: the steps after which every rank meets (metrics, evaluation, requests from
  // outside); the others run without waiting for the other pipelines.
  const auto meets_after = [&](int64_t step) {
    return (step + 1) % config_.log_every == 0 || (step + 1) % per_epoch == 0 ||
           step + 1 == total ||
           (test_ != nullptr && config_.eval_every > 0 && (step + 1) % config_.eval_every == 0);
  };
  std::unique_ptr<UpdateSync> replica_sync;
  if (local_updates) {
    replica_sync = pipeline_.update_sync(
        {&ctx_, store_.get(), world_, dp_.get(), stage_, group_, S, G, total - start_step_,
         config_.seed, [&, first = start_step_](int64_t u) { return meets_after(first + u); }});
  }
  Injector injector(pipeline_.inject, rank_, world_ != nullptr ? world_->size() : 1, config_.seed);
  injector.set_device(ctx_.device());
  std::vector<std::string> layer_names;
  for (size_t i = 0; i < model_->size(); ++i) layer_names.push_back(model_->layer(i).name());
  injector.set_layer_names(layer_names);
  RepartitionLoop repartition(pipeline_.repartition, layer_names, rank_, stage_, S, G, total);
  repartition.describe(*model_, world_ != nullptr ? world_->size() : 1,
                       static_cast<double>(config_.batch_size / G), pipeline_.memory_planner);
  ExecutorConfig ec;
  ec.kind = pipeline_.schedule;
  ec.seed = config_.seed;
  ec.loss = config_.loss;
  ec.optimizer = config_.optimizer;
  ec.optimizer.schedule.total_steps = std::max(ec.optimizer.schedule.total_steps, total);
  // async-1f1b updates after every micro-batch: M updates a step. The schedule is given in steps
  // (--steps, --warmup-steps, --lr-step-size), so it runs M times slower in updates; counted in
  // steps, the learning rate would reach the end of a cosine after 1/M of the run.
  if (updates_per_step(pipeline_.schedule, M) > 1) {
    ec.optimizer.schedule.total_steps *= M;
    ec.optimizer.schedule.warmup_steps *= M;
    ec.optimizer.schedule.step_size *= M;
  }
  // --nan-policy skip keeps the weights of a bad step, which needs the gradient norm before the
  // update (so does loss scaling); under abort the updates compute it as they read the gradients
  // and a non-finite one stops the run after the update.
  ec.optimizer.skip_non_finite = config_.nan_policy == NanPolicy::kSkip || scaler_.enabled();
  // --nan-policy skip: every stage skips the same updates, so they agree on the global norm.
  // Loss scaling too: every stage skips an overflow alike.
  ec.global_norm = config_.nan_policy == NanPolicy::kSkip || scaler_.enabled();
  // Optimizer steps count applied gradients: a checkpoint's delayed ones are not applied yet.
  ec.first_step = start_step_ - resumed_pending_;
  ec.grad_sync = pipeline_.grad_sync;
  ec.grad_sync_observer = pipeline_.grad_sync_observer;
  ec.prefetch_layers = pipeline_.prefetch_layers;
  // The stage's executor, made again after every re-layout (--migrate-at) with the optimizer's
  // step count carried over.
  std::unique_ptr<Executor> executor;
  std::unique_ptr<LiveMigrationConfig> live = live_migration_config();  // async-1f1b, live
  auto make_executor = [&](int64_t first_step) {
    StageComms comms;
    comms.pipe = pipe_.get();
    comms.dp = local_updates ? nullptr : dp_.get();
    comms.tied = tied_.get();
    links_.attach(&comms);
    ExecutorConfig e = ec;
    e.first_step = first_step;
    e.memory_plan = pipeline_.memory_plan;  // made again for each partition (replan_memory)
    const auto [first_layer, end_layer] = pipeline_.partition[stage_];
    if ((pipeline_.weight_cache ||
         pipeline_.memory_plan.uses(MemoryPolicy::kSwap, first_layer, end_layer)) &&
        swap_pool_ == nullptr) {
      // Host memory for swapped tensors: pinned for a GPU (copies that overlap compute), plain
      // memory for the CPU's emulated device; its own limit, not counted against --mem-limit.
      if (ctx_.device().is_cuda()) {
        swap_pool_ = std::make_unique<cuda::PinnedHostAllocator>();
      } else {
        swap_pool_ = std::make_unique<CpuAllocator>();
      }
      swap_pool_->set_limit(pipeline_.swap_pool_bytes);
    }
    e.swap_pool = swap_pool_.get();
    e.update_sync = replica_sync.get();
    e.injector = injector.empty() ? nullptr : &injector;
    e.weight_cache = pipeline_.weight_cache;
    e.live = live.get();
    executor = std::make_unique<Executor>(ctx_, *model_, *store_,
                                          StageRange{stage_, S, first_layer, end_layer}, comms, e,
                                          trace.get());
  };
  make_executor(ec.first_step);
  if (resumed_pending_ > 0) {
    std::vector<Tensor> delayed;
    for (int64_t i = 0; i < resumed_pending_; ++i) {
      delayed.push_back(store_->state(slots_.size() + static_cast<size_t>(i)));
    }
    executor->restore_delayed_gradients(delayed);
  }

  // The programs: one per step, or the asynchronous runs cut into segments of M updates (one run
  // for the whole training, or one per stretch between re-layouts of --migration restart).
  const bool sync = is_synchronous(pipeline_.schedule);
  std::vector<Program> async_segments = sync ? std::vector<Program>() : async_programs(total);
  // --repartition: a decided move cuts the asynchronous run where it can drain (`stretch`: the
  // step the current run began at; parallel/trainer_layout.cpp).
  const Ranges first = pipeline_.partition;
  int64_t stretch = start_step_;
  // --repartition's live moves (async-1f1b, --migration live): added to the running executor.
  const bool live_repartition = repartitions_live();
  LiveMoves live_moves;
  if (live_repartition) {
    repartition.set_apply_step([&](int64_t earliest, const Partition& from, const Partition& to) {
      return live_apply_step(stretch, earliest, total, live_moves.last_forward, from, to);
    });
  } else if (!sync) {
    repartition.set_apply_step([&](int64_t earliest, const Partition&, const Partition&) {
      return async_cut_step(stretch, earliest, total, first);
    });
  }
  StageMemoryStats memory;  // over the executors of every layout this run had
  auto settle = [&] {       // a live migration's run drained: the final layout's store
    executor->finish();
    add_memory_counters(executor->memory_stats(), &memory);
    const int64_t steps_done = executor->optimizer_steps();
    settle_live_migration(executor, live_repartition ? live_moves.moves : pipeline_.migrations,
                          live_repartition ? first : pipeline_.partition);  // records: observer
    live.reset();
    make_executor(steps_done);
  };
  TrainSummary summary;
  summary.first_step = start_step_;
  summary.resumed_from = resumed_from_;
  summary.skipped_steps = skipped_before_;
  summary.steps = start_step_;
  if (start_step_ >= total && rank_ == 0) {
    STRATA_LOG(INFO) << "the checkpoint's step " << start_step_
                     << " is at or past the end of the run (" << total
                     << " steps): nothing to train";
  }
  const CheckpointConfig& ckpt = config_.checkpoint;
  int64_t saves_handled = 0;  // RunControl::save requests already honoured
  StageReport report{
      rank_, group_, stage_, pipeline_.partition[stage_].first, pipeline_.partition[stage_].second,
      0.0,   0.0};
  double train_seconds = 0.0, interval_loss = 0.0, interval_seconds = 0.0;
  int64_t interval_steps = 0, interval_samples = 0, interval_counted = 0;
  // Local updates: this rank's step metrics since the ranks last agreed, and the sync counters
  // at the start of the epoch.
  std::vector<double> unagreed(4, 0.0);
  int64_t unagreed_steps = 0;
  SyncStats epoch_sync;
  injector.start();
  for (int64_t step = start_step_; step < total; ++step) {
    const int64_t epoch = step / per_epoch;
    const auto step_start = Clock::now();
    // --migrate-at: the layers change stage before this step (a synchronous pipeline is empty
    // here; an asynchronous one drained at the end of the last segment).
    std::vector<Migration> moves;
    for (const Migration& m : pipeline_.migrations) {
      if (m.step == step && live == nullptr) moves.push_back(m);
    }
    if (live_repartition) {
      live_step_begins(&live_moves, *executor, repartition, step);
    } else if (const auto p = repartition.due(step)) {
      moves.push_back({step, *p});  // --repartition
    }
    for (const Migration& m : moves) {
      if (trace != nullptr) trace->record_span("migration", step_start, step_start);
      const int64_t steps_done = executor->optimizer_steps();
      executor->finish();
      add_memory_counters(executor->memory_stats(), &memory);
      executor.reset();               // it holds the store that is about to be replaced
      injector.at_migration(m.step);  // --inject kind=fail,at=migration
      const MigrationRecord record = relayout(m, trace.get());
      make_executor(steps_done);
      repartition.migrated();
      stretch = step;
      if (rank_ == 0 && observer_ != nullptr) observer_->on_migration(record);
    }
    Program program = sync ? make_schedule(pipeline_.schedule, S, M, step).programs[stage_]
                           : async_segments[step];
    if (sync && pipeline_.memory_plan.uses(MemoryPolicy::kSwap, pipeline_.partition[stage_].first,
                                           pipeline_.partition[stage_].second)) {
      add_prefetches(&program, pipeline_.swap_lead);
    }
    executor->set_loss_scale(scaler_.scale());
    StepStats stats = executor->run(program, source);
    if (live != nullptr && step + 1 == total) settle();
    if (step + 1 == total) executor->flush_gradients();  // --dp-delay: the last D gradients
    if (step + 1 == total && replica_sync) replica_sync->finish();  // the mean of the replicas
    if (sync) executor->finish();
    source.release_before(sync ? step + 1 : std::max<int64_t>(0, step - 1));
    report.busy_seconds += stats.busy_seconds;
    // Loss and counts from the last stages; samples from the loader's arithmetic; skipped
    // updates; the gradient norm: every stage's share, counted once (group 0; replicas agree).
    std::vector<double> m{stats.loss, static_cast<double>(stats.counted),
                          static_cast<double>(stats.skipped_steps),
                          group_ == 0 ? stats.grad_sq : 0.0};
    const bool epoch_ends = (step + 1) % per_epoch == 0 || step + 1 == total;
    const bool log_now =
        (step + 1) % config_.log_every == 0 || step + 1 == total || (local_updates && epoch_ends);
    const bool agree = !local_updates || log_now;
    int64_t steps_agreed = 1;
    if (local_updates) {
      // Each group's loss is its own mean: the mean over the groups and the steps since the
      // ranks last agreed, summed over the world only now.
      for (size_t i = 0; i < m.size(); ++i) unagreed[i] += m[i];
      ++unagreed_steps;
      if (agree) {
        m = unagreed;
        world_sum(world_, &m, "step metrics");
        steps_agreed = unagreed_steps;
        m[0] /= static_cast<double>(G * steps_agreed);
        m[3] /= static_cast<double>(steps_agreed);
        std::fill(unagreed.begin(), unagreed.end(), 0.0);
        unagreed_steps = 0;
      }
    } else {
      // --repartition: the window's statistics, or the decision, ride on the same sum.
      const auto decided = repartition.exchange(
          step, executor->memory_stats(), stats.busy_seconds, pipeline_.partition, &m,
          [&](std::vector<double>* v) { world_sum(world_, v, "step metrics"); });
      if (decided && observer_ != nullptr && rank_ == 0) observer_->on_repartition(*decided);
      if (const auto e = repartition.learned(step); e && live_repartition) {
        live_move_learned(&live_moves, *executor, repartition, *e);
      } else if (e && !sync) {
        async_recut(&async_segments, stretch, step + 1, *e, total, *repartition.due(*e), first);
      }
      for (const auto& sample : repartition.fresh_samples()) {  // --monitor-interval-ms
        if (observer_ != nullptr && rank_ == 0) observer_->on_monitor(sample);
      }
    }
    stats.grad_norm = std::sqrt(std::max(m[3], 0.0));
    // The step ends for every rank when the last one is done (the sum above waited for it).
    report.wall_seconds += seconds_since(step_start);
    // async-1f1b: M updates per segment, each loss the mean of its micro-batch over the groups.
    const double loss =
        !agree ? 0.0 : m[0] / static_cast<double>(updates_per_step(pipeline_.schedule, M));
    const bool skipped = agree && m[2] > 0;
    // Dynamic loss scaling: a non-finite gradient with a finite loss is the scaled gradient
    // overflowing: skipped like --nan-policy skip, whatever the policy, and the scale halves.
    // The first parameter with a non-finite gradient (collective: on a skipped step, every rank
    // calls it): ranks in order are group 0's stages in order.
    auto first_non_finite = [&] {
      for (const std::string& n : all_gather_strings(world_, stats.first_non_finite)) {
        if (!n.empty()) return n;
      }
      return std::string();
    };
    const bool overflow = skipped && std::isfinite(loss) && scaler_.absorbs_overflow();
    if (overflow) {
      const std::string first = first_non_finite();
      const double was = scaler_.scale();
      scaler_.update(true);
      ++summary.skipped_steps;
      ++summary.overflow_steps;
      if (rank_ == 0) {
        STRATA_LOG(WARN) << "step " << step + 1 << " (epoch " << epoch + 1
                         << "): the gradient overflowed at loss scale " << was
                         << (first.empty() ? "" : " (first in parameter " + first + ")")
                         << ": update skipped, loss scale now " << scaler_.scale() << " ("
                         << summary.skipped_steps << " skipped so far)";
      }
    } else if (skipped || !std::isfinite(loss)) {
      const std::string first = skipped ? first_non_finite() : std::string();
      std::ostringstream what;
      what << "step " << step + 1 << " (epoch " << epoch + 1 << "): the loss is " << loss;
      if (skipped) {
        what << " and the gradient is not finite"
             << (first.empty() ? "" : ", first in parameter " + first);
      }
      if (!skipped || config_.nan_policy != NanPolicy::kSkip) {
        STRATA_THROW()
            << what.str() << "; "
            << (skipped ? "training stops (--nan-policy abort)" : "training diverged")
            << ": lower --lr, set --clip-grad-norm, or --nan-policy skip to skip such steps";
      }
      // Local updates: the pipelines' skipped updates since the ranks last agreed (each counted
      // by its S stages).
      summary.skipped_steps +=
          local_updates ? std::max<int64_t>(1, std::llround(m[2] / S)) : int64_t{1};
      if (rank_ == 0) {
        STRATA_LOG(WARN) << what.str() << ": update skipped (--nan-policy skip; "
                         << summary.skipped_steps << " skipped so far)";
      }
    }
    if (!skipped && scaler_.update(false) && rank_ == 0) {
      STRATA_LOG(DEBUG) << "step " << step + 1 << ": loss scale raised to " << scaler_.scale();
    }
    const double dt = seconds_since(step_start);
    const int64_t samples = source.group_rows(step) * G;
    train_seconds += dt;
    if (!skipped && agree) {
      interval_loss += loss * static_cast<double>(steps_agreed);
      interval_counted += steps_agreed;
    }
    interval_seconds += dt;
    ++interval_steps;
    interval_samples += samples;
    summary.samples += samples;
    if (rank_ == 0 && observer_ != nullptr) {
      StepRecord r;
      r.step = step + 1;
      r.total_steps = total;
      r.epoch = epoch;
      r.loss = interval_counted > 0 ? interval_loss / static_cast<double>(interval_counted)
                                    : std::nan("");
      r.skipped_steps = summary.skipped_steps;
      r.loss_scale = scaler_.enabled() ? scaler_.scale() : 0.0;
      r.lr = stats.lr;
      r.grad_norm = stats.grad_norm;
      r.samples_per_s = interval_seconds > 0 ? interval_samples / interval_seconds : 0.0;
      r.elapsed_s = train_seconds;
      r.eta_s = train_seconds / static_cast<double>(step + 1 - start_step_) *
                static_cast<double>(total - step - 1);
      if (replica_sync) r.sync = replica_sync->stats().since(epoch_sync);
      observer_->on_step(r);
      if (log_now) observer_->on_log(r);
    }
    if (replica_sync && epoch_ends) epoch_sync = replica_sync->stats();
    if (log_now) {
      interval_loss = interval_seconds = 0.0;
      interval_steps = interval_samples = interval_counted = 0;
    }
    const bool epoch_end = (step + 1) % per_epoch == 0 || step + 1 == total;
    const bool periodic = config_.eval_every > 0 && (step + 1) % config_.eval_every == 0;
    if (test_ != nullptr && (epoch_end || periodic)) {
      if (!sync && step + 1 == total) executor->finish();  // the async run drains first
      summary.last_eval = evaluate(step + 1, epoch);
      if (rank_ == 0 && observer_ != nullptr) observer_->on_eval(*summary.last_eval);
    }
    summary.steps = step + 1;
    if (observer_ != nullptr) {
      observer_->on_rank_step({step + 1, rank_, group_, stage_, stats.busy_seconds, dt});
    }

    // Requests from outside (signals), agreed on by every rank (with local updates only where the
    // ranks meet anyway: a stop or save waits for the next log point).
    bool stop = false, save_requested = false;
    if (config_.control != nullptr && (!local_updates || meets_after(step))) {
      Tensor c = Tensor::from_vector<int64_t>(
          {config_.control->stop.load(), config_.control->save.load()}, {2});
      if (world_ != nullptr && world_->size() > 1) {
        world_->all_reduce(c, ReduceOp::kMax)->wait(world_->timeout(), "stop and save requests");
      }
      stop = c.data<int64_t>()[0] > 0;
      save_requested = c.data<int64_t>()[1] > saves_handled;
      saves_handled = c.data<int64_t>()[1];
    }
    const int64_t done = step + 1;
    const bool due = ckpt.save_every > 0 && done % ckpt.save_every == 0;
    if (!ckpt.dir.empty() && (due || save_requested || stop || done == total)) {
      const std::string reason = stop             ? "stop request"
                                 : save_requested ? "save request"
                                 : done == total  ? "end of training"
                                                  : "periodic";
      proto::CheckpointManifest manifest =
          describe_run(done, total, per_epoch, samples_before_ + summary.samples, reason);
      manifest.mutable_run()->set_skipped_steps(summary.skipped_steps);
      if (scaler_.dynamic()) {
        manifest.mutable_run()->set_loss_scale(scaler_.scale());
        manifest.mutable_run()->set_loss_scale_good_steps(scaler_.good_steps());
      }
      // --dp-delay: the gradients all-reduced but not applied yet go into the state slots after
      // the optimizer's (every group holds the same ones; group 0 writes them).
      const std::vector<Tensor> delayed = executor->delayed_gradients();
      for (size_t i = 0; i < delayed.size(); ++i)
        store_->state(slots_.size() + i).copy_from(delayed[i]);
      std::vector<std::string> slots = slots_;
      for (std::string& n : delayed_slot_names(static_cast<int64_t>(delayed.size()))) {
        slots.push_back(std::move(n));
      }
      manifest.mutable_run()->set_dp_delay(pipeline_.grad_sync.delay);
      manifest.mutable_run()->set_dp_pending(static_cast<int32_t>(delayed.size()));
      const SavedCheckpoint saved = save_checkpoint(world_, ckpt.dir, done, ckpt.keep_last,
                                                    manifest, *store_, slots, group_ == 0);
      summary.last_checkpoint = saved.path;
      if (rank_ == 0) {
        std::string pruned;
        for (const std::string& p : saved.pruned) pruned += (pruned.empty() ? "" : ", ") + p;
        STRATA_LOG(INFO) << "checkpoint " << saved.path << " (" << reason << ", "
                         << mib(saved.bytes) << " in " << std::fixed << std::setprecision(3)
                         << saved.seconds << " s)" << (pruned.empty() ? "" : "; removed " + pruned);
      }
    } else if (save_requested && rank_ == 0) {
      STRATA_LOG(WARN) << "a checkpoint was requested at step " << done
                       << " but no checkpoint directory is set: ignored";
    }
    if (stop) {
      if (rank_ == 0) {
        STRATA_LOG(INFO) << "stopping at step " << done << " of " << total << " on request"
                         << (ckpt.dir.empty() ? " (no checkpoint directory: nothing saved)" : "");
      }
      summary.stopped = true;
      break;
    }
  }
  if (replica_sync) {
    replica_sync->finish();  // a run stopped early
    if (rank_ == 0) summary.sync = replica_sync->stats();
  }
  injector.stop_load();
  summary.injected_seconds = injector.stats().seconds;
  if (live != nullptr) settle();  // a run stopped early
  executor->finish();

  // Per-stage utilization and memory, gathered on every rank (reported by rank 0).
  add_memory_counters(executor->memory_stats(), &memory);
  StageReport mine{rank_,
                   group_,
                   stage_,
                   pipeline_.partition[stage_].first,
                   pipeline_.partition[stage_].second,
                   report.busy_seconds,
                   report.wall_seconds};
  mine.peak_bytes = static_cast<double>(ctx_.allocator().stats().peak);
  mine.swapped_bytes = static_cast<double>(memory.swapped_out_bytes);
  mine.swap_pool_peak_bytes = swap_pool_ ? static_cast<double>(swap_pool_->stats().peak) : 0.0;
  mine.recompute_seconds = memory.recompute_seconds;
  mine.swap_wait_seconds = memory.swap_wait_seconds;
  mine.max_micro_batches = static_cast<double>(memory.max_micro_batches);
  mine.injected_seconds = injector.stats().seconds;
  mine.slow_seconds = injector.stats().slow_seconds;
  mine.grow_seconds = injector.stats().grow_seconds;
  mine.load_seconds = injector.stats().load_seconds;
  summary.stages = gather_stage_reports(world_, rank_, mine);
  double idle = 0.0;
  for (const StageReport& s : summary.stages) idle += s.idle_fraction();
  const int n = static_cast<int>(summary.stages.size());
  summary.measured_bubble = idle / n;
  summary.theoretical_bubble = theoretical_bubble_fraction(pipeline_.schedule, S, M);
  if (!config_.save_weights.empty()) {
    const std::unique_ptr<graph::Model> full = rank_ == 0 ? build_() : nullptr;
    std::map<std::string, std::string> metadata;
    if (spec_.layer_size() > 0) {
      metadata[models::kWeightsModelSpecKey] = graph::model_spec_to_text(spec_);
    }
    metadata["strata.step"] = std::to_string(summary.steps);
    save_final_weights(world_, stage_, group_, *model_, *store_, full.get(), config_.save_weights,
                       metadata);
  }
  if (trace != nullptr) {
    const std::vector<std::string> events = all_gather_strings(world_, trace->events_json());
    if (rank_ == 0) Trace::write_file(pipeline_.trace_path, events);
  }
  summary.train_seconds = train_seconds;
  summary.loss_scale = scaler_.enabled() ? scaler_.scale() : 0.0;
  summary.wall_seconds = seconds_since(wall_start);
  return summary;
}

}  // namespace strata::parallel
