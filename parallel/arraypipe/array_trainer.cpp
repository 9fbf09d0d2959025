#include "parallel/arraypipe/array_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "engine/check.h"
#include "engine/cuda_runtime.h"
#include "engine/log.h"
#include "graph/model_spec.h"
#include "models/weight_files.h"
#include "parallel/arraypipe/array_checkpoints.h"
#include "parallel/checkpointing.h"
#include "parallel/final_weights.h"
#include "parallel/micro_batches.h"
#include "parallel/runtime/executor.h"

namespace strata::parallel::arraypipe {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Sums `values` over the world (every rank must call it).
void world_sum(Communicator* world, std::vector<double>* values, const std::string& what) {
  if (world == nullptr || world->size() == 1) return;
  Tensor t = Tensor::from_vector(*values, {static_cast<int64_t>(values->size())});
  world->all_reduce(t)->wait(world->timeout(), what);
  *values = t.to_vector<double>();
}

int stage_of_layer(const PipelineConfig& pipeline, size_t layer) {
  for (size_t s = 0; s < pipeline.partition.size(); ++s) {
    if (layer >= pipeline.partition[s].first && layer < pipeline.partition[s].second) {
      return static_cast<int>(s);
    }
  }
  return 0;
}

// The (owner, user) stages of a tied parameter whose sides sit on different stages, if any.
std::optional<std::pair<int, int>> split_tied(const graph::Model& model,
                                              const PipelineConfig& pipeline) {
  for (const graph::Model::TiedParam& t : model.tied_params()) {
    const int a = stage_of_layer(pipeline, t.owner), b = stage_of_layer(pipeline, t.user);
    if (a != b) return std::make_pair(a, b);
  }
  return std::nullopt;
}

bool is_update(OpCode op) { return op == OpCode::kReduceGrads || op == OpCode::kOptimizerStep; }

}  // namespace

bool splits_tied_parameter(const graph::Model& model, const PipelineConfig& pipeline) {
  return pipeline.partition.size() > 1 && split_tied(model, pipeline).has_value();
}

std::string job_weights_path(const std::string& path, int job) {
  const std::string suffix = "-job-" + std::to_string(job);
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) ||
      dot == (slash == std::string::npos ? 0 : slash + 1)) {
    return path + suffix;
  }
  return path.substr(0, dot) + suffix + path.substr(dot);
}

struct ArrayTrainer::Job {
  int index = 0;
  TrainConfig config;
  int64_t total = 0;
  int64_t per_epoch = 0;
  int64_t start = 0;    // steps done before this run (its checkpoint's)
  int64_t samples = 0;  // training samples seen, those before this run included
  std::unique_ptr<Communicator> pipe, tied;
  std::unique_ptr<LoaderMicroBatches> source;
  std::unique_ptr<Executor> executor;
  bool active = true;
  ArrayJobSummary summary;
  // This iteration's stats (loss from the forward block on the last stage, the rest from the
  // update), and the log interval's.
  StepStats step;
  double interval_loss = 0.0, interval_seconds = 0.0;
  int64_t interval_steps = 0, interval_samples = 0;
  int64_t interval_counted = 0;  // steps of the interval whose update was applied
  int64_t skipped_steps = 0;     // --nan-policy skip: updates skipped so far
  double elapsed = 0.0;
};

ArrayTrainer::ArrayTrainer(ExecContext& ctx, const proto::ModelSpec& spec,
                           std::shared_ptr<const io::Dataset> train,
                           std::shared_ptr<const io::Dataset> test, std::vector<TrainConfig> jobs,
                           const PipelineConfig& pipeline, const SchedulerOptions& scheduler,
                           Communicator* world, ArrayObserver* observer,
                           const ArrayMemoryOptions& memory)
    : ArrayTrainer(
          ctx, [spec] { return graph::build_model(spec); }, std::move(train), std::move(test),
          std::move(jobs), pipeline, scheduler, world, observer, memory) {
  spec_ = spec;  // recorded in the weights files
}

