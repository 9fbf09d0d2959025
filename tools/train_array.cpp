#include "tools/train_array.h"

#include <cmath>
#include <cstdio>

#include "engine/check.h"
#include "graph/model_spec.h"
#include "io/datasets.h"
#include "parallel/arraypipe/array_trainer.h"
#include "parallel/arraypipe/scheduler.h"
#include "tools/common.h"
#include "tools/progress.h"
#include "tools/train_array_memory.h"

namespace strata::tools {
namespace {

namespace ap = parallel::arraypipe;

class ArrayReporter final : public ap::ArrayObserver {
 public:
  ArrayReporter(io::JsonlWriter* metrics) : metrics_(metrics) {}

  void on_job_log(int job, const parallel::StepRecord& r) override {
    std::printf(
        "job %d | step %lld/%lld | epoch %lld | loss %.4f | lr %.2e | grad_norm %.3f | "
        "%.0f samples/s\n",
        job, static_cast<long long>(r.step), static_cast<long long>(r.total_steps),
        static_cast<long long>(r.epoch + 1), r.loss, r.lr, r.grad_norm, r.samples_per_s);
    std::fflush(stdout);
    if (metrics_ != nullptr && metrics_->enabled()) {
      nlohmann::json record = train_record(r);
      record["job"] = job;
      metrics_->write(record);
    }
  }

  void on_job_eval(int job, const parallel::EvalRecord& r) override {
    std::printf("job %d | eval %s | step %lld | loss %.4f | accuracy %.2f%% | %lld samples\n", job,
                r.split.c_str(), static_cast<long long>(r.step), r.loss, 100.0 * r.accuracy,
                static_cast<long long>(r.samples));
    std::fflush(stdout);
    if (metrics_ != nullptr && metrics_->enabled()) {
      nlohmann::json record = eval_record(r);
      record["job"] = job;
      metrics_->write(record);
    }
  }

  void on_job_stopped(int job, int64_t step, const std::string& why) override {
    std::printf("job %d stopped: %s\n", job, why.c_str());
    std::fflush(stdout);
    if (metrics_ != nullptr && metrics_->enabled()) {
      metrics_->write({{"type", "job_stopped"}, {"job", job}, {"step", step}, {"why", why}});
    }
  }

