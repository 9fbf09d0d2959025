// Grouped pipelines (GroPipe, parallel/grouped_dp.h) end to end: training throughput of G groups
// x S stages through the Trainer, on local threads or on MPI ranks.
//
//   gropipe_bench --mode overlap [--groups 2 --stages 2] [--repeats 5]   # --dp-overlap on vs off
//   gropipe_bench --mode delay --delays 0,1                # --dp-delay 0 vs 1, interleaved
//   gropipe_bench --mode sweep [--ranks 4]                 # throughput over N x k and M
//   gropipe_bench --mode accuracy --target 0.80            # time to a test accuracy, 3 layouts
//   gropipe_bench --mode accuracy --device-model t4        # ... and on the device's cost model
//   mpirun -np 4 gropipe_bench --mode overlap              # the same on MPI ranks
//
// --system gropipe (the default) runs the paper's configuration (parallel/gropipe/preset.h): gpipe,
// one all-reduce per stage launched by its hook, no delay unless --dp-delay says otherwise, and
// AMPA's partition (with its guard) of the workload's per-layer costs; --system custom runs 1f1b
// with --dp-bucket-mb buckets on the even split. The first lines say which.
//
// Throughput is samples/s over the steps after --warmup, taken from the trainer's per-step clock
// on rank 0. Configurations are run interleaved (on, off, on, off, ...) and the median of the
// repeats is reported, so that load from other processes hits every configuration alike. The
// default model is an MLP whose gradients are large against its compute per sample (the case
// where the all-reduce matters); --model takes any image model of the registry instead, on
// synthetic images (throughput; --image-size) or Fashion-MNIST (accuracy).
//
// On local threads the overlap and delay modes also report, from the grouped all-reduce's events
// (tools/bench/grad_sync_recorder.h), the share of all-reduce time the ranks did not wait for
// ("hidden"), the share that ran during the update's own backward ("in backward") and the time a
// rank waited for all-reduces per step ("waited").
//
// Device cost models, so that compute leaves the CPU free as it would on an accelerator and the
// gradient all-reduce (real, over the real buffers) no longer competes with it for the cores:
//   --compute-ms X         mlp-wide: every linear layer's forward lasts X ms (backward 2X), its
//                          product runs and the layer sleeps for what it left (timed_linear.h);
//   --device-model NAME    registry models: every layer lasts what parallel/sim's device model
//                          gives for its work on NAME (t4, the paper's GPU, or a100/h100/h200)
//                          at the micro-batch's rows, times --time-scale (timed_layer.h); with
//                          --device-compute on the layer also runs (real accuracy), off it does
//                          not (zeros, for throughput and overlap only).
//
// --mode accuracy with --device-model: the steps each layout needs to reach the target come from
// its real training on this CPU (the arithmetic is the device's too), and its time per step from
// a throughput run on the cost model (--device-compute off; median of --repeats runs of --steps,
// --warmup not timed), so the device's time to the target is steps x cost-model step time. The
// table shows both, the real CPU run's seconds beside the cost model's.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/check.h"
#include "engine/exec_context.h"
#include "models/registry.h"
#include "parallel/comm/local_comm.h"
#include "parallel/gropipe/preset.h"
#include "parallel/partition/partition.h"
#include "parallel/partition/projection.h"
#include "parallel/topology.h"
#include "parallel/trainer.h"
#include "tools/bench/grad_sync_recorder.h"
#include "tools/bench/gropipe_workload.h"
#ifdef STRATA_WITH_MPI
#include "parallel/comm/mpi_comm.h"
#endif