ArrayTrainer::ArrayTrainer(ExecContext& ctx, const ModelBuilder& build,
                           std::shared_ptr<const io::Dataset> train,
                           std::shared_ptr<const io::Dataset> test, std::vector<TrainConfig> jobs,
                           const PipelineConfig& pipeline, const SchedulerOptions& scheduler,
                           Communicator* world, ArrayObserver* observer,
                           const ArrayMemoryOptions& memory)
    : ctx_(ctx),
      build_(build),
      train_(std::move(train)),
      test_(std::move(test)),
      configs_(std::move(jobs)),
      pipeline_(pipeline),
      scheduler_(scheduler),
      world_(world),
      observer_(observer) {
  STRATA_CHECK(train_ != nullptr) << "--array needs a training dataset";
  STRATA_CHECK(!configs_.empty()) << "--array: the array has no job";
  const int S = pipeline_.stages;
  STRATA_CHECK_EQ(pipeline_.groups, 1)
      << "--array runs one pipeline: --groups " << pipeline_.groups << " is not supported";
  const int world_size = world != nullptr ? world->size() : 1;
  STRATA_CHECK_EQ(world_size, S) << "--array: the world has " << world_size
                                 << " ranks but --stages " << S << " needs " << S;
  stage_ = world != nullptr ? world->rank() : 0;
  model_ = build_();
  STRATA_CHECK(model_ != nullptr && model_->size() > 0) << "--array: the model has no layers";
  if (pipeline_.partition.empty()) {
    STRATA_CHECK_EQ(S, 1) << "a pipeline of " << S << " stages needs a partition";
    pipeline_.partition = {{0, model_->size()}};
  }
  STRATA_CHECK_EQ(static_cast<int>(pipeline_.partition.size()), S)
      << "the partition has " << pipeline_.partition.size() << " stages, --stages is " << S;
  const auto [begin, end] = pipeline_.partition[static_cast<size_t>(stage_)];
  const DType compute = configs_.front().compute_dtype;
  binder_ = std::make_unique<Binder>(*model_, begin, end, ctx.allocator(), compute);
  const std::optional<std::pair<int, int>> tied =
      S > 1 ? split_tied(*model_, pipeline_) : std::nullopt;
  // A job that clips its gradients by their global norm sums the norm over the stages inside its
  // update (a collective): its updates wait for the end of the iteration too.
  // So does one that skips the updates of non-finite gradients (--nan-policy skip): every stage
  // skips the same updates, so they agree on the global norm first.
  bool global_norm = false;
  for (const TrainConfig& c : configs_) {
    global_norm = global_norm || c.optimizer.clip_grad_norm > 0 || c.nan_policy == NanPolicy::kSkip;
  }
  deferred_updates_ = tied.has_value() || (S > 1 && global_norm);
  const int owner_stage = tied ? tied->first : -1, user_stage = tied ? tied->second : -1;
  // The memory manager: K slots, the other jobs' states in a host pool (pinned for a GPU, plain
  // memory for the CPU's emulated device; its own limit, not counted against --mem-limit).
  const int J = static_cast<int>(configs_.size());
  STRATA_CHECK(memory.slots >= 0) << "--array-slots must be >= 1, got " << memory.slots;
  const int K = memory.slots == 0 ? J : std::min(memory.slots, J);
  if (K < J) {
    if (ctx.device().is_cuda()) {
      host_pool_ = std::make_unique<cuda::PinnedHostAllocator>();
    } else {
      host_pool_ = std::make_unique<CpuAllocator>();
    }
    host_pool_->set_limit(memory.host_pool_bytes);
    copies_ = std::make_unique<CopyEngine>(ctx, *host_pool_, "--swap-pool");
    if (memory.copy_delay.count() > 0) copies_->set_copy_delay(memory.copy_delay);
  }
  slots_ = std::make_unique<StateSlots>(*binder_, K, copies_.get(), deferred_updates_);
  const int64_t M = pipeline_.micro_batches;
  for (size_t i = 0; i < configs_.size(); ++i) {
    TrainConfig& c = configs_[i];
    const std::string job = "job " + std::to_string(i);
    STRATA_CHECK(c.batch_size > 0 && c.batch_size % M == 0)
        << "--array " << job << ": batch-size " << c.batch_size << " is not divisible by "
        << "--micro-batches " << M << " (the layout's micro-batches of one block)";
    STRATA_CHECK(c.compute_dtype == compute) << "--array: every job computes in one precision";
    if (c.loss.num_classes == 0) c.loss.num_classes = model_->loss_classes();
    auto j = std::make_unique<Job>();
    j->index = static_cast<int>(i);
    j->config = c;
    j->total = total_steps(c, pipeline_, train_->size());
    const int id = binder_->add_job(c.seed, graph::optimizer_slot_names(c.optimizer).size());
    STRATA_CHECK_EQ(id, j->index) << "binder: jobs out of order";
    if (!c.init_weights.empty()) {
      models::load_weights(c.init_weights, *model_, binder_->store(id));
    }
    slots_->admit(id);
    // Each job's own communicators (collective over the world, the same order on every rank).
    if (world != nullptr && world->size() > 1) {
      j->pipe = world->split(0, stage_);
      const bool tied_here = stage_ == owner_stage || stage_ == user_stage;
      j->tied = world->split(tied_here ? 0 : -1, stage_ == owner_stage ? 0 : 1);
      STRATA_CHECK(!j->pipe->stream_ordered())
          << "--array: a stream-ordered communicator (nccl) is not supported; use --comm mpi";
    }
    jobs_.push_back(std::move(j));
  }
}

