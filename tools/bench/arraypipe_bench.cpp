// ArrayPipe's throughput (issue 17, papers/arraypipe.md Fig. 7): the time to train every job of a
// job-array for --steps steps, ArrayPipe (the array on one pipeline, task graph by B&B and by the
// GA) against one job at a time on the same stages (each job alone with gpipe, then with 1f1b, at
// its best number of micro-batches among the divisors of its batch in {1, 2, 4, 8}, as the paper
// gives each baseline its best).
//
//   arraypipe_bench [--stages 4] [--jobs 8] [--steps 4] [--repeats 3]
//
// The model is an MLP of 2 layers per stage (--width units) on random features; every layer is a
// TimedLinear (tools/bench/timed_linear.h): its product runs and it then sleeps until
// --fixed-us + --per-row-us x rows have passed (backward twice that), a device's cost model (a
// cost per call, which small micro-batches pay many times, and a cost per sample), so that the
// stages, local threads on this 2-core machine, do not compete for the cores: the figure is the
// schedules' and the runtime's, as on one device per stage. --fixed-us 0 --per-row-us 0 is the
// real CPU run (the layers' products only, the threads sharing the cores), printed as a second
// table by default (--real on, --real-width units, enough work per layer to be timed).
//
// Jobs: batch sizes cycle through --batch-sizes (the paper's NLP ones, 8 16 24 32), learning
// rates differ (they change no time). Times are the trainers' own training time (iterations, no
// setup), medians over --repeats, the configurations interleaved within each repeat.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/check.h"
#include "engine/exec_context.h"
#include "graph/model.h"
#include "parallel/arraypipe/array_trainer.h"
#include "parallel/comm/local_comm.h"
#include "parallel/trainer.h"
#include "tools/bench/bench_random.h"
#include "tools/bench/timed_linear.h"

