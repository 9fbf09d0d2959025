// Grouped pipelines (GroPipe, parallel/grouped_dp.h) end to end: training throughput of G groups
// x S stages through the Trainer, on local threads or on MPI ranks.
//
//   gropipe_bench --mode overlap [--groups 2 --stages 2] [--repeats 5]   # --dp-overlap on vs off
//   gropipe_bench --mode sweep [--ranks 4]                 # throughput over N x k and M
//   gropipe_bench --mode accuracy --target 0.80            # time to a test accuracy, 3 layouts
//   mpirun -np 4 gropipe_bench --mode overlap              # the same on MPI ranks
//
// Throughput is samples/s over the steps after --warmup, taken from the trainer's per-step clock
// on rank 0. Configurations are run interleaved (on, off, on, off, ...) and the median of the
// repeats is reported, so that load from other processes hits every configuration alike. The
// default model is an MLP whose gradients are large against its compute per sample (the case
// where the all-reduce matters); --model takes any image model of the registry instead, on
// synthetic images (throughput) or Fashion-MNIST (accuracy).
//
// On local threads the overlap mode also reports, from the grouped all-reduce's events, how much
// of the gradient all-reduce ran while the group was still in its backward pass ("hidden": the
// part of each all-reduce before the group's last Backward of the step ended, over all
// all-reduce time) and how long a step still waited for all-reduces after that backward
// ("exposed", per step): the overlap itself, apart from what it buys on these cores.
//
// --compute-ms X gives every linear layer of mlp-wide a fixed duration (forward X ms, backward
// 2X, sleeping for what the product leaves), so that compute leaves the CPU free as it would on
// an accelerator and the gradient all-reduce (real, over the real buffers) no longer competes
// with it for the cores: the setting GroPipe's overlap is for.
#include <algorithm>
#include <chrono>
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
#include "graph/model_spec.h"
#include "io/datasets.h"
#include "models/registry.h"
#include "parallel/comm/local_comm.h"
#include "parallel/partition/partition.h"
#include "parallel/topology.h"
#include "parallel/trainer.h"
#include "tools/bench/timed_linear.h"
#ifdef STRATA_WITH_MPI
#include "parallel/comm/mpi_comm.h"
#endif

namespace strata {
namespace {

struct Options {
  std::string mode = "overlap";
  std::string model = "mlp-wide";  // or a registry model (resnet, vgg, cnn, ...)
  std::string size = "tiny";
  int width = 1024;  // mlp-wide: hidden units
  int depth = 8;     // mlp-wide: linear layers
  int groups = 2, stages = 2, ranks = 4;
  int64_t micro_batches = 4;
  int64_t batch_size = 32;
  int64_t steps = 12, warmup = 3;
  int repeats = 5;
  double bucket_mb = 25.0;
  int delay = 0;
  std::string micro_list = "1,2,4,8";
  double target = 0.80;    // accuracy mode
  int64_t max_epochs = 3;  // accuracy mode
  int64_t micro_size =
      0;            // accuracy mode: samples per micro-batch (M per layout); 0: --micro-batches
  int threads = 0;  // per process; 0 = all cores
  double compute_ms = 0;             // mlp-wide: > 0: each linear layer lasts this (backward twice)
  double compute_ms_per_sample = 0;  // ... plus this per sample of its micro-batch
};

// Random features and labels (throughput only; nothing is learned).
class RandomFeatures final : public io::Dataset {
 public:
  RandomFeatures(int64_t n, int64_t features) : n_(n), features_(features) {}
  std::string name() const override { return "random-features"; }
  int64_t size() const override { return n_; }
  io::SampleSpec input_spec() const override { return {{features_}, DType::kF32}; }
  io::SampleSpec target_spec() const override { return {{}, DType::kI64}; }
  int64_t num_classes() const override { return 10; }
  void get(int64_t i, void* input, void* target) const override {
    float* x = static_cast<float*>(input);
    for (int64_t f = 0; f < features_; ++f)
      x[f] = static_cast<float>(((i * 131 + f * 7) % 17) - 8) / 8;
    *static_cast<int64_t*>(target) = i % 10;
  }