ArrayTrainer::~ArrayTrainer() {
  // The executors (over the stores), the copies in flight, then the stores, some of whose
  // buffers live in the host pool, which goes last.
  jobs_.clear();
  slots_.reset();
  copies_.reset();
  binder_.reset();
  host_pool_.reset();
}

ScheduleResult ArrayTrainer::make_task_graph(const std::vector<int>& members,
                                             const SchedulerOptions& options) {
  const int S = pipeline_.stages;
  const int K = static_cast<int>(members.size());
  // Block times for the scheduler: a stage's forward FLOPs per sample (its layer count where the
  // layers do not say) times the job's batch; a backward costs twice its forward. lr, weight decay
  // and momentum do not change a block's time (papers/arraypipe.md §2.2).
  std::vector<double> per_sample(static_cast<size_t>(S), 0.0);
  for (int s = 0; s < S; ++s) {
    const auto [b, e] = pipeline_.partition[static_cast<size_t>(s)];
    const double flops = model_->forward_flops(b, e);
    per_sample[static_cast<size_t>(s)] = flops > 0 ? flops : static_cast<double>(e - b);
  }
  const double unit = *std::max_element(per_sample.begin(), per_sample.end());
  std::vector<std::vector<double>> forward(static_cast<size_t>(K)), backward(forward.size());
  for (int j = 0; j < K; ++j) {
    for (int s = 0; s < S; ++s) {
      const double t =
          static_cast<double>(
              configs_[static_cast<size_t>(members[static_cast<size_t>(j)])].batch_size) *
          per_sample[static_cast<size_t>(s)] / unit;
      forward[static_cast<size_t>(j)].push_back(t);
      backward[static_cast<size_t>(j)].push_back(2 * t);
    }
  }
  const Instance instance = make_instance(forward, backward);
  ScheduleResult result;
  // Rank 0 decides (a search with a time limit could decide differently on each rank) and sends
  // the order of every stage: 2K entries per stage, job * 2 + (forward ? 0 : 1).
  Tensor order = Tensor::zeros({static_cast<int64_t>(S) * 2 * K}, DType::kI64);
  int64_t* v = order.data<int64_t>();
  if (stage_ == 0) {
    result = schedule_array(instance, options);
    validate_schedule(instance, result.schedule);
    for (int s = 0; s < S; ++s) {
      const std::vector<Block>& blocks = result.schedule.graph.device_order[static_cast<size_t>(s)];
      for (size_t b = 0; b < blocks.size(); ++b) {
        v[s * 2 * K + static_cast<int64_t>(b)] = blocks[b].job * 2 + (blocks[b].forward ? 0 : 1);
      }
    }
  }
  if (world_ != nullptr && world_->size() > 1) {
    world_->broadcast(order, 0)->wait(world_->timeout(), "--array: the task graph from rank 0");
  }
  // Every rank (rank 0 too) reads the orders back with the jobs' indices in the array.
  result.schedule.graph.device_order.assign(static_cast<size_t>(S), {});
  for (int s = 0; s < S; ++s) {
    for (int b = 0; b < 2 * K; ++b) {
      const int64_t x = v[s * 2 * K + b];
      result.schedule.graph.device_order[static_cast<size_t>(s)].push_back(
          {members[static_cast<size_t>(x / 2)], x % 2 == 0});
    }
  }
  return result;
}

