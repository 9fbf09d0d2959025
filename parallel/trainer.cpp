// One rank's training loop over the Executor.
//
// Synchronous schedules (gpipe, 1f1b): every step runs the stage's program for that step's M
// micro-batches and ends with ReduceGrads and OptimizerStep, so all ranks agree on the weights at
// step boundaries. The asynchronous schedule (async-1f1b) runs one program for the whole run, cut
// into segments of M updates for reporting; segments overlap (no flush), which is the point.
//
// Metrics (loss, counts) live on the last stages; one all-reduce over the world per step sums
// them over the groups and hands them to rank 0, which reports. Evaluation runs on group 0 only
// (forward in evaluation mode, one micro-batch per evaluation batch, pipelined across batches on
// a separate communicator so its messages never meet the training ones).
#include "parallel/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "engine/check.h"
#include "engine/log.h"
#include "graph/model_spec.h"
#include "parallel/executor.h"
#include "parallel/micro_batches.h"
#include "parallel/trace.h"

namespace strata::parallel {
namespace {

using Clock = std::chrono::steady_clock;

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

// Every rank's string, on every rank (lengths first, then the padded bytes).
std::vector<std::string> gather_strings(Communicator* world, const std::string& mine) {
  if (world == nullptr || world->size() == 1) return {mine};
  const int n = world->size();
  Tensor len = Tensor::from_vector<int64_t>({static_cast<int64_t>(mine.size())}, {1});
  Tensor lens = Tensor::empty({n}, DType::kI64);
  auto r = world->all_gather(len, lens);
  r->wait(world->timeout(), "gathering trace sizes");
  const std::vector<int64_t> sizes = lens.to_vector<int64_t>();
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  Tensor bytes = Tensor::zeros({std::max<int64_t>(longest, 1)}, DType::kU8);
  std::copy(mine.begin(), mine.end(), bytes.data<uint8_t>());
  Tensor all = Tensor::empty({n * bytes.numel()}, DType::kU8);
  r = world->all_gather(bytes, all);
  r->wait(world->timeout(), "gathering traces");
  std::vector<std::string> out;
  const uint8_t* p = all.data<uint8_t>();
  for (int i = 0; i < n; ++i) {
    out.emplace_back(reinterpret_cast<const char*>(p + i * bytes.numel()),
                     static_cast<size_t>(sizes[i]));
  }
  return out;
}

// Cuts an asynchronous program after every `per_segment`-th OptimizerStep.
std::vector<Program> segments(const Program& program, int64_t per_segment) {
  std::vector<Program> out(1);
  int64_t updates = 0;
  for (const Instruction& in : program) {
    out.back().push_back(in);
    if (in.op == OpCode::kOptimizerStep && ++updates % per_segment == 0) out.emplace_back();
  }
  if (out.back().empty()) out.pop_back();
  return out;
}

}  // namespace

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
    : ctx_(ctx),
      train_(std::move(train)),
      test_(std::move(test)),
      config_(config),
      pipeline_(pipeline),
      world_(world),
      observer_(observer) {
  STRATA_CHECK(train_ != nullptr) << "Trainer needs a training dataset";
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
  model_ = graph::build_model(spec);
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
  const auto [begin, end] = pipeline_.partition[stage_];
  store_ = std::make_unique<graph::ParamStore>(*model_, begin, end, ctx.allocator());
  store_->initialize(config.seed);
  set_log_rank(world != nullptr && world->size() > 1 ? rank_ : -1);
  make_communicators();
}

Trainer::~Trainer() = default;

void Trainer::make_communicators() {
  if (world_ == nullptr || world_->size() == 1) return;
  const int S = pipeline_.stages;
  pipe_ = world_->split(group_, stage_);
  dp_ = world_->split(stage_, group_);
  eval_pipe_ = pipe_->split(0, stage_);
  // Tied parameters whose owner and user sit on different stages.
  int owner_stage = -1, user_stage = -1;
  for (size_t l = 0; l < model_->size(); ++l) {
    for (const graph::ParamSpec& spec : model_->layer(l).param_specs()) {
      if (spec.tied_to.empty()) continue;
      const auto owner = model_->find_param_layer(spec.tied_to);
      STRATA_CHECK(owner.has_value()) << "parameter " << model_->layer(l).name() << "." << spec.name
                                      << " is tied to unknown " << spec.tied_to;
      int os = 0, us = 0;
      for (int s = 0; s < S; ++s) {
        if (*owner >= pipeline_.partition[s].first && *owner < pipeline_.partition[s].second)
          os = s;
        if (l >= pipeline_.partition[s].first && l < pipeline_.partition[s].second) us = s;
      }
      if (os == us) continue;
      STRATA_CHECK(owner_stage < 0 || (owner_stage == os && user_stage == us))
          << "tied parameters split over more than one pair of stages are not supported";
      owner_stage = os;
      user_stage = us;
    }
  }
  const bool tied_here = owner_stage >= 0 && (stage_ == owner_stage || stage_ == user_stage);
  tied_ = world_->split(tied_here ? group_ : -1, stage_ == owner_stage ? 0 : 1);
}

EvalRecord Trainer::evaluate(int64_t step, int64_t epoch) {
  const auto start = Clock::now();
  std::vector<double> metrics(4, 0.0);  // loss sum, counted, top1, top5
  if (group_ == 0) {
    io::DataLoaderOptions options;
    options.batch_size = config_.eval_batch_size;
    options.num_workers = (stage_ == 0 || stage_ == pipeline_.stages - 1) ? config_.num_workers : 0;
    const bool loads = stage_ == 0 || stage_ == pipeline_.stages - 1;
    LoaderMicroBatches source(test_, options, 1, loads, nullptr, config_.loss.ignore_index);
    StageComms comms;
    comms.pipe = eval_pipe_.get();
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
  EvalRecord r;
  r.split = "test";
  r.step = step;
  r.epoch = epoch;
  r.samples = static_cast<int64_t>(metrics[1]);
  const double n = std::max(metrics[1], 1.0);
  r.loss = metrics[0] / n;
  r.accuracy = metrics[2] / n;
  r.top5 = metrics[3] / n;
  r.seconds = seconds_since(start);
  return r;
}

TrainSummary Trainer::run() {
  const auto wall_start = Clock::now();
  const int S = pipeline_.stages, G = pipeline_.groups;
  const int64_t M = pipeline_.micro_batches;
  const bool loads = stage_ == 0 || stage_ == S - 1;
  io::DataLoaderOptions options;
  options.batch_size = config_.batch_size;
  options.shuffle = true;
  options.seed = config_.seed;
  options.num_workers = loads ? config_.num_workers : 0;
  options.shard_index = group_;
  options.shard_count = G;
  options.drop_last = S * G * M > 1;
  // Synchronous schedules normalize by the step's global batch; the asynchronous one updates per
  // micro-batch, so each micro-batch is its own mean.
  LoaderMicroBatches source(train_, options, M, loads, stage_ == S - 1 ? dp_.get() : nullptr,
                            config_.loss.ignore_index, !is_synchronous(pipeline_.schedule));
  const int64_t total = total_steps(config_, pipeline_, train_->size());
  const int64_t per_epoch = source.steps_per_epoch();

  std::unique_ptr<Trace> trace;
  if (!pipeline_.trace_path.empty()) trace = std::make_unique<Trace>(rank_, group_, stage_);
  StageComms comms;
  comms.pipe = pipe_.get();
  comms.dp = dp_.get();
  comms.tied = tied_.get();
  ExecutorConfig ec;
  ec.kind = pipeline_.schedule;
  ec.seed = config_.seed;
  ec.loss = config_.loss;
  ec.optimizer = config_.optimizer;
  ec.optimizer.schedule.total_steps = std::max(ec.optimizer.schedule.total_steps, total);
  ec.grad_sync = pipeline_.grad_sync;
  ec.grad_sync_observer = pipeline_.grad_sync_observer;
  Executor executor(
      ctx_, *model_, *store_,
      {stage_, S, pipeline_.partition[stage_].first, pipeline_.partition[stage_].second}, comms, ec,
      trace.get());

  // The programs: one per step, or the asynchronous run cut into segments of M updates.
  const bool sync = is_synchronous(pipeline_.schedule);
  std::vector<Program> async_segments;
  if (!sync) {
    const Schedule run = make_schedule(pipeline_.schedule, S, total * M);
    async_segments = segments(run.programs[stage_], M);
    STRATA_CHECK_EQ(static_cast<int64_t>(async_segments.size()), total)
        << "async schedule: " << async_segments.size() << " segments for " << total << " steps";
  }

  TrainSummary summary;
  StageReport report{
      rank_, group_, stage_, pipeline_.partition[stage_].first, pipeline_.partition[stage_].second,
      0.0,   0.0};
  double train_seconds = 0.0, interval_loss = 0.0, interval_seconds = 0.0;
  int64_t interval_steps = 0, interval_samples = 0;
  for (int64_t step = 0; step < total; ++step) {
    const int64_t epoch = step / per_epoch;
    const auto step_start = Clock::now();
    const Program program = sync ? make_schedule(pipeline_.schedule, S, M, step).programs[stage_]
                                 : async_segments[step];
    StepStats stats = executor.run(program, source);
    if (step + 1 == total) executor.flush_gradients();  // --dp-delay: the last D gradients
    if (sync) executor.finish();
    source.release_before(sync ? step + 1 : std::max<int64_t>(0, step - 1));
    report.busy_seconds += stats.busy_seconds;
    report.wall_seconds += stats.wall_seconds;
    // Loss and counts from the last stages; samples from the loader's arithmetic.
    // The gradient norm: every stage's share, counted once (group 0; replicas agree).
    std::vector<double> m{stats.loss, static_cast<double>(stats.counted),
                          group_ == 0 ? stats.grad_sq : 0.0};
    world_sum(world_, &m, "step metrics");
    stats.grad_norm = std::sqrt(std::max(m[2], 0.0));
    // Async: M updates per segment, each loss the mean of its micro-batch over the groups.
    const double loss = sync ? m[0] : m[0] / static_cast<double>(M);
    STRATA_CHECK(std::isfinite(loss))
        << "the loss is " << loss << " at step " << step << " (epoch " << epoch
        << "): training diverged; lower --lr or set --clip-grad-norm";
    const double dt = seconds_since(step_start);
    const int64_t samples = source.group_rows(step) * G;
    train_seconds += dt;
    interval_loss += loss;
    interval_seconds += dt;
    ++interval_steps;
    interval_samples += samples;
    summary.samples += samples;
    if (rank_ == 0 && observer_ != nullptr) {
      StepRecord r;
      r.step = step + 1;
      r.total_steps = total;
      r.epoch = epoch;
      r.loss = interval_loss / static_cast<double>(interval_steps);
      r.lr = stats.lr;
      r.grad_norm = stats.grad_norm;
      r.samples_per_s = interval_seconds > 0 ? interval_samples / interval_seconds : 0.0;
      r.elapsed_s = train_seconds;
      r.eta_s =
          train_seconds / static_cast<double>(step + 1) * static_cast<double>(total - step - 1);
      observer_->on_step(r);
      if ((step + 1) % config_.log_every == 0 || step + 1 == total) observer_->on_log(r);
    }
    if ((step + 1) % config_.log_every == 0 || step + 1 == total) {
      interval_loss = interval_seconds = 0.0;
      interval_steps = interval_samples = 0;
    }
    const bool epoch_end = (step + 1) % per_epoch == 0 || step + 1 == total;
    const bool periodic = config_.eval_every > 0 && (step + 1) % config_.eval_every == 0;
    if (test_ != nullptr && (epoch_end || periodic)) {
      if (!sync && step + 1 == total) executor.finish();  // the async run drains first
      summary.last_eval = evaluate(step + 1, epoch);
      if (rank_ == 0 && observer_ != nullptr) observer_->on_eval(*summary.last_eval);
    }
  }
  executor.finish();

  // Per-stage utilization, gathered on every rank (reported by rank 0).
  const int n = world_ != nullptr ? world_->size() : 1;
  std::vector<double> all(static_cast<size_t>(n) * 2, 0.0);
  all[2 * rank_] = report.busy_seconds;
  all[2 * rank_ + 1] = report.wall_seconds;
  world_sum(world_, &all, "stage reports");
  double idle = 0.0;
  for (int r = 0; r < n; ++r) {
    StageReport s{r,
                  r / S,
                  r % S,
                  pipeline_.partition[r % S].first,
                  pipeline_.partition[r % S].second,
                  all[2 * r],
                  all[2 * r + 1]};
    idle += s.idle_fraction();
    summary.stages.push_back(s);
  }
  summary.measured_bubble = idle / n;
  summary.theoretical_bubble = theoretical_bubble_fraction(pipeline_.schedule, S, M);
  if (trace != nullptr) {
    const std::vector<std::string> events = gather_strings(world_, trace->events_json());
    if (rank_ == 0) Trace::write_file(pipeline_.trace_path, events);
  }
  summary.steps = total;
  summary.train_seconds = train_seconds;
  summary.wall_seconds = seconds_since(wall_start);
  return summary;
}

}  // namespace strata::parallel