namespace strata {
namespace {

namespace ap = parallel::arraypipe;

struct Options {
  int stages = 4;
  int jobs = 8;
  int64_t steps = 4;
  int repeats = 3;
  int width = 256;
  int real_width = 1024;  // the real CPU run's layers (enough work to time)
  int fixed_us = 2000;
  int per_row_us = 150;
  std::vector<int64_t> batch_sizes = {8, 16, 24, 32};
  bool real = true;
};

struct Workload {
  parallel::ModelBuilder build;
  std::shared_ptr<const io::Dataset> train;
  parallel::PipelineConfig pipeline;
};

Workload make_workload(const Options& o, int width, int fixed_us, int per_row_us) {
  Workload w;
  const int layers = 2 * o.stages;
  w.build = [layers, width, fixed_us, per_row_us] {
    auto model = std::make_unique<graph::Model>("timed-mlp", Shape{width}, DType::kF32);
    for (int l = 0; l < layers; ++l) {
      model->add(std::make_unique<bench::TimedLinear>(
          "fc" + std::to_string(l), width, l + 1 == layers ? 10 : width,
          std::chrono::microseconds(fixed_us), std::chrono::microseconds(per_row_us)));
    }
    return model;
  };
  int64_t most = *std::max_element(o.batch_sizes.begin(), o.batch_sizes.end());
  w.train = std::make_shared<tools::RandomFeatures>(most * (o.steps + 1), width);
  w.pipeline.stages = o.stages;
  for (int s = 0; s < o.stages; ++s) {
    w.pipeline.partition.push_back({static_cast<size_t>(2 * s), static_cast<size_t>(2 * s + 2)});
  }
  return w;
}

parallel::TrainConfig job_config(const Options& o, int job) {
  parallel::TrainConfig c;
  c.steps = o.steps;
  c.batch_size = o.batch_sizes[static_cast<size_t>(job) % o.batch_sizes.size()];
  c.seed = static_cast<uint64_t>(job + 1);
  c.log_every = 1000000;
  c.num_workers = 0;
  c.optimizer.kind = graph::OptimizerKind::kSgd;
  c.optimizer.schedule.base_lr = 0.01 * (1 + job % 3);
  return c;
}

// Seconds of training of the whole array on local ranks.
double run_array(const Options& o, const Workload& w, ap::SchedulerKind kind, std::string* algo) {
  std::vector<parallel::TrainConfig> jobs;
  for (int j = 0; j < o.jobs; ++j) jobs.push_back(job_config(o, j));
  ap::SchedulerOptions so;
  so.kind = kind;
  so.bnb_time_limit_s = 5;
  double seconds = 0;
  parallel::LocalWorld world(o.stages);
  parallel::run_local_ranks(world, [&](parallel::LocalCommunicator& comm) {
    ExecContext ctx(Device::cpu(), nullptr, 1);
    ap::ArrayTrainer trainer(ctx, w.build, w.train, nullptr, jobs, w.pipeline, so, &comm, nullptr);
    const ap::ArraySummary s = trainer.run();
    if (comm.rank() == 0) {
      seconds = s.train_seconds;
      *algo = s.schedule.algorithm + (s.schedule.proven_optimal ? " (optimal)" : "");
    }
  });
  return seconds;
}

// Seconds of training of one job alone with `kind` and M micro-batches.
double run_solo(const Options& o, const Workload& w, int job, parallel::ScheduleKind kind,
                int64_t m) {
  parallel::TrainConfig c = job_config(o, job);
  parallel::PipelineConfig p = w.pipeline;
  p.schedule = kind;
  p.micro_batches = m;
  double seconds = 0;
  parallel::LocalWorld world(o.stages);
  parallel::run_local_ranks(world, [&](parallel::LocalCommunicator& comm) {
    ExecContext ctx(Device::cpu(), nullptr, 1);
    parallel::Trainer trainer(ctx, w.build, w.train, nullptr, c, p, &comm, nullptr);
    const parallel::TrainSummary s = trainer.run();
    if (comm.rank() == 0) seconds = s.train_seconds;
  });
  return seconds;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void table(const Options& o, int width, int fixed_us, int per_row_us, const char* title) {
  const Workload w = make_workload(o, width, fixed_us, per_row_us);
  std::printf("\n%s\n", title);
  std::vector<double> bnb, ga, gpipe, f1b;
  std::string bnb_algo, ga_algo;
  std::vector<std::string> best_m(2);
  for (int r = 0; r < o.repeats; ++r) {
    bnb.push_back(run_array(o, w, ap::SchedulerKind::kBnb, &bnb_algo));
    ga.push_back(run_array(o, w, ap::SchedulerKind::kGa, &ga_algo));
    // One job at a time, each at its best M (chosen in this repeat).
    for (int k = 0; k < 2; ++k) {
      const parallel::ScheduleKind kind =
          k == 0 ? parallel::ScheduleKind::kGPipe : parallel::ScheduleKind::k1F1B;
      double total = 0;
      std::string ms;
      for (int j = 0; j < o.jobs; ++j) {
        const int64_t batch = job_config(o, j).batch_size;
        double best = 1e30;
        int64_t arg = 1;
        for (int64_t m : {1, 2, 4, 8}) {
          if (batch % m != 0) continue;
          const double t = run_solo(o, w, j, kind, m);
          if (t < best) best = t, arg = m;
        }
        total += best;
        ms += (ms.empty() ? "" : ",") + std::to_string(arg);
      }
      (k == 0 ? gpipe : f1b).push_back(total);
      best_m[static_cast<size_t>(k)] = ms;
    }
  }
  const double b = median(bnb), g = median(ga), gp = median(gpipe), f = median(f1b);
  const double best_pmp = std::min(gp, f);
  std::printf(
      "| configuration | time to train all %d jobs x %lld steps (s) | speedup vs best "
      "per-job pipeline |\n|---|---|---|\n",
      o.jobs, static_cast<long long>(o.steps));
  std::printf("| ArrayPipe, B&B (%s) | %.3f | %.2fx |\n", bnb_algo.c_str(), b, best_pmp / b);
  std::printf("| ArrayPipe, GA | %.3f | %.2fx |\n", g, best_pmp / g);
  std::printf("| one job at a time, gpipe (best M per job: %s) | %.3f | %.2fx |\n",
              best_m[0].c_str(), gp, best_pmp / gp);
  std::printf("| one job at a time, 1f1b (best M per job: %s) | %.3f | %.2fx |\n",
              best_m[1].c_str(), f, best_pmp / f);
  std::fflush(stdout);
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  using namespace strata;
  Options o;
  CLI::App app{"ArrayPipe throughput: a job-array vs one job at a time"};
  app.add_option("--stages", o.stages, "pipeline stages (local threads)");
  app.add_option("--jobs", o.jobs, "jobs in the array");
  app.add_option("--steps", o.steps, "steps of every job");
  app.add_option("--repeats", o.repeats, "repeats (median)");
  app.add_option("--width", o.width, "hidden units of the MLP");
  app.add_option("--fixed-us", o.fixed_us, "cost model: microseconds per layer call (forward)");
  app.add_option("--per-row-us", o.per_row_us, "cost model: microseconds per sample (forward)");
  app.add_option("--batch-sizes", o.batch_sizes, "the jobs' batch sizes, cycled");
  app.add_option("--real", o.real, "also the real CPU run (no cost model)");
  app.add_option("--real-width", o.real_width, "hidden units of the real CPU run's MLP");
  CLI11_PARSE(app, argc, argv);
  try {
    STRATA_CHECK(o.stages >= 1 && o.jobs >= 1 && o.steps >= 1 && o.repeats >= 1)
        << "--stages, --jobs, --steps and --repeats must be positive";
    std::printf("arraypipe_bench: %d jobs (batch sizes cycling", o.jobs);
    for (int64_t b : o.batch_sizes) std::printf(" %lld", static_cast<long long>(b));
    std::printf(
        "), %lld steps each, %d stages of 2 layers (width %d) on local threads, median "
        "of %d\n",
        static_cast<long long>(o.steps), o.stages, o.width, o.repeats);
    char title[200];
    std::snprintf(title, sizeof(title),
                  "Device cost model (timed layers: %d us per call + %d us per sample forward, "
                  "backward twice; the stages sleep instead of sharing the cores):",
                  o.fixed_us, o.per_row_us);
    table(o, o.width, o.fixed_us, o.per_row_us, title);
    if (o.real) {
      std::snprintf(title, sizeof(title),
                    "Real CPU run (width %d, the layers' products only; the stages' threads share "
                    "this machine's cores):",
                    o.real_width);
      table(o, o.real_width, 0, 0, title);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "arraypipe_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