void ArrayTrainer::run_block(Job& job, const Block& block, int64_t step) {
  const auto start = Clock::now();
  binder_->bind(job.index);
  const Program full =
      make_schedule(ScheduleKind::kGPipe, pipeline_.stages, pipeline_.micro_batches, step)
          .programs[static_cast<size_t>(stage_)];
  // gpipe's program: every forward (with its receive and send), then every backward, then the
  // update. The forward block is the part before the first backward's receive.
  size_t cut = 0;
  while (cut < full.size() && full[cut].op != OpCode::kRecvGrad &&
         full[cut].op != OpCode::kBackward && !is_update(full[cut].op)) {
    ++cut;
  }
  Program program;
  if (block.forward) {
    program.assign(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(cut));
  } else {
    for (size_t i = cut; i < full.size(); ++i) {
      if (deferred_updates_ && is_update(full[i].op)) continue;
      program.push_back(full[i]);
    }
  }
  const StepStats stats = job.executor->run(program, *job.source);
  if (block.forward) {
    job.step.loss += stats.loss;
    job.step.counted += stats.counted;
  } else if (!deferred_updates_) {
    job.step.lr = stats.lr;
    job.step.grad_sq = stats.grad_sq;
    job.step.skipped_steps = stats.skipped_steps;
  }
  busy_seconds_ += seconds_since(start);
}

void ArrayTrainer::update(Job& job, int64_t step) {
  const auto start = Clock::now();
  slots_->use(job.index);
  const Program program{{OpCode::kReduceGrads, -1}, {OpCode::kOptimizerStep, -1}};
  const StepStats stats = job.executor->run(program, *job.source);
  job.step.lr = stats.lr;
  job.step.grad_sq = stats.grad_sq;
  job.step.skipped_steps = stats.skipped_steps;
  busy_seconds_ += seconds_since(start);
}

EvalRecord ArrayTrainer::evaluate(Job& job, int64_t step, int64_t epoch) {
  const auto start = Clock::now();
  const TrainConfig& c = job.config;
  const int S = pipeline_.stages;
  const bool loads = stage_ == 0 || stage_ == S - 1;
  io::DataLoaderOptions options;
  options.batch_size = c.eval_batch_size;
  options.allocator = &ctx_.host_allocator();
  options.num_workers = loads ? c.num_workers : 0;
  LoaderMicroBatches source(test_, options, 1, loads, nullptr, c.loss.ignore_index);
  StageComms comms;
  comms.pipe = job.pipe.get();  // no training message is in flight (the iteration finished)
  ExecutorConfig ec;
  ec.seed = c.seed;
  ec.loss = c.loss;
  ec.optimizer = c.optimizer;
  slots_->use(job.index);
  const auto [first, end] = pipeline_.partition[static_cast<size_t>(stage_)];
  Executor executor(ctx_, *model_, binder_->store(job.index), StageRange{stage_, S, first, end},
                    comms, ec);
  const StepStats s = executor.evaluate(0, source.steps_per_epoch(), source);
  executor.finish();
  std::vector<double> metrics{s.loss, static_cast<double>(s.counted), static_cast<double>(s.top1),
                              static_cast<double>(s.top5)};
  world_sum(world_, &metrics, "--array: job " + std::to_string(job.index) + "'s evaluation");
  return summed_eval_record(metrics, step, epoch, seconds_since(start));
}

void ArrayTrainer::resume(Job& job) {
  const TrainConfig& c = job.config;
  slots_->use(job.index);
  std::string path;
  const std::optional<proto::CheckpointManifest> m =
      resume_job(world_, c.checkpoint.resume, c.checkpoint.dir, job.index, c, *model_,
                 binder_->store(job.index), graph::optimizer_slot_names(c.optimizer), &path);
  if (!m) {
    if (stage_ == 0) {
      STRATA_LOG(INFO) << "--array job " << job.index << ": no checkpoint to resume ("
                       << c.checkpoint.resume << "), starting from step 0";
    }
    return;
  }
  job.start = m->step();
  job.samples = m->run().samples_seen();
  job.skipped_steps = m->run().skipped_steps();
  job.summary.steps = job.start;
  job.summary.resumed_from = path;
  if (stage_ == 0) {
    STRATA_LOG(INFO) << "--array job " << job.index << ": resumed from " << path << " (step "
                     << job.start << " of " << job.total << ")";
  }
}