namespace strata {
namespace {

using bench::Options;
using bench::Workload;
using bench::workload;

// Records the trainer's clock at every step and the evaluations (rank 0); with `stop`, asks the
// ranks to stop once an evaluation reaches `target`.
class Clock final : public parallel::TrainObserver {
 public:
  void on_step(const parallel::StepRecord& r) override { elapsed.push_back(r.elapsed_s); }
  void on_eval(const parallel::EvalRecord& r) override {
    evals.push_back({r.step, r.accuracy});
    if (stop != nullptr && r.accuracy >= target) stop->store(1);
  }
  std::atomic<int64_t>* stop = nullptr;
  double target = 0.0;
  std::vector<double> elapsed;
  std::vector<std::pair<int64_t, double>> evals;  // (step, accuracy)
};

struct Result {
  bench::GradSyncRecorder::Overlap overlap;  // local threads only
  bool have_overlap = false;
  double samples_per_s = 0.0;
  double seconds_to_target = -1.0;  // accuracy mode; -1: not reached
  int64_t step_to_target = -1;
  double final_accuracy = 0.0;
};

// The layout's pipeline: the paper's configuration with AMPA's partition of the workload's costs
// at the layout's micro-batch (--system gropipe; --dp-delay given overrides its delay), or 1f1b,
// --dp-bucket-mb buckets and the even split (--system custom).
parallel::PipelineConfig pipeline_of(const Options& o, const Workload& w, int groups, int stages,
                                     int64_t micro, bool overlap, int delay,
                                     parallel::Communicator* mpi) {
  const bool report = mpi == nullptr || mpi->rank() == 0;
  parallel::PipelineConfig p;
  p.groups = groups;
  p.stages = stages;
  p.micro_batches = micro;
  const size_t layers = static_cast<size_t>(w.spec.layer_size());
  parallel::Partition partition = parallel::uniform_partition(layers, stages);
  std::string how = "the even split";
  if (o.system == "gropipe") {
    parallel::apply_gropipe(&p);
    p.grad_sync.overlap = overlap;
    p.grad_sync.delay = delay;
    if (stages > 1) {
      const int64_t rows = std::max<int64_t>(1, o.batch_size / groups / micro);
      parallel::PartitionOptions po;
      po.micro_batches = micro;
      po.micro_batch_size = rows;
      parallel::AmpaResult ampa;
      partition = parallel::gropipe_partition(w.costs(rows), stages, po, &ampa);
      how = parallel::describe_ampa(ampa);
    }
  } else {
    p.schedule = parallel::ScheduleKind::k1F1B;
    p.grad_sync.overlap = overlap;
    p.grad_sync.bucket_mb = o.bucket_mb;
    p.grad_sync.delay = delay;
  }
  if (mpi != nullptr) {
    // Profiled costs are timings: rank 0's partition holds for every rank.
    Tensor bounds = Tensor::zeros({static_cast<int64_t>(stages)}, DType::kI64);
    for (int s = 0; s < stages; ++s) bounds.data<int64_t>()[s] = partition[s].end;
    mpi->broadcast(bounds, 0)->wait(mpi->timeout(), "the partition from rank 0");
    for (int s = 0; s < stages; ++s) {
      partition[s] = {s == 0 ? 0 : partition[s - 1].end,
                      static_cast<size_t>(bounds.data<int64_t>()[s])};
    }
  }
  for (const parallel::LayerRange& r : partition) p.partition.push_back({r.begin, r.end});
  if (report) {
    std::string text;
    for (const parallel::LayerRange& r : partition) {
      text += (text.empty() ? "" : ",") + std::to_string(r.begin) + "-" + std::to_string(r.end - 1);
    }
    std::printf("  layout %dx%d M=%lld: %s, buckets %s, partition %s (%s)\n", groups, stages,
                static_cast<long long>(micro), parallel::schedule_name(p.schedule),
                p.grad_sync.bucket_mb > 0 ? (std::to_string(p.grad_sync.bucket_mb) + " MiB").c_str()
                                          : "one per stage",
                text.c_str(), how.c_str());
    std::fflush(stdout);
  }
  return p;
}

// Runs one configuration on `world` (MPI) or on local threads; every rank returns rank 0's result.
Result run(const Options& o, const Workload& w, const parallel::PipelineConfig& p,
           const parallel::TrainConfig& base_config, parallel::Communicator* mpi_world) {
  Result result;
  std::mutex mutex;
  const int ranks = p.groups * p.stages;
  const int cores =
      o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  // Accuracy mode: the run ends at the first evaluation that reaches the target.
  parallel::RunControl control;
  parallel::TrainConfig config = base_config;
  if (o.mode == "accuracy" && config.eval_every > 0) config.control = &control;
  auto body = [&](parallel::Communicator* world, int threads, const parallel::PipelineConfig& p) {
    ExecContext ctx(Device::cpu(), nullptr, threads);
    Clock clock;
    if (config.control != nullptr) {
      clock.stop = &control.stop;
      clock.target = o.target;
    }
    const bool root = world == nullptr || world->rank() == 0;
    std::unique_ptr<parallel::Trainer> made =
        w.build ? std::make_unique<parallel::Trainer>(ctx, w.build, w.train, w.test, config, p,
                                                      world, root ? &clock : nullptr)
                : std::make_unique<parallel::Trainer>(ctx, w.spec, w.train, w.test, config, p,
                                                      world, root ? &clock : nullptr);
    parallel::Trainer& trainer = *made;
    const parallel::TrainSummary summary = trainer.run();
    if (!root) return;
    std::lock_guard<std::mutex> lock(mutex);
    const size_t n = clock.elapsed.size();
    const int64_t warm = std::min<int64_t>(o.warmup, static_cast<int64_t>(n) - 1);
    const double t0 = warm > 0 ? clock.elapsed[warm - 1] : 0.0;
    result.samples_per_s = static_cast<double>(n - warm) * config.batch_size /
                           std::max(1e-9, clock.elapsed.back() - t0);
    for (const auto& [step, accuracy] : clock.evals) {
      if (result.seconds_to_target < 0 && accuracy >= o.target) {
        result.seconds_to_target = clock.elapsed[static_cast<size_t>(step - 1)];
        result.step_to_target = step;
      }
    }
    if (summary.last_eval) result.final_accuracy = summary.last_eval->accuracy;
  };
  if (mpi_world != nullptr) {
    STRATA_CHECK_EQ(mpi_world->size(), ranks)
        << "gropipe_bench: this layout needs " << ranks << " MPI ranks";
    body(mpi_world, cores, p);
    Tensor t = Tensor::from_vector<double>(
        {result.samples_per_s, result.seconds_to_target, static_cast<double>(result.step_to_target),
         result.final_accuracy},
        {4});
    mpi_world->broadcast(t, 0)->wait(mpi_world->timeout(), "bench result");
    const std::vector<double> v = t.to_vector<double>();
    Result out;
    out.samples_per_s = v[0];
    out.seconds_to_target = v[1];
    out.step_to_target = static_cast<int64_t>(v[2]);
    out.final_accuracy = v[3];
    return out;
  }
  bench::GradSyncRecorder recorder;
  parallel::PipelineConfig observed = p;
  observed.grad_sync_observer = [&recorder](const parallel::GradSyncEvent& e) {
    recorder.record(e);
  };
  parallel::LocalWorld world(ranks);
  parallel::run_local_ranks(world, [&](parallel::LocalCommunicator& comm) {
    body(&comm, std::max(1, cores / ranks), observed);
  });
  result.overlap = recorder.overlap(o.warmup);
  result.have_overlap = true;
  return result;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

parallel::TrainConfig train_config(const Options& o, int64_t steps) {
  parallel::TrainConfig c;
  c.steps = steps;
  c.batch_size = o.batch_size;
  c.seed = 1;
  c.num_workers = 1;
  c.log_every = 1 << 30;
  c.optimizer.kind = graph::OptimizerKind::kSgd;
  c.optimizer.momentum = 0.9;
  c.optimizer.schedule.base_lr = 0.02;
  return c;
}

// Runs the variants interleaved (a, b, a, b, ...) and reports per repeat and the medians.
void compare(const Options& o, const Workload& w,
             const std::vector<std::pair<std::string, parallel::PipelineConfig>>& variants,
             parallel::Communicator* mpi, bool root) {
  const size_t n = variants.size();
  std::vector<std::vector<double>> rate(n), hidden(n), in_backward(n), waited(n), reduce(n);
  for (int r = 0; r < o.repeats; ++r) {
    for (size_t v = 0; v < n; ++v) {
      const Result res = run(o, w, variants[v].second, train_config(o, o.steps), mpi);
      rate[v].push_back(res.samples_per_s);
      if (res.have_overlap) {
        hidden[v].push_back(res.overlap.hidden);
        in_backward[v].push_back(res.overlap.in_backward);
        waited[v].push_back(res.overlap.waited_ms);
        reduce[v].push_back(res.overlap.allreduce_ms);
      }
      if (!root) continue;
      std::printf("  repeat %d %-18s %9.2f samples/s", r, variants[v].first.c_str(),
                  res.samples_per_s);
      if (res.have_overlap) {
        std::printf(
            "; all-reduce %.2f ms/step, hidden %5.1f%%, in backward %5.1f%%, waited %.2f "
            "ms/step",
            res.overlap.allreduce_ms, 100 * res.overlap.hidden, 100 * res.overlap.in_backward,
            res.overlap.waited_ms);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  if (!root) return;
  std::printf("%dx%d, M=%lld, batch %lld, medians of %d (per rank and step for the all-reduce):\n",
              o.groups, o.stages, static_cast<long long>(o.micro_batches),
              static_cast<long long>(o.batch_size), o.repeats);
  std::printf("  %-18s %10s %12s %8s %12s %10s\n", "variant", "samples/s", "all-reduce ms",
              "hidden", "in backward", "waited ms");
  for (size_t v = 0; v < n; ++v) {
    std::printf("  %-18s %10.2f", variants[v].first.c_str(), median(rate[v]));
    if (hidden[v].empty()) {
      std::printf("\n");
      continue;
    }
    std::printf(" %12.2f %7.1f%% %11.1f%% %10.2f\n", median(reduce[v]), 100 * median(hidden[v]),
                100 * median(in_backward[v]), median(waited[v]));
  }
}

void mode_overlap(const Options& o, const Workload& w, parallel::Communicator* mpi, bool root) {
  std::vector<std::pair<std::string, parallel::PipelineConfig>> variants;
  for (bool overlap : {true, false}) {
    variants.push_back(
        {overlap ? "overlap on" : "overlap off",
         pipeline_of(o, w, o.groups, o.stages, o.micro_batches, overlap, o.delay, mpi)});
  }
  compare(o, w, variants, mpi, root);
}

std::vector<int64_t> parse_list(const std::string& text);

void mode_delay(const Options& o, const Workload& w, parallel::Communicator* mpi, bool root) {
  std::vector<std::pair<std::string, parallel::PipelineConfig>> variants;
  const bool both = o.buffer_channels.find(',') != std::string::npos;
  for (int64_t d : parse_list(o.delays)) {
    for (const std::string channel : {"own", "shared"}) {
      if (o.buffer_channels.find(channel) == std::string::npos) continue;
      parallel::PipelineConfig p =
          pipeline_of(o, w, o.groups, o.stages, o.micro_batches, true, static_cast<int>(d), mpi);
      p.grad_sync.buffers_channel = channel == "own";
      variants.push_back({"delay " + std::to_string(d) + (both ? " bn " + channel : ""), p});
    }
  }
  compare(o, w, variants, mpi, root);
}

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    out.push_back(std::stoll(text.substr(at, comma - at)));
    at = comma + 1;
  }
  return out;
}

void mode_sweep(const Options& o, const Workload& w, parallel::Communicator* mpi, bool root) {
  const size_t layers = static_cast<size_t>(w.spec.layer_size());
  std::vector<std::pair<int, int>> layouts;  // (N, k) with N k = ranks
  for (int k = 1; k <= o.ranks; ++k) {
    if (o.ranks % k == 0 && static_cast<size_t>(k) <= layers) layouts.push_back({o.ranks / k, k});
  }
  const std::vector<int64_t> micro = parse_list(o.micro_list);
  if (root) {
    std::printf("throughput (samples/s, median of %d) on %d ranks, batch %lld:\n%-8s", o.repeats,
                o.ranks, static_cast<long long>(o.batch_size), "N x k");
    for (int64_t m : micro) std::printf(" %9s", ("M=" + std::to_string(m)).c_str());
    std::printf("\n");
  }
  std::vector<std::vector<std::vector<double>>> samples(
      layouts.size(), std::vector<std::vector<double>>(micro.size()));
  std::map<std::pair<size_t, size_t>, parallel::PipelineConfig> pipelines;
  for (size_t l = 0; l < layouts.size(); ++l) {
    for (size_t i = 0; i < micro.size(); ++i) {
      const auto [n, k] = layouts[l];
      if ((o.batch_size / n) % micro[i] != 0 || o.batch_size % n != 0) continue;
      pipelines[{l, i}] = pipeline_of(o, w, n, k, micro[i], true, o.delay, mpi);
    }
  }
  for (int r = 0; r < o.repeats; ++r) {
    for (size_t l = 0; l < layouts.size(); ++l) {
      for (size_t i = 0; i < micro.size(); ++i) {
        if (!pipelines.count({l, i})) continue;
        samples[l][i].push_back(
            run(o, w, pipelines[{l, i}], train_config(o, o.steps), mpi).samples_per_s);
      }
    }
  }
  if (!root) return;
  for (size_t l = 0; l < layouts.size(); ++l) {
    std::printf(
        "%-8s",
        (std::to_string(layouts[l].first) + "x" + std::to_string(layouts[l].second)).c_str());
    for (size_t i = 0; i < micro.size(); ++i) {
      if (samples[l][i].empty())
        std::printf(" %9s", "-");
      else
        std::printf(" %9.1f", median(samples[l][i]));
    }
    std::printf("\n");
  }
}

// Time to the target for 2x2, 4x1 (data parallelism, the paper's DP baseline) and 1x4 (one
// pipeline, its PP baseline), trained on this CPU; with `device` (--device-model), each layout's
// steps to the target times its step time on the device's cost model as well.
void mode_accuracy(const Options& o, const Workload& w, const Workload* device,
                   parallel::Communicator* mpi, bool root) {
  const int64_t per_epoch = w.train->size() / o.batch_size;
  parallel::TrainConfig c = train_config(o, 0);
  c.steps = 0;
  c.epochs = o.max_epochs;
  c.eval_every = std::max<int64_t>(1, per_epoch / 4);
  c.optimizer.schedule.base_lr = 0.05;
  const std::vector<std::pair<int, int>> layouts = {{2, 2}, {4, 1}, {1, 4}};
  std::vector<int64_t> micro(layouts.size(), o.micro_batches);
  std::vector<Result> real(layouts.size());
  for (size_t l = 0; l < layouts.size(); ++l) {
    const auto [n, k] = layouts[l];
    if (o.micro_size > 0) {
      STRATA_CHECK(o.batch_size % (n * o.micro_size) == 0)
          << "--batch-size " << o.batch_size << " is not a multiple of " << n
          << " groups x --micro-size " << o.micro_size;
      micro[l] = o.batch_size / n / o.micro_size;
    }
    real[l] = run(o, w, pipeline_of(o, w, n, k, micro[l], true, o.delay, mpi), c, mpi);
  }
  // The cost model's step time of each layout: its runs interleaved, so load hits them alike.
  std::vector<std::vector<double>> ms_per_step(layouts.size());
  std::vector<double> compute_ms(layouts.size());  // the layers' own time (Eq. 1's projection)
  if (device != nullptr) {
    std::vector<parallel::PipelineConfig> pipelines;
    for (size_t l = 0; l < layouts.size(); ++l) {
      pipelines.push_back(pipeline_of(o, *device, layouts[l].first, layouts[l].second, micro[l],
                                      true, o.delay, mpi));
      const int64_t rows = o.batch_size / layouts[l].first / micro[l];
      const std::vector<parallel::LayerCost> costs = device->costs(rows);
      std::vector<double> forward, backward;
      for (const auto& [begin, end] : pipelines[l].partition) {
        forward.push_back(0.0);
        backward.push_back(0.0);
        for (size_t i = begin; i < end; ++i) {
          forward.back() += costs[i].forward_ms * static_cast<double>(rows);
          backward.back() += costs[i].backward_ms * static_cast<double>(rows);
        }
      }
      compute_ms[l] = parallel::projected_step_time(forward, backward, micro[l]);
    }
    for (int r = 0; r < o.repeats; ++r) {
      for (size_t l = 0; l < layouts.size(); ++l) {
        const Result t = run(o, *device, pipelines[l], train_config(o, o.steps), mpi);
        ms_per_step[l].push_back(1e3 * static_cast<double>(o.batch_size) / t.samples_per_s);
      }
    }
  }
  if (!root) return;
  std::printf(
      "dp: data parallelism (the paper's DP baseline), pp: one pipeline (its PP baseline)\n");
  std::printf(
      "time to %.1f%% test accuracy on Fashion-MNIST (%lld test samples), %s %s, batch %lld, "
      "%s, at most %lld epochs (%lld steps each; evaluation every %lld steps, not timed):\n",
      100 * o.target, static_cast<long long>(w.test->size()), o.model.c_str(), o.size.c_str(),
      static_cast<long long>(o.batch_size),
      o.micro_size > 0 ? ("micro-batches of " + std::to_string(o.micro_size)).c_str()
                       : ("M=" + std::to_string(o.micro_batches)).c_str(),
      static_cast<long long>(o.max_epochs), static_cast<long long>(per_epoch),
      static_cast<long long>(c.eval_every));
  if (device != nullptr) {
    std::printf(
        "  step, epoch, cpu s, cpu samples/s: the real training on this CPU; %s ms/step: a run "
        "of %lld steps on %s (layers not computed), median of %d, the first %lld not timed; "
        "%s s = step x %s ms/step; compute ms: the layers' own time per step on it (Eq. 1's "
        "projection, the rest is this CPU's work: all-reduce, optimizer, data, hand-offs)\n",
        o.device_model.c_str(), static_cast<long long>(o.steps), device->costs_source.c_str(),
        o.repeats, static_cast<long long>(o.warmup), o.device_model.c_str(),
        o.device_model.c_str());
  }
  std::printf("  %-8s %3s %6s %6s %6s %8s %14s %12s %8s %10s\n", "N x k", "M", "micro", "step",
              "epoch", "cpu s", "cpu samples/s",
              device ? (o.device_model + " ms/step").c_str() : "",
              device ? (o.device_model + " s").c_str() : "", device ? "compute ms" : "");
  std::fflush(stdout);
  for (size_t l = 0; l < layouts.size(); ++l) {
    const auto [n, k] = layouts[l];
    const Result& r = real[l];
    const bool hit = r.seconds_to_target >= 0;
    const char* role = k == 1 ? " dp" : n == 1 ? " pp" : "";  // the paper's DP and PP baselines
    std::printf("  %-8s %3lld %6lld", (std::to_string(n) + "x" + std::to_string(k) + role).c_str(),
                static_cast<long long>(micro[l]),
                static_cast<long long>(o.batch_size / n / micro[l]));
    if (hit) {
      std::printf(" %6lld %6.2f %8.1f", static_cast<long long>(r.step_to_target),
                  static_cast<double>(r.step_to_target) / static_cast<double>(per_epoch),
                  r.seconds_to_target);
    } else {
      std::printf(" %6s %6s %8s", "-", "-", "-");
    }
    std::printf(" %14.1f", r.samples_per_s);
    if (device != nullptr) {
      const double ms = median(ms_per_step[l]);
      char seconds[32] = "-";
      if (hit) std::snprintf(seconds, sizeof seconds, "%.1f", 1e-3 * ms * r.step_to_target);
      std::printf(" %12.2f %8s %10.2f", ms, seconds, compute_ms[l]);
    }
    std::printf("   last eval %.2f%%%s\n", 100 * r.final_accuracy, hit ? "" : " (not reached)");
  }
  std::fflush(stdout);
}

int bench_main(int argc, char** argv) {
  Options o;
  CLI::App app("GroPipe benchmark: grouped pipelines through the Trainer");
  app.option_defaults()->always_capture_default();
  app.add_option("--mode", o.mode, "overlap, delay, sweep or accuracy")
      ->check(CLI::IsMember({"overlap", "delay", "sweep", "accuracy"}));
  app.add_option("--system", o.system,
                 "gropipe (the paper's configuration: " +
                     parallel::preset_flags(parallel::gropipe_preset()) +
                     ") or custom (1f1b, --dp-bucket-mb buckets, the even split)")
      ->check(CLI::IsMember({"gropipe", "custom"}));
  app.add_option("--model", o.model, "mlp-wide, or an image model: " + models::model_names());
  app.add_option("--size", o.size, "Size of a registry model");
  app.add_option("--image-size", o.image_size, "Side of the synthetic images (throughput modes)");
  app.add_option("--width", o.width, "mlp-wide: hidden units");
  app.add_option("--depth", o.depth, "mlp-wide: linear layers");
  app.add_option("--groups", o.groups, "overlap and delay modes: groups N");
  app.add_option("--stages", o.stages, "overlap and delay modes: stages k");
  app.add_option("--ranks", o.ranks, "sweep mode: N x k (local threads; MPI: the world size)");
  app.add_option("--micro-batches", o.micro_batches, "Micro-batches M (overlap, delay, accuracy)");
  app.add_option("--micro-list", o.micro_list, "sweep mode: the values of M");
  app.add_option("--batch-size", o.batch_size, "Global batch");
  app.add_option("--steps", o.steps, "Steps per run (throughput)");
  app.add_option("--warmup", o.warmup, "Steps not timed");
  app.add_option("--repeats", o.repeats, "Runs per configuration (medians reported)");
  app.add_option("--dp-bucket-mb", o.bucket_mb,
                 "--system custom: gradient bucket MiB (0 = one per stage)");
  app.add_option("--dp-delay", o.delay, "Gradient delay D (overrides the preset's 0)");
  app.add_option("--delays", o.delays, "delay mode: the values of D compared");
  app.add_option("--buffer-channels", o.buffer_channels,
                 "delay mode: own (batch-norm statistics all-reduced on a channel of their own), "
                 "shared (queued behind the gradient buckets, as before), or own,shared");
  app.add_option("--target", o.target, "accuracy mode: test accuracy to reach");
  app.add_option("--max-epochs", o.max_epochs, "accuracy mode: epochs at most");
  app.add_option("--test-samples", o.test_samples,
                 "accuracy mode: evaluate on the first this many test samples (0: all)");
  app.add_option(
      "--micro-size", o.micro_size,
      "accuracy mode: samples per micro-batch, M chosen per layout (0: --micro-batches)");
  app.add_option("--threads", o.threads, "CPU threads per process (0 = all cores)");
  app.add_option("--compute-ms", o.compute_ms,
                 "mlp-wide: each linear layer's forward lasts this many ms (backward twice), "
                 "sleeping for what its product leaves: compute off the CPU, as on an "
                 "accelerator (0: real CPU compute only)");
  app.add_option("--compute-ms-per-sample", o.compute_ms_per_sample,
                 "with --compute-ms: each layer's forward lasts this much longer per sample of "
                 "its micro-batch (a device's cost: a fixed part and a part per sample)");
  app.add_option("--device-model", o.device_model,
                 "Registry models: every layer lasts what the simulator's device model gives "
                 "for its work on this GPU (t4, a100, h100, h200), times --time-scale "
                 "(empty: real CPU compute only); accuracy mode: the layouts' steps to the "
                 "target from real training, times their step time on this cost model");
  app.add_option("--time-scale", o.time_scale, "with --device-model: the factor on its times");
  app.add_option("--device-compute", o.device_compute,
                 "with --device-model: on (the layers also run: real accuracy) or off (they "
                 "return zeros: throughput and overlap only)")
      ->check(CLI::IsMember({"on", "off"}));
  CLI11_PARSE(app, argc, argv);
  STRATA_CHECK(o.steps > o.warmup && o.warmup >= 0) << "--steps must exceed --warmup";
  STRATA_CHECK(o.repeats >= 1) << "--repeats must be at least 1";
  STRATA_CHECK(o.compute_ms >= 0 && (o.compute_ms == 0 || o.model == "mlp-wide"))
      << "--compute-ms applies to --model mlp-wide only (and must be >= 0)";
  STRATA_CHECK(o.compute_ms_per_sample >= 0 && (o.compute_ms_per_sample == 0 || o.compute_ms > 0))
      << "--compute-ms-per-sample needs --compute-ms (and must be >= 0)";
  STRATA_CHECK(o.time_scale > 0) << "--time-scale must be > 0";

  std::unique_ptr<parallel::Communicator> mpi;
#ifdef STRATA_WITH_MPI
  std::unique_ptr<parallel::MpiSession> session;
  if (parallel::discover_process().world_size > 1) {
    session = std::make_unique<parallel::MpiSession>(&argc, &argv);
    mpi = session->world();
    o.ranks = mpi->size();
    if (o.mode == "overlap" || o.mode == "delay") {
      STRATA_CHECK_EQ(o.groups * o.stages, mpi->size()) << "--groups x --stages must be the world";
    }
  }
#endif
  const bool root = mpi == nullptr || mpi->rank() == 0;
  STRATA_CHECK(o.test_samples >= 0) << "--test-samples must be >= 0";
  // Accuracy mode trains on this CPU; a device model gives the step times of separate runs.
  Options real = o;
  std::unique_ptr<Workload> device;
  if (o.mode == "accuracy" && !o.device_model.empty()) {
    real.device_model.clear();
    Options timed = o;
    timed.device_compute = "off";
    device = std::make_unique<Workload>(workload(timed, true));
  }
  const Workload w = workload(real, o.mode == "accuracy");
  const size_t layers = static_cast<size_t>(w.spec.layer_size());
  if (root) {
    std::printf("gropipe_bench: %s on %s, %zu layers, %s\n", w.spec.name().c_str(),
                w.train->name().c_str(), layers, mpi ? "MPI ranks" : "local threads");
    if (o.system == "gropipe") {
      std::printf(
          "system gropipe: %s%s; AMPA on layer costs from %s\n",
          parallel::preset_flags(parallel::gropipe_preset()).c_str(),
          o.delay != 0 ? ("; overridden: --dp-delay " + std::to_string(o.delay)).c_str() : "",
          w.costs_source.c_str());
      if (device) std::printf("cost-model runs: AMPA on %s\n", device->costs_source.c_str());
    } else {
      std::printf("system custom: 1f1b, buckets of %s MiB, the even split\n",
                  std::to_string(o.bucket_mb).c_str());
    }
    std::fflush(stdout);
  }
  if (o.mode == "overlap") mode_overlap(o, w, mpi.get(), root);
  if (o.mode == "delay") mode_delay(o, w, mpi.get(), root);
  if (o.mode == "sweep") mode_sweep(o, w, mpi.get(), root);
  if (o.mode == "accuracy") mode_accuracy(o, w, device.get(), mpi.get(), root);
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  try {
    return strata::bench_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gropipe_bench: %s\n", e.what());
    return 1;
  }
}
