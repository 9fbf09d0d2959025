// ArrayPipe's scheduler (parallel/arraypipe/) on job-arrays of growing size: wall time of Branch
// and Bound (exact, cut at a time limit per instance) and of the GA, and the makespan (Eq. 3) of
// every scheduler side by side, the paper's §V-B1 comparison (B&B ~2 min vs GA 3 s at 30 jobs x
// 8 devices).
//
//   arraypipe_sched_bench [--jobs 5,10,15,20,25,30,35,40] [--stages 8] [--bnb-time-limit 10]
//                         [--ga-population 200] [--ga-generations 100] [--seed 1] [--repeats 3]
//
// Instances: the paper's NLP workload shape, sibling jobs with batch sizes drawn from
// {8, 16, 24, 32} on balanced stages. A block's forward time is 1 + 0.25 * batch size (a fixed
// launch cost plus a part linear in the batch) times a per-stage factor in [0.9, 1.1] (balanced,
// not equal), backward = 2 x forward, recompute = forward (stage-input re-materialisation),
// update = 0.3, switch = 0.1, activation sends 0.2 x batch size / 32. Jobs with the same batch
// size have the same times (lr, weight decay and momentum do not change compute). Units are
// arbitrary (read them as ms). B&B starts from the FIFO schedule and the GA's first population
// holds it, as `--array-scheduler bnb|ga` run them (parallel/arraypipe/scheduler.h). Timings are
// medians of --repeats runs for runs under a second (a cut B&B runs once); "dive" is the first
// leaf of the B&B search, the greedy dive that the paper's Algorithm 1 prints; "bound" is the
// root lower bound. "GA" decodes semi-actively as the paper does, "GA active" decodes with
// Giffler-Thompson (GaDecoding::kActive), both with the same population, generations and seed.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/check.h"
#include "parallel/arraypipe/branch_and_bound.h"
#include "parallel/arraypipe/genetic.h"
#include "parallel/arraypipe/scheduler.h"

namespace strata {
namespace {

using namespace parallel::arraypipe;

Instance make_workload(int jobs, int stages, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> stage_factor(0.9, 1.1);
  std::vector<double> factor(stages);
  for (double& f : factor) f = stage_factor(rng);
  const int batch_sizes[] = {8, 16, 24, 32};
  std::vector<BlockTimes> times;
  for (int j = 0; j < jobs; ++j) {
    const int batch = batch_sizes[rng() % 4];
    for (int s = 0; s < stages; ++s) {
      BlockTimes t;
      t.forward = (1.0 + 0.25 * batch) * factor[s];
      t.backward = 2 * t.forward;
      t.recompute = t.forward;
      t.update = 0.3;
      t.switch_cost = 0.1;
      t.send_forward = s + 1 < stages ? 0.2 * batch / 32.0 : 0.0;
      t.send_backward = s > 0 ? 0.2 * batch / 32.0 : 0.0;
      times.push_back(t);
    }
  }
  return Instance(jobs, stages, times);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  using namespace strata;
  std::vector<int> job_counts = {5, 10, 15, 20, 25, 30, 35, 40};
  int stages = 8;
  double bnb_limit = 10;
  int population = 200;
  int generations = 100;
  uint64_t seed = 1;
  int repeats = 3;
  CLI::App app("ArrayPipe scheduler: B&B and GA wall time and the makespan of every scheduler");
  app.add_option("--jobs", job_counts, "Job-array sizes")->delimiter(',');
  app.add_option("--stages", stages, "Pipeline stages (devices)");
  app.add_option("--bnb-time-limit", bnb_limit, "Seconds before B&B is cut (per instance)");
  app.add_option("--ga-population", population, "GA population");
  app.add_option("--ga-generations", generations, "GA generations");
  app.add_option("--seed", seed, "Seed of the workloads and of the GA");
  app.add_option("--repeats", repeats, "Timed runs per scheduler for runs under a second");
  CLI11_PARSE(app, argc, argv);
  try {
    std::printf(
        "ArrayPipe scheduler, %d stages, B&B cut at %g s, GA population %d x %d "
        "generations (seed %llu)\n\n",
        stages, bnb_limit, population, generations, static_cast<unsigned long long>(seed));
    std::printf(
        "| jobs | B&B s | B&B result | B&B nodes | GA s | GA active s | bound | B&B | dive | "
        "GA | GA active | fifo | gpipe | serial |\n");
    std::printf("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int jobs : job_counts) {
      const Instance in = make_workload(jobs, stages, seed + static_cast<uint64_t>(jobs));
      const std::vector<int> fifo = fifo_sequence(in);
      BnbOptions bo;
      bo.max_jobs = jobs;
      bo.time_limit_s = bnb_limit;
      std::vector<double> bnb_seconds;
      BnbResult bnb;
      for (int r = 0; r < repeats; ++r) {
        bnb = branch_and_bound(in, bo, fifo);
        bnb_seconds.push_back(bnb.seconds);
        if (bnb.seconds >= 1.0) break;
      }
      validate_schedule(in, bnb.schedule);
      GaOptions go;
      go.population = population;
      go.generations = generations;
      go.seed = seed;
      std::vector<double> ga_seconds;
      GaResult ga;
      for (int r = 0; r < repeats; ++r) {
        ga = genetic_schedule(in, go, {fifo});
        ga_seconds.push_back(ga.seconds);
        if (ga.seconds >= 1.0) break;
      }
      validate_schedule(in, ga.schedule);
      GaOptions active_options = go;
      active_options.decoding = GaDecoding::kActive;
      std::vector<double> active_seconds;
      GaResult active;
      for (int r = 0; r < repeats; ++r) {
        active = genetic_schedule(in, active_options, {fifo});
        active_seconds.push_back(active.seconds);
        if (active.seconds >= 1.0) break;
      }
      validate_schedule(in, active.schedule);
      char result[64];
      if (bnb.proven_optimal) {
        std::snprintf(result, sizeof(result), "optimal");
      } else {
        std::snprintf(result, sizeof(result), "cut at %gs", bnb_limit);
      }
      char dive[32];
      if (bnb.dive_makespan < 1e300) {
        std::snprintf(dive, sizeof(dive), "%.1f", bnb.dive_makespan);
      } else {
        std::snprintf(dive, sizeof(dive), "pruned");
      }
      std::printf(
          "| %d | %.3f | %s | %ld | %.3f | %.3f | %.1f | %.1f | %s | %.1f | %.1f | %.1f | %.1f | "
          "%.1f |\n",
          jobs, median(bnb_seconds), result, bnb.nodes, median(ga_seconds), median(active_seconds),
          bnb.root_lower_bound, bnb.makespan, dive, ga.makespan, active.makespan,
          makespan(in, fifo_schedule(in)), makespan(in, gpipe_schedule(in)),
          makespan(in, serial_schedule(in)));
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "arraypipe_sched_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