 private:
  int64_t n_, features_;
};

proto::ModelSpec mlp_wide(const Options& o) {
  std::string text = "name: \"mlp_wide\" input { shape: [" + std::to_string(o.width) + "] }\n";
  for (int l = 0; l < o.depth; ++l) {
    const int out = l + 1 == o.depth ? 10 : o.width;
    text += "layer { name: \"fc" + std::to_string(l) +
            "\" type: \"linear\" linear { out_features: " + std::to_string(out) + " } }\n";
    if (l + 1 < o.depth)
      text += "layer { name: \"relu" + std::to_string(l) + "\" type: \"relu\" }\n";
  }
  return graph::parse_model_spec(text, "mlp-wide");
}

struct Workload {
  proto::ModelSpec spec;
  parallel::ModelBuilder build;  // set: the model is built by this (its spec only names layers)
  std::shared_ptr<const io::Dataset> train, test;
};

Workload workload(const Options& o, bool real_data) {
  Workload w;
  if (o.model == "mlp-wide") {
    STRATA_CHECK(!real_data) << "--mode accuracy needs an image model (--model resnet)";
    w.train = std::make_shared<RandomFeatures>(1 << 16, o.width);
    w.spec = mlp_wide(o);
    if (o.compute_ms > 0) {
      // The same layers with a fixed duration each: the compute leaves the CPU free, as on an
      // accelerator, and the all-reduce (real, of the real gradient buffers) has it to itself.
      const auto forward = std::chrono::microseconds(static_cast<int64_t>(o.compute_ms * 1000));
      const auto per_row =
          std::chrono::microseconds(static_cast<int64_t>(o.compute_ms_per_sample * 1000));
      const Options opts = o;
      w.build = [opts, forward, per_row] {
        auto model = std::make_unique<graph::Model>("mlp_wide_timed", Shape{opts.width});
        for (int l = 0; l < opts.depth; ++l) {
          const int out = l + 1 == opts.depth ? 10 : opts.width;
          model->add(std::make_unique<bench::TimedLinear>("fc" + std::to_string(l), opts.width, out,
                                                          forward, per_row));
          if (l + 1 < opts.depth) {
            model->add(std::make_unique<graph::ReluLayer>("relu" + std::to_string(l)));
          }
        }
        return model;
      };
    }
    return w;
  }
  io::DatasetOptions d;
  d.image_size = real_data ? 0 : 32;  // Fashion-MNIST keeps its 28x28
  d.augment = false;
  w.train = io::open_dataset(real_data ? "fashion-mnist" : "synthetic-images", "", "train", d);
  if (real_data) w.test = io::open_dataset("fashion-mnist", "", "test", d);
  w.spec = models::model_spec(o.model, o.size, w.train->input_spec().shape, w.train->num_classes());
  return w;
}

// Records the trainer's clock at every step and the evaluations (rank 0).
class Clock final : public parallel::TrainObserver {
 public:
  void on_step(const parallel::StepRecord& r) override { elapsed.push_back(r.elapsed_s); }
  void on_eval(const parallel::EvalRecord& r) override { evals.push_back({r.step, r.accuracy}); }
  std::vector<double> elapsed;
  std::vector<std::pair<int64_t, double>> evals;  // (step, accuracy)
};

// The grouped all-reduce's events of one run (local threads: every rank in this process).
class SyncRecorder {
 public:
  void record(const parallel::GradSyncEvent& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    const Key key{e.update, e.group};
    if (e.kind == parallel::GradSyncEvent::kBackwardEnd) {
      // Backward ends carry the next update's number: the update whose gradient they produce.
      auto& t = backward_end_[key];
      t = std::max(t, e.time);
    } else if (e.kind == parallel::GradSyncEvent::kStart) {
      open_[{e.update, e.group, e.stage, e.bucket}] = e.time;
    } else if (e.kind == parallel::GradSyncEvent::kEnd) {
      const auto it = open_.find({e.update, e.group, e.stage, e.bucket});
      if (it != open_.end()) spans_.push_back({key, it->second, e.time});
    }
  }
  // (hidden fraction, exposed seconds per step) over updates >= `first_update`.
  std::pair<double, double> overlap(int64_t first_update) const {
    std::lock_guard<std::mutex> lock(mutex_);
    double total = 0.0, hidden = 0.0;
    std::map<Key, Clock::time_point> last_end;
    for (const Span& sp : spans_) {
      if (sp.key.first < first_update) continue;
      const auto be = backward_end_.find(sp.key);
      if (be == backward_end_.end()) continue;
      total += seconds(sp.end - sp.start);
      hidden += std::max(0.0, seconds(std::min(sp.end, be->second) - sp.start));
      auto& le = last_end[sp.key];
      le = std::max(le, sp.end);
    }
    double exposed = 0.0;
    for (const auto& [key, end] : last_end) {
      exposed += std::max(0.0, seconds(end - backward_end_.at(key)));
    }
    return {total > 0 ? hidden / total : 0.0,
            last_end.empty() ? 0.0 : exposed / static_cast<double>(last_end.size())};
  }

