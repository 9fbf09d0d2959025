// The single-process training loop. A step is: zero gradients, forward + loss + backward on the
// global batch, optimizer step. Time spent evaluating is kept out of samples/s and the ETA.
#include "parallel/trainer.h"

#include <chrono>
#include <cmath>

#include "engine/check.h"
#include "graph/train_step.h"
#include "io/data_loader.h"

namespace strata::parallel {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

int64_t total_steps(const TrainConfig& config, int64_t train_size) {
  STRATA_CHECK_GT(config.batch_size, 0) << "--batch-size must be positive";
  if (config.steps > 0) return config.steps;
  STRATA_CHECK_GT(config.epochs, 0) << "--epochs or --steps must be positive";
  const int64_t per_epoch = (train_size + config.batch_size - 1) / config.batch_size;
  return config.epochs * per_epoch;
}

Trainer::Trainer(ExecContext& ctx, graph::Model& model, graph::ParamStore& store,
                 std::shared_ptr<const io::Dataset> train, std::shared_ptr<const io::Dataset> test,
                 const TrainConfig& config, TrainObserver* observer)
    : ctx_(ctx),
      model_(model),
      store_(store),
      train_(std::move(train)),
      test_(std::move(test)),
      config_(config),
      observer_(observer) {
  STRATA_CHECK(train_ != nullptr) << "Trainer needs a training dataset";
  STRATA_CHECK(config.log_every > 0) << "--log-every must be positive";
  STRATA_CHECK(config.eval_every >= 0) << "--eval-every must be >= 0";
}

EvalRecord Trainer::evaluate(const std::string& split, std::shared_ptr<const io::Dataset> data,
                             int64_t step, int64_t epoch) {
  const auto start = Clock::now();
  io::DataLoaderOptions options;
  options.batch_size = config_.eval_batch_size;
  options.shuffle = false;
  options.num_workers = config_.num_workers;
  io::DataLoader loader(data, options);
  loader.start_epoch(0);
  io::Batch batch;
  double loss_sum = 0.0;
  int64_t counted = 0, top1 = 0, top5 = 0;
  while (loader.next(&batch)) {
    const graph::BatchMetrics m =
        graph::evaluate_batch(ctx_, model_, batch.input, batch.target, config_.loss.ignore_index);
    loss_sum += m.loss * static_cast<double>(m.counted);
    counted += m.counted;
    top1 += m.top1;
    top5 += m.top5;
  }
  EvalRecord r;
  r.split = split;
  r.step = step;
  r.epoch = epoch;
  r.samples = counted;
  r.loss = counted > 0 ? loss_sum / static_cast<double>(counted) : 0.0;
  r.accuracy = counted > 0 ? static_cast<double>(top1) / static_cast<double>(counted) : 0.0;
  r.top5 = counted > 0 ? static_cast<double>(top5) / static_cast<double>(counted) : 0.0;
  r.seconds = seconds_since(start);
  return r;
}

TrainSummary Trainer::run() {
  const auto wall_start = Clock::now();
  graph::Optimizer optimizer(store_, config_.optimizer);
  io::DataLoaderOptions options;
  options.batch_size = config_.batch_size;
  options.shuffle = true;
  options.seed = config_.seed;
  options.num_workers = config_.num_workers;
  io::DataLoader loader(train_, options);
  const int64_t total = total_steps(config_, train_->size());
  STRATA_CHECK_GT(loader.batches_per_epoch(), 0)
      << "the training set (" << train_->size() << " samples) is empty";

  TrainSummary summary;
  int64_t step = 0;
  double train_seconds = 0.0;
  double interval_loss = 0.0, interval_seconds = 0.0;
  int64_t interval_steps = 0, interval_samples = 0;
  io::Batch batch;
  for (int64_t epoch = 0; step < total; ++epoch) {
    loader.start_epoch(epoch);
    while (step < total && loader.next(&batch)) {
      const auto step_start = Clock::now();
      store_.zero_grads();
      graph::ForwardOptions fwd;
      fwd.training = true;
      fwd.seed = config_.seed;
      fwd.step = step;
      // RNG sample index: the row's position within the step's global batch.
      fwd.sample_offset = batch.sample_offset - batch.step * config_.batch_size;
      const graph::BatchMetrics m =
          graph::train_forward_backward(ctx_, model_, batch.input, batch.target, config_.loss, fwd);
      STRATA_CHECK(std::isfinite(m.loss))
          << "the loss is " << m.loss << " at step " << step << " (epoch " << epoch
          << "): training diverged; lower --lr or set --clip-grad-norm";
      const graph::OptimizerStepInfo info = optimizer.step(ctx_, step);
      ++step;
      const double dt = seconds_since(step_start);
      train_seconds += dt;
      interval_loss += m.loss;
      interval_seconds += dt;
      ++interval_steps;
      interval_samples += batch.rows;
      summary.samples += batch.rows;

      StepRecord r;
      r.step = step;
      r.total_steps = total;
      r.epoch = epoch;
      r.loss = interval_loss / static_cast<double>(interval_steps);
      r.lr = info.lr;
      r.grad_norm = info.grad_norm;
      r.samples_per_s = interval_seconds > 0 ? interval_samples / interval_seconds : 0.0;
      r.elapsed_s = train_seconds;
      r.eta_s = train_seconds / static_cast<double>(step) * static_cast<double>(total - step);
      if (observer_ != nullptr) observer_->on_step(r);
      if (step % config_.log_every == 0 || step == total) {
        if (observer_ != nullptr) observer_->on_log(r);
        interval_loss = interval_seconds = 0.0;
        interval_steps = interval_samples = 0;
      }
      if (test_ != nullptr && config_.eval_every > 0 && step % config_.eval_every == 0 &&
          step != total) {
        summary.last_eval = evaluate("test", test_, step, epoch);
        if (observer_ != nullptr) observer_->on_eval(*summary.last_eval);
      }
    }
    const bool epoch_done = step == total || step % loader.batches_per_epoch() == 0;
    if (test_ != nullptr && epoch_done) {
      summary.last_eval = evaluate("test", test_, step, epoch);
      if (observer_ != nullptr) observer_->on_eval(*summary.last_eval);
    }
  }
  summary.steps = step;
  summary.train_seconds = train_seconds;
  summary.wall_seconds = seconds_since(wall_start);
  return summary;
}

}  // namespace strata::parallel