void ArrayTrainer::save(Job& job, int64_t done) {
  const TrainConfig& c = job.config;
  slots_->use(job.index);
  CheckpointRun run;
  run.step = done;
  run.total = job.total;
  run.per_epoch = job.per_epoch;
  run.train_samples = train_->size();
  run.dataset = train_->name();
  run.samples_seen = job.samples;
  const proto::CheckpointManifest manifest =
      describe_job(spec_, *model_, c, pipeline_, run, job.skipped_steps,
                   done == job.total ? "end of training" : "periodic");
  const SavedCheckpoint saved = save_checkpoint(
      world_, job_checkpoint_dir(c.checkpoint.dir, job.index), done, c.checkpoint.keep_last,
      manifest, binder_->store(job.index), graph::optimizer_slot_names(c.optimizer), true);
  job.summary.last_checkpoint = saved.path;
  if (stage_ == 0) {
    STRATA_LOG(INFO) << "--array job " << job.index << ": checkpoint " << saved.path;
  }
}

ArraySummary ArrayTrainer::run() {
  const int S = pipeline_.stages;
  const int64_t M = pipeline_.micro_batches;
  const bool loads = stage_ == 0 || stage_ == S - 1;
  ArraySummary summary;
  for (auto& j : jobs_) {
    if (!j->config.checkpoint.resume.empty()) resume(*j);  // collective, jobs in order
  }
  for (auto& j : jobs_) {
    const TrainConfig& c = j->config;
    io::DataLoaderOptions options;
    options.batch_size = c.batch_size;
    options.allocator = &ctx_.host_allocator();
    options.shuffle = true;
    options.seed = c.seed;
    options.num_workers = loads ? c.num_workers : 0;
    options.shard_index = 0;
    options.shard_count = 1;
    options.drop_last = S * M > 1;
    j->source = std::make_unique<LoaderMicroBatches>(train_, options, M, loads, nullptr,
                                                     c.loss.ignore_index);
    j->per_epoch = j->source->steps_per_epoch();
    if (j->start > 0) j->source->start_at(j->start);
    ExecutorConfig ec;
    ec.kind = ScheduleKind::kGPipe;
    ec.seed = c.seed;
    ec.loss = c.loss;
    ec.optimizer = c.optimizer;
    ec.first_step = j->start;
    ec.optimizer.skip_non_finite = c.nan_policy == NanPolicy::kSkip;
    ec.global_norm = c.nan_policy == NanPolicy::kSkip;
    ec.optimizer.schedule.total_steps = std::max(ec.optimizer.schedule.total_steps, j->total);
    ec.memory_plan = pipeline_.memory_plan;
    ec.prefetch_layers = pipeline_.prefetch_layers;
    StageComms comms;
    comms.pipe = j->pipe.get();
    comms.tied = j->tied.get();
    const auto [first, end] = pipeline_.partition[static_cast<size_t>(stage_)];
    j->executor = std::make_unique<Executor>(ctx_, *model_, binder_->store(j->index),
                                             StageRange{stage_, S, first, end}, comms, ec);
  }
  std::vector<int> members;
  int64_t first = -1;
  for (const auto& j : jobs_) {
    if (j->start >= j->total) continue;  // done before this run
    members.push_back(j->index);
    first = first < 0 ? j->start : std::min(first, j->start);
  }
  if (members.empty()) members.push_back(jobs_.front()->index);  // nothing to train: no order used
  summary.schedule = make_task_graph(members, scheduler_);
  std::vector<Block> order =
      summary.schedule.schedule.graph.device_order[static_cast<size_t>(stage_)];
  int64_t iterations = 0;
  for (const auto& j : jobs_) iterations = std::max(iterations, j->total);
  const int K = static_cast<int>(jobs_.size());
  double train_seconds = 0.0;
  for (int64_t step = std::max<int64_t>(first, 0); first >= 0 && step < iterations; ++step) {
    const auto start = Clock::now();
    std::vector<int> now;
    for (auto& j : jobs_) {
      // A job trains from its resumed step to its last; one that diverged stays out.
      j->active = !j->summary.stopped && step >= j->start && step < j->total;
      j->step = StepStats();
      if (j->active) now.push_back(j->index);
    }
    if (now != members && !now.empty()) {
      // A job left (its steps are done, or it diverged): a new task graph of the others, from the
      // GA where the array's scheduler is B&B (the paper's prompt rescheduling, §2.7). The old
      // order without the job would still be valid; the new one is shorter.
      members = now;
      SchedulerOptions options = scheduler_;
      if (options.kind == SchedulerKind::kBnb) options.kind = SchedulerKind::kGa;
      const ScheduleResult again = make_task_graph(members, options);
      order = again.schedule.graph.device_order[static_cast<size_t>(stage_)];
      ++summary.reschedules;
    }
    // The blocks of the jobs that still train, in the task graph's order; before each, the
    // memory manager follows the jobs of the blocks ahead (this iteration's, then the next's).
    std::vector<int> ahead;
    for (int pass = 0; pass < 2; ++pass) {
      for (const Block& block : order) {
        if (jobs_[static_cast<size_t>(block.job)]->active) ahead.push_back(block.job);
      }
    }
    size_t next = 0;
    for (const Block& block : order) {
      Job& job = *jobs_[static_cast<size_t>(block.job)];
      if (!job.active) continue;
      slots_->before_block(
          std::vector<int>(ahead.begin() + static_cast<std::ptrdiff_t>(next), ahead.end()));
      ++next;
      run_block(job, block, step);
    }
    if (deferred_updates_) {
      for (auto& j : jobs_) {
        if (j->active) update(*j, step);
      }
    }
    std::vector<double> m(static_cast<size_t>(5 * K), 0.0);
    for (auto& j : jobs_) {
      if (!j->active) continue;
      j->executor->finish();
      j->source->release_before(step + 1);
      const size_t k = static_cast<size_t>(5 * j->index);
      m[k] = j->step.loss;
      m[k + 1] = static_cast<double>(j->step.counted);
      m[k + 2] = j->step.grad_sq;
      m[k + 3] = 1.0;  // active (the ranks agree; checked below)
      m[k + 4] = static_cast<double>(j->step.skipped_steps);
    }
    world_sum(world_, &m, "--array: the jobs' step metrics");
    const double dt = seconds_since(start);
    train_seconds += dt;
    ++summary.iterations;
    for (auto& j : jobs_) {
      if (!j->active) continue;
      const size_t k = static_cast<size_t>(5 * j->index);
      STRATA_CHECK_EQ(m[k + 3], static_cast<double>(S))
          << "--array: the stages disagree on whether job " << j->index << " trains";
      const double loss = m[k];
      j->summary.steps = step + 1;
      j->summary.last_loss = loss;
      // --nan-policy skip, as a solo run: an update whose gradient is not finite was skipped on
      // every stage (they agreed on the global norm) and the job goes on.
      const bool skipped = m[k + 4] > 0;
      if (skipped && j->config.nan_policy == NanPolicy::kSkip) {
        ++j->skipped_steps;
        if (stage_ == 0) {
          STRATA_LOG(WARN) << "job " << j->index << ": step " << step + 1 << ": the loss is "
                           << loss << " and the gradient is not finite: update skipped "
                           << "(--nan-policy skip; " << j->skipped_steps << " skipped so far)";
        }
      } else if (skipped || !std::isfinite(loss)) {
        // --nan-policy abort for this job alone: it leaves the array, the others go on.
        j->active = false;
        j->summary.stopped = true;
        j->summary.why = "step " + std::to_string(step + 1) + ": the loss is " +
                         std::to_string(loss) +
                         (j->config.nan_policy == NanPolicy::kSkip
                              ? "; the job stops (training diverged), the array goes on"
                              : "; the job stops (--nan-policy abort), the array goes on");
        if (stage_ == 0 && observer_ != nullptr) {
          observer_->on_job_stopped(j->index, step + 1, j->summary.why);
        }
        continue;
      }
      const int64_t rows = j->source->group_rows(step);
      j->samples += rows;
      if (!skipped) {
        j->interval_loss += loss;
        ++j->interval_counted;
      }
      ++j->interval_steps;
      j->interval_seconds += dt;
      j->interval_samples += rows;
      j->elapsed += dt;
      const bool last = step + 1 == j->total;
      if (stage_ == 0 && observer_ != nullptr && ((step + 1) % j->config.log_every == 0 || last)) {
        StepRecord r;
        r.step = step + 1;
        r.total_steps = j->total;
        r.epoch = step / std::max<int64_t>(1, j->per_epoch);
        r.loss = j->interval_counted > 0
                     ? j->interval_loss / static_cast<double>(j->interval_counted)
                     : std::nan("");
        r.skipped_steps = j->skipped_steps;
        r.lr = j->step.lr;
        r.grad_norm = std::sqrt(std::max(m[k + 2], 0.0));
        r.samples_per_s = j->interval_seconds > 0
                              ? static_cast<double>(j->interval_samples) / j->interval_seconds
                              : 0.0;
        r.elapsed_s = j->elapsed;
        r.eta_s =
            j->elapsed / static_cast<double>(step + 1) * static_cast<double>(j->total - step - 1);
        observer_->on_job_log(j->index, r);
        j->interval_loss = j->interval_seconds = 0.0;
        j->interval_steps = j->interval_samples = j->interval_counted = 0;
      }
    }
    // Evaluations, jobs in order on every rank (each job as its solo run: at the end of its
    // epochs, every eval_every steps, at its last step).
    for (auto& j : jobs_) {
      if (test_ == nullptr || !j->active) continue;
      const bool epoch_end =
          (step + 1) % std::max<int64_t>(1, j->per_epoch) == 0 || step + 1 == j->total;
      const bool periodic = j->config.eval_every > 0 && (step + 1) % j->config.eval_every == 0;
      if (!epoch_end && !periodic) continue;
      const EvalRecord r = evaluate(*j, step + 1, step / std::max<int64_t>(1, j->per_epoch));
      j->summary.last_eval = r;
      if (stage_ == 0 && observer_ != nullptr) observer_->on_job_eval(j->index, r);
    }
    // Checkpoints, jobs in order on every rank: each job's as its solo run writes them (every
    // --save-every steps and at its last step), under its own directory.
    for (auto& j : jobs_) {
      const CheckpointConfig& ck = j->config.checkpoint;
      if (!j->active || ck.dir.empty()) continue;
      const int64_t done = step + 1;
      if ((ck.save_every > 0 && done % ck.save_every == 0) || done == j->total) save(*j, done);
    }
  }
  summary.train_seconds = train_seconds;
  summary.switches = binder_->switches();
  summary.busy_seconds = busy_seconds_;
  summary.slots = slots_->stats();
  summary.peak_bytes.assign(static_cast<size_t>(S), 0.0);
  summary.host_pool_peak_bytes.assign(static_cast<size_t>(S), 0.0);
  summary.peak_bytes[static_cast<size_t>(stage_)] =
      static_cast<double>(ctx_.allocator().stats().peak);
  summary.host_pool_peak_bytes[static_cast<size_t>(stage_)] =
      host_pool_ ? static_cast<double>(host_pool_->stats().peak) : 0.0;
  world_sum(world_, &summary.peak_bytes, "--array: the ranks' memory peaks");
  world_sum(world_, &summary.host_pool_peak_bytes, "--array: the ranks' host pool peaks");
  // --save-weights: every job's own file (collective per job).
  for (auto& j : jobs_) {
    if (j->config.save_weights.empty() || j->summary.stopped) continue;  // none for a diverged job
    j->summary.weights_path = job_weights_path(j->config.save_weights, j->index);
    slots_->use(j->index);
    const std::unique_ptr<graph::Model> full = stage_ == 0 ? build_() : nullptr;
    // The metadata of the job's solo run (parallel/trainer.cpp), so that the files compare.
    std::map<std::string, std::string> metadata;
    if (spec_.layer_size() > 0) {
      metadata[models::kWeightsModelSpecKey] = graph::model_spec_to_text(spec_);
    }
    metadata["strata.step"] = std::to_string(j->summary.steps);
    save_final_weights(world_, stage_, 0, *model_, binder_->store(j->index), full.get(),
                       j->summary.weights_path, metadata);
  }
  for (auto& j : jobs_) summary.jobs.push_back(j->summary);
  return summary;
}

}  // namespace strata::parallel::arraypipe