 private:
  io::JsonlWriter* metrics_;
};

}  // namespace

std::vector<ap::ArrayJob> array_jobs(const TrainOptions& o) {
  const ap::ArrayMode mode = ap::parse_array_mode(o.array_mode);
  std::vector<ap::ArrayJob> jobs = ap::parse_array_argument(o.array, mode);
  ap::parse_scheduler_kind(o.array_scheduler);
  STRATA_CHECK(o.array_bnb_max >= 1) << "--array-bnb-max must be >= 1, got " << o.array_bnb_max;
  const int ranks = o.stages * std::max(1, o.groups);
  STRATA_CHECK(o.groups <= 1 && ranks == o.stages)
      << "--array runs one pipeline of --stages ranks; --groups " << o.groups
      << " (data parallelism) is not supported with an array";
  STRATA_CHECK(o.schedule == "gpipe" || o.schedule == "1f1b")
      << "--array: each job's blocks are whole mini-batches (a synchronous step); --schedule "
      << o.schedule << " is not supported";
  STRATA_CHECK(o.save_every == 0 || !o.checkpoint_dir.empty())
      << "--save-every needs --checkpoint-dir (with --array: each job's under DIR/job-i)";
  STRATA_CHECK(o.migrate_at.empty() && o.sync == "allreduce" && o.inject.empty() &&
               o.dp_delay == 0 && o.tensorboard.empty() && o.sample_every == 0 && o.trace.empty())
      << "--array cannot be combined with --migrate-at, --sync, --inject, --dp-delay, "
         "--tensorboard, --sample-every or --trace";
  STRATA_CHECK(o.memory_policy == "keep" || o.memory_policy == "recompute")
      << "--array: --memory-policy " << o.memory_policy << " is not supported (keep, recompute)";
  STRATA_CHECK(o.loss_scale == "auto" || o.loss_scale == "off")
      << "--array: --loss-scale " << o.loss_scale << " is not supported";
  STRATA_CHECK(o.precision != "fp16") << "--array: --precision fp16 (loss scaling) is not "
                                         "supported; use bf16";
  if (!o.array_slots.empty()) parse_array_slots(o);
  ap::check_array_batch_sizes(jobs, static_cast<int>(o.batch_size),
                              static_cast<int>(o.micro_batches), "--micro-batches");
  return jobs;
}

std::vector<parallel::TrainConfig> array_job_configs(const std::vector<ap::ArrayJob>& jobs,
                                                     const parallel::TrainConfig& base,
                                                     const parallel::PipelineConfig& pipeline,
                                                     int64_t train_size) {
  std::vector<parallel::TrainConfig> configs;
  for (const ap::ArrayJob& job : jobs) {
    parallel::TrainConfig c = base;
    c.control = nullptr;
    if (job.lr) c.optimizer.schedule.base_lr = *job.lr;
    if (job.weight_decay) c.optimizer.weight_decay = *job.weight_decay;
    if (job.momentum) c.optimizer.momentum = *job.momentum;
    if (job.batch_size) c.batch_size = *job.batch_size;
    if (job.seed) c.seed = *job.seed;
    // The learning-rate schedule spans the job's own steps (as its solo run's would).
    c.optimizer.schedule.total_steps = parallel::total_steps(c, pipeline, train_size);
    for_flag("--array (job " + std::to_string(job.index) + ": " + ap::describe_job(job) + ")",
             [&] { return c.optimizer.schedule.lr_at(0); });
    configs.push_back(std::move(c));
  }
  return configs;
}

void run_array_rank(const TrainOptions& o, const proto::ModelSpec& spec,
                    std::shared_ptr<const io::Dataset> train,
                    std::shared_ptr<const io::Dataset> test, const parallel::TrainConfig& base,
                    const parallel::PipelineConfig& pipeline, parallel::Communicator* world,
                    ExecContext& ctx, io::JsonlWriter* metrics) {
  const int rank = world != nullptr ? world->rank() : 0;
  const std::vector<ap::ArrayJob> jobs = array_jobs(o);
  std::vector<parallel::TrainConfig> configs =
      array_job_configs(jobs, base, pipeline, train->size());
  // The evaluation batch that the job's solo run takes (tools/train_command.cpp's rule): the
  // job's batch on text, its micro-batch under --mem-limit, unless --eval-batch-size says.
  if (o.eval_batch_size == 0) {
    for (parallel::TrainConfig& c : configs) {
      c.eval_batch_size = !o.mem_limit.empty()               ? c.batch_size / pipeline.micro_batches
                          : io::dataset_info(o.dataset).text ? c.batch_size
                                                             : c.eval_batch_size;
    }
  }
  ap::SchedulerOptions scheduler;
  scheduler.kind = ap::parse_scheduler_kind(o.array_scheduler);
  scheduler.bnb_max_jobs = o.array_bnb_max;
  scheduler.ga.seed = base.seed;
  if (rank == 0) {
    std::printf(
        "array: %zu jobs (%s), scheduler %s, each job's blocks as --schedule gpipe with "
        "--micro-batches %lld\n",
        jobs.size(), o.array_mode.c_str(), o.array_scheduler.c_str(),
        static_cast<long long>(pipeline.micro_batches));
    for (size_t i = 0; i < jobs.size(); ++i) {
      const parallel::TrainConfig& c = configs[i];
      std::printf("  job %zu: lr %g, weight-decay %g, momentum %g, batch-size %lld, seed %llu\n", i,
                  c.optimizer.schedule.base_lr, c.optimizer.weight_decay, c.optimizer.momentum,
                  static_cast<long long>(c.batch_size), static_cast<unsigned long long>(c.seed));
    }
    std::fflush(stdout);
  }
  ap::ArrayMemoryOptions memory;
  {
    const std::unique_ptr<graph::Model> model = graph::build_model(spec);
    const ArraySlots slots = array_slots(o, train, *model, pipeline, configs);
    memory.slots = slots.slots;
    if (rank == 0 && !slots.line.empty()) std::printf("%s\n", slots.line.c_str());
  }
  memory.host_pool_bytes = parse_bytes(o.swap_pool);
  ArrayReporter reporter(metrics);
  ap::ArrayTrainer trainer(ctx, spec, std::move(train), std::move(test), configs, pipeline,
                           scheduler, world, rank == 0 ? &reporter : nullptr, memory);
  const ap::ArraySummary summary = trainer.run();
  if (rank != 0) return;
  const ap::ScheduleResult& s = summary.schedule;
  std::printf(
      "array: %lld iterations in %.2fs; task graph by %s (modelled makespan %.4g%s, "
      "%.3fs to schedule), rescheduled %lld times as jobs left; %lld state switches on "
      "stage 0\n",
      static_cast<long long>(summary.iterations), summary.train_seconds, s.algorithm.c_str(),
      s.makespan, s.proven_optimal ? ", proven optimal" : "", s.seconds,
      static_cast<long long>(summary.reschedules), static_cast<long long>(summary.switches));
  const ap::SlotStats& m = summary.slots;
  std::string peaks, pools;
  for (size_t s = 0; s < summary.peak_bytes.size(); ++s) {
    peaks += (s ? ", " : "") + format_bytes(static_cast<size_t>(summary.peak_bytes[s]));
    pools += (s ? ", " : "") + format_bytes(static_cast<size_t>(summary.host_pool_peak_bytes[s]));
  }
  std::printf(
      "array memory: %d slots per stage, state %s per job; stage 0: %lld loads (%lld "
      "prefetched), %lld offloads, %lld stalls (%lld not prefetched, %.3fs waiting), %.3fs "
      "waiting for evictions; allocator peak per rank: %s%s%s; host pool peak: %s\n",
      m.slots, format_bytes(m.state_bytes).c_str(), static_cast<long long>(m.loads),
      static_cast<long long>(m.prefetched), static_cast<long long>(m.offloads),
      static_cast<long long>(m.stalls), static_cast<long long>(m.not_prefetched), m.stall_seconds,
      m.offload_wait_seconds, peaks.c_str(), o.mem_limit.empty() ? "" : " (--mem-limit ",
      o.mem_limit.empty() ? "" : (o.mem_limit + ")").c_str(), pools.c_str());
  for (size_t i = 0; i < summary.jobs.size(); ++i) {
    const ap::ArrayJobSummary& j = summary.jobs[i];
    char accuracy[64] = "";
    if (j.last_eval) {
      std::snprintf(accuracy, sizeof(accuracy), ", test accuracy %.2f%%",
                    100.0 * j.last_eval->accuracy);
    }
    std::printf("job %zu: %lld steps, last loss %.4f%s%s%s%s%s%s\n", i,
                static_cast<long long>(j.steps), j.last_loss, accuracy,
                j.stopped ? " (stopped: " : "", j.stopped ? (j.why + ")").c_str() : "",
                j.weights_path.empty() ? "" : (", weights " + j.weights_path).c_str(),
                j.resumed_from.empty() ? "" : (", resumed from " + j.resumed_from).c_str(),
                j.last_checkpoint.empty() ? "" : (", checkpoint " + j.last_checkpoint).c_str());
  }
  std::fflush(stdout);
  if (metrics != nullptr && metrics->enabled()) {
    metrics->write({{"type", "array"},
                    {"jobs", summary.jobs.size()},
                    {"scheduler", s.algorithm},
                    {"makespan_model", s.makespan},
                    {"proven_optimal", s.proven_optimal},
                    {"schedule_seconds", s.seconds},
                    {"iterations", summary.iterations},
                    {"reschedules", summary.reschedules},
                    {"train_seconds", summary.train_seconds},
                    {"switches_stage0", summary.switches},
                    {"slots", m.slots},
                    {"state_bytes", m.state_bytes},
                    {"loads_stage0", m.loads},
                    {"prefetched_stage0", m.prefetched},
                    {"offloads_stage0", m.offloads},
                    {"stalls_stage0", m.stalls},
                    {"not_prefetched_stage0", m.not_prefetched},
                    {"stall_seconds_stage0", m.stall_seconds},
                    {"peak_bytes", summary.peak_bytes},
                    {"host_pool_peak_bytes", summary.host_pool_peak_bytes}});
    for (size_t i = 0; i < summary.jobs.size(); ++i) {
      const ap::ArrayJobSummary& j = summary.jobs[i];
      metrics->write({{"type", "job"},
                      {"job", i},
                      {"steps", j.steps},
                      {"last_loss", j.last_loss},
                      {"test_accuracy", j.last_eval ? j.last_eval->accuracy : std::nan("")},
                      {"stopped", j.stopped},
                      {"weights", j.weights_path}});
    }
  }
}

}  // namespace strata::tools