 private:
  using Clock = std::chrono::steady_clock;
  using Key = std::pair<int64_t, int>;  // (update, group)
  struct Span {
    Key key;
    Clock::time_point start, end;
  };
  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  mutable std::mutex mutex_;
  std::map<Key, Clock::time_point> backward_end_;
  std::map<std::tuple<int64_t, int, int, int>, Clock::time_point> open_;
  std::vector<Span> spans_;
};

struct Result {
  double hidden = -1.0;     // local threads: fraction of all-reduce time inside the backward
  double exposed_s = -1.0;  // local threads: seconds per step waited after the backward
  double samples_per_s = 0.0;
  double seconds_to_target = -1.0;  // accuracy mode; -1: not reached
  int64_t step_to_target = -1;
  double final_accuracy = 0.0;
};

parallel::PipelineConfig pipeline_of(const Options& o, int groups, int stages, int64_t micro,
                                     bool overlap, size_t layers) {
  parallel::PipelineConfig p;
  p.groups = groups;
  p.stages = stages;
  p.micro_batches = micro;
  p.schedule = parallel::ScheduleKind::k1F1B;
  for (const parallel::LayerRange& r : parallel::uniform_partition(layers, stages)) {
    p.partition.push_back({r.begin, r.end});
  }
  p.grad_sync.overlap = overlap;
  p.grad_sync.bucket_mb = o.bucket_mb;
  p.grad_sync.delay = o.delay;
  return p;
}

// Runs one configuration on `world` (MPI) or on local threads; every rank returns rank 0's result.
Result run(const Options& o, const Workload& w, const parallel::PipelineConfig& p,
           const parallel::TrainConfig& config, parallel::Communicator* mpi_world) {
  Result result;
  std::mutex mutex;
  const int ranks = p.groups * p.stages;
  const int cores =
      o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  auto body = [&](parallel::Communicator* world, int threads, const parallel::PipelineConfig& p) {
    ExecContext ctx(Device::cpu(), nullptr, threads);
    Clock clock;
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
  SyncRecorder recorder;
  parallel::PipelineConfig observed = p;
  observed.grad_sync_observer = [&recorder](const parallel::GradSyncEvent& e) {
    recorder.record(e);
  };
  parallel::LocalWorld world(ranks);
  parallel::run_local_ranks(world, [&](parallel::LocalCommunicator& comm) {
    body(&comm, std::max(1, cores / ranks), observed);
  });
  std::tie(result.hidden, result.exposed_s) = recorder.overlap(o.warmup);
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

void mode_overlap(const Options& o, const Workload& w, size_t layers, parallel::Communicator* mpi,
                  bool root) {
  std::vector<double> on, off, hidden_on, hidden_off, exposed_on, exposed_off;
  for (int r = 0; r < o.repeats; ++r) {
    for (bool overlap : {true, false}) {
      const Result res =
          run(o, w, pipeline_of(o, o.groups, o.stages, o.micro_batches, overlap, layers),
              train_config(o, o.steps), mpi);
      (overlap ? on : off).push_back(res.samples_per_s);
      (overlap ? hidden_on : hidden_off).push_back(res.hidden);
      (overlap ? exposed_on : exposed_off).push_back(res.exposed_s);
      if (root && res.hidden >= 0) {
        std::printf(
            "  repeat %d overlap %-3s %9.1f samples/s; all-reduce hidden in backward %5.1f%%, "
            "exposed %.2f ms/step\n",
            r, overlap ? "on" : "off", res.samples_per_s, 100 * res.hidden, 1e3 * res.exposed_s);
      } else if (root) {
        std::printf("  repeat %d overlap %-3s %9.1f samples/s\n", r, overlap ? "on" : "off",
                    res.samples_per_s);
      }
      std::fflush(stdout);
    }
  }
  if (root && mpi == nullptr) {
    std::printf(
        "all-reduce time hidden in the backward (median): on %.1f%%, off %.1f%%; exposed after "
        "it: on %.2f, off %.2f ms/step\n",
        100 * median(hidden_on), 100 * median(hidden_off), 1e3 * median(exposed_on),
        1e3 * median(exposed_off));
  }
  if (root) {
    std::printf(
        "%dx%d, M=%lld, batch %lld, buckets %s MiB, delay %d: overlap on %.1f, off %.1f "
        "samples/s (medians of %d); on/off = %.3f\n",
        o.groups, o.stages, static_cast<long long>(o.micro_batches),
        static_cast<long long>(o.batch_size), std::to_string(o.bucket_mb).c_str(), o.delay,
        median(on), median(off), o.repeats, median(on) / median(off));
  }
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

void mode_sweep(const Options& o, const Workload& w, size_t layers, parallel::Communicator* mpi,
                bool root) {
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
  for (int r = 0; r < o.repeats; ++r) {
    for (size_t l = 0; l < layouts.size(); ++l) {
      for (size_t i = 0; i < micro.size(); ++i) {
        const auto [n, k] = layouts[l];
        if ((o.batch_size / n) % micro[i] != 0 || o.batch_size % n != 0) continue;
        samples[l][i].push_back(
            run(o, w, pipeline_of(o, n, k, micro[i], true, layers), train_config(o, o.steps), mpi)
                .samples_per_s);
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

void mode_accuracy(const Options& o, const Workload& w, size_t layers, parallel::Communicator* mpi,
                   bool root) {
  const int64_t per_epoch = w.train->size() / o.batch_size;
  parallel::TrainConfig c = train_config(o, 0);
  c.steps = 0;
  c.epochs = o.max_epochs;
  c.eval_every = std::max<int64_t>(1, per_epoch / 4);
  c.optimizer.schedule.base_lr = 0.05;
  if (root) {
    std::printf(
        "time to %.1f%% test accuracy on Fashion-MNIST, %s %s, batch %lld, %s, at most %lld "
        "epochs (%lld steps each; evaluation every %lld steps, not timed):\n",
        100 * o.target, o.model.c_str(), o.size.c_str(), static_cast<long long>(o.batch_size),
        o.micro_size > 0 ? ("micro-batches of " + std::to_string(o.micro_size)).c_str()
                         : ("M=" + std::to_string(o.micro_batches)).c_str(),
        static_cast<long long>(o.max_epochs), static_cast<long long>(per_epoch),
        static_cast<long long>(c.eval_every));
    std::printf("  %-6s %3s %10s %8s %8s %9s %11s\n", "N x k", "M", "micro", "step", "epoch",
                "seconds", "samples/s");
    std::fflush(stdout);
  }
  for (const auto& [n, k] : std::vector<std::pair<int, int>>{{2, 2}, {4, 1}, {1, 4}}) {
    int64_t micro = o.micro_batches;
    if (o.micro_size > 0) {
      STRATA_CHECK(o.batch_size % (n * o.micro_size) == 0)
          << "--batch-size " << o.batch_size << " is not a multiple of " << n
          << " groups x --micro-size " << o.micro_size;
      micro = o.batch_size / n / o.micro_size;
    }
    const Result r = run(o, w, pipeline_of(o, n, k, micro, true, layers), c, mpi);
    if (root) {
      const std::string shape = std::to_string(n) + "x" + std::to_string(k);
      if (r.seconds_to_target >= 0) {
        std::printf("  %-6s %3lld %10lld %8lld %8.2f %9.1f %11.1f   final %.2f%%\n", shape.c_str(),
                    static_cast<long long>(micro), static_cast<long long>(o.batch_size / n / micro),
                    static_cast<long long>(r.step_to_target),
                    static_cast<double>(r.step_to_target) / static_cast<double>(per_epoch),
                    r.seconds_to_target, r.samples_per_s, 100 * r.final_accuracy);
      } else {
        std::printf("  %-6s %3lld %10lld %8s %8s %9s %11.1f   final %.2f%% (not reached)\n",
                    shape.c_str(), static_cast<long long>(micro),
                    static_cast<long long>(o.batch_size / n / micro), "-", "-", "-",
                    r.samples_per_s, 100 * r.final_accuracy);
      }
      std::fflush(stdout);
    }
  }
}

int bench_main(int argc, char** argv) {
  Options o;
  CLI::App app("GroPipe benchmark: grouped pipelines through the Trainer");
  app.option_defaults()->always_capture_default();
  app.add_option("--mode", o.mode, "overlap, sweep or accuracy")
      ->check(CLI::IsMember({"overlap", "sweep", "accuracy"}));
  app.add_option("--model", o.model, "mlp-wide, or an image model: " + models::model_names());
  app.add_option("--size", o.size, "Size of a registry model");
  app.add_option("--width", o.width, "mlp-wide: hidden units");
  app.add_option("--depth", o.depth, "mlp-wide: linear layers");
  app.add_option("--groups", o.groups, "overlap mode: groups N");
  app.add_option("--stages", o.stages, "overlap mode: stages k");
  app.add_option("--ranks", o.ranks, "sweep mode: N x k (local threads; MPI: the world size)");
  app.add_option("--micro-batches", o.micro_batches, "Micro-batches M (overlap, accuracy)");
  app.add_option("--micro-list", o.micro_list, "sweep mode: the values of M");
  app.add_option("--batch-size", o.batch_size, "Global batch");
  app.add_option("--steps", o.steps, "Steps per run (throughput)");
  app.add_option("--warmup", o.warmup, "Steps not timed");
  app.add_option("--repeats", o.repeats, "Runs per configuration (medians reported)");
  app.add_option("--dp-bucket-mb", o.bucket_mb, "Gradient bucket MiB (0 = one per stage)");
  app.add_option("--dp-delay", o.delay, "Gradient delay D");
  app.add_option("--target", o.target, "accuracy mode: test accuracy to reach");
  app.add_option("--max-epochs", o.max_epochs, "accuracy mode: epochs at most");
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
  CLI11_PARSE(app, argc, argv);
  STRATA_CHECK(o.steps > o.warmup && o.warmup >= 0) << "--steps must exceed --warmup";
  STRATA_CHECK(o.repeats >= 1) << "--repeats must be at least 1";
  STRATA_CHECK(o.compute_ms >= 0 && (o.compute_ms == 0 || o.model == "mlp-wide"))
      << "--compute-ms applies to --model mlp-wide only (and must be >= 0)";
  STRATA_CHECK(o.compute_ms_per_sample >= 0 && (o.compute_ms_per_sample == 0 || o.compute_ms > 0))
      << "--compute-ms-per-sample needs --compute-ms (and must be >= 0)";

  std::unique_ptr<parallel::Communicator> mpi;
#ifdef STRATA_WITH_MPI
  std::unique_ptr<parallel::MpiSession> session;
  if (parallel::discover_process().world_size > 1) {
    session = std::make_unique<parallel::MpiSession>(&argc, &argv);
    mpi = session->world();
    o.ranks = mpi->size();
    if (o.mode == "overlap") {
      STRATA_CHECK_EQ(o.groups * o.stages, mpi->size()) << "--groups x --stages must be the world";
    }
  }
#endif
  const bool root = mpi == nullptr || mpi->rank() == 0;
  const Workload w = workload(o, o.mode == "accuracy");
  const size_t layers = static_cast<size_t>(w.spec.layer_size());
  if (root) {
    std::printf("gropipe_bench: %s on %s, %zu layers, %s\n", w.spec.name().c_str(),
                w.train->name().c_str(), layers, mpi ? "MPI ranks" : "local threads");
    std::fflush(stdout);
  }
  if (o.mode == "overlap") mode_overlap(o, w, layers, mpi.get(), root);
  if (o.mode == "sweep") mode_sweep(o, w, layers, mpi.get(), root);
  if (o.mode == "accuracy") mode_accuracy(o, w, layers, mpi.get(), root);
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
