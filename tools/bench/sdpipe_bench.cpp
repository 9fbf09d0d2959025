// SDPipe against its baselines under stragglers (papers/sdpipe.md Sec. 4, E1 and E2): training
// throughput of G pipelines x S stages with --sync allreduce | sdpipe | adpsgd | ps-ssp, with no
// injected delay (homo) and under the paper's settings A and B (each rank sleeps d with
// probability 0.1 before each forward and each backward, or with --inject-op iteration once per
// step as the paper's text says; d_B = 3 d_A), and the time to a fixed training loss under
// setting B.
//
//   mpirun -np 8 sdpipe_bench --mode throughput --groups 4 --stages 2 --compute-ms 4
//   mpirun -np 8 sdpipe_bench --mode converge --groups 4 --stages 2 --compute-ms 2 --target 0.7
//   sdpipe_bench --local ...                          # the ranks as threads of one process
//   sdpipe_bench --mode check-trace --trace t.jsonl --sync-window 0.02 --sync-history 10
//
// check-trace validates a run's --sync-trace offline (papers/sdpipe.md Sec. 5 items 4, 6, 15):
// every READY answered by exactly one group holding its replica, every checked group connected
// with the P - 1 before it, and a replay of the READYs through a fresh scheduler of the given
// --sync-window, --sync-history and --sync-token deciding what the run decided. Stages and
// replicas are read from the trace. Exit status 1 when anything fails.
//
// Delays are scaled to the step: d_A = --ratio-a x the homogeneous step time of allreduce
// (measured first, in the same run), so the figures say the ratio they used. Configurations run
// interleaved (every sync, every setting, then again) and the median of --repeats is reported,
// so that load from other processes hits each alike.
//
// Cost model. On a 2-core machine the ranks share cores, and a straggler's sleep hands its core
// to the others, which hides what a straggler costs on a device of its own. --compute-ms X gives
// every linear layer a fixed duration (forward X ms plus --compute-ms-per-sample per row,
// backward twice that; tools/bench/timed_linear.h: the real product, then a sleep for the rest),
// so compute leaves the CPU free as on an accelerator: the figures with --compute-ms > 0 are the
// device cost model's; --compute-ms 0 is the real CPU compute.
//
// Throughput is samples / training seconds of rank 0 (its run ends after the last step's metrics,
// which every rank reaches: the makespan). Time to target: the first log point (--log-every
// steps) whose training loss, averaged over the groups and the steps since the previous log
// point, is at or below --target; the model is an MLP on Fashion-MNIST (784-wide input).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/check.h"
#include "engine/exec_context.h"
#include "graph/layers.h"
#include "graph/model_spec.h"
#include "io/datasets.h"
#include "parallel/comm/local_comm.h"
#include "parallel/partition/partition.h"
#include "parallel/runtime/injector.h"
#include "parallel/sdpipe/sync_config.h"
#include "parallel/sdpipe/sync_graph.h"
#include "parallel/topology.h"
#include "parallel/trainer.h"
#include "tools/bench/bench_random.h"
#include "tools/bench/timed_linear.h"
#ifdef STRATA_WITH_MPI
#include "parallel/comm/mpi_comm.h"
#endif

namespace strata {
namespace {

struct Options {
  std::string mode = "throughput";
  int groups = 4, stages = 2;
  int64_t micro_batches = 2;
  int64_t batch_size = 64;  // global
  int64_t steps = 30;
  int repeats = 3;
  int width = 256, depth = 4;
  double compute_ms = 4.0, compute_ms_per_sample = 0.0;
  double ratio_a = 0.5;            // d_A / homogeneous step time
  double p = 0.1;                  // probability per --inject-op draw
  std::string inject_op = "both";  // both: per forward and per backward; iteration: per step
  std::string syncs = "allreduce,sdpipe,adpsgd,ps-ssp";
  std::string window = "auto";
  int history = 10;
  int staleness = 3;
  double lr = 0.05;
  std::string trace;         // check-trace: the --sync-trace file
  std::string token = "on";  // check-trace: the run's --sync-token
  double target = 0.7;       // converge: training loss
  int64_t log_every = 5;     // converge: steps between loss points
  int64_t max_steps = 600;
  int threads = 0;
  bool local = false;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string item =
        s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

struct Workload {
  parallel::ModelBuilder build;
  size_t layers = 0;
  std::shared_ptr<const io::Dataset> train;
};

// An MLP of `depth` linear layers (timed when --compute-ms > 0), flattened input of `in`.
Workload workload(const Options& o, bool fashion) {
  Workload w;
  int64_t in = o.width;
  if (fashion) {
    io::DatasetOptions d;
    d.augment = false;
    w.train = io::open_dataset("fashion-mnist", "", "train", d);
    in = 28 * 28;
  } else {
    w.train = std::make_shared<tools::RandomFeatures>(1 << 16, o.width);
  }
  const Shape input = w.train->input_spec().shape;
  const auto forward = std::chrono::microseconds(static_cast<int64_t>(o.compute_ms * 1000));
  const auto per_row =
      std::chrono::microseconds(static_cast<int64_t>(o.compute_ms_per_sample * 1000));
  const Options opts = o;
  w.build = [opts, fashion, in, input, forward, per_row] {
    auto model = std::make_unique<graph::Model>("mlp_timed", input);
    if (fashion) model->add(std::make_unique<graph::FlattenLayer>("flatten"));
    for (int l = 0; l < opts.depth; ++l) {
      const int64_t from = l == 0 ? in : opts.width;
      const int64_t out = l + 1 == opts.depth ? 10 : opts.width;
      const std::string name = "fc" + std::to_string(l);
      if (opts.compute_ms > 0) {
        model->add(std::make_unique<bench::TimedLinear>(name, from, out, forward, per_row));
      } else {
        model->add(std::make_unique<graph::LinearLayer>(name, from, out, true));
      }
      if (l + 1 < opts.depth) {
        model->add(std::make_unique<graph::ReluLayer>("relu" + std::to_string(l)));
      }
    }
    return model;
  };
  w.layers = static_cast<size_t>(2 * o.depth - 1 + (fashion ? 1 : 0));
  return w;
}

// Rank 0's clock and loss points.
class Recorder final : public parallel::TrainObserver {
 public:
  void on_log(const parallel::StepRecord& r) override {
    points.push_back({r.step, r.elapsed_s, r.loss});
  }
  struct Point {
    int64_t step;
    double elapsed, loss;
  };
  std::vector<Point> points;
};

struct Result {
  double samples_per_s = 0, train_seconds = 0;
  double seconds_to_target = -1;
  int64_t step_to_target = -1;
  double mean_group = 0;
  double waits = 0;  // enforcement waits (sdpipe) or staleness waits (ps-ssp)
  double final_loss = 0;
};

parallel::PipelineConfig pipeline_of(const Options& o, const Workload& w,
                                     const parallel::sdpipe::SyncConfig& sync, double delay) {
  parallel::PipelineConfig p;
  p.groups = o.groups;
  p.stages = o.stages;
  p.micro_batches = o.micro_batches;
  p.schedule = parallel::ScheduleKind::k1F1B;
  for (const parallel::LayerRange& r : parallel::uniform_partition(w.layers, o.stages)) {
    p.partition.push_back({r.begin, r.end});
  }
  p.update_sync = parallel::sdpipe::make_update_sync_factory(sync);
  if (delay > 0) {
    p.inject = parallel::parse_inject("kind=straggler,p=" + std::to_string(o.p) +
                                      ",delay=" + std::to_string(delay) + ",op=" + o.inject_op);
  }
  return p;
}

parallel::TrainConfig train_config(const Options& o, int64_t steps, int64_t log_every,
                                   uint64_t seed) {
  parallel::TrainConfig c;
  c.steps = steps;
  c.batch_size = o.batch_size;
  c.seed = seed;
  c.num_workers = 1;
  c.log_every = log_every;
  c.optimizer.kind = graph::OptimizerKind::kSgd;
  c.optimizer.momentum = 0.9;
  c.optimizer.schedule.kind = ops::LrScheduleKind::kConstant;
  c.optimizer.schedule.base_lr = o.lr;
  return c;
}

parallel::sdpipe::SyncConfig sync_config(const Options& o, const std::string& name) {
  parallel::sdpipe::SyncConfig s;
  s.kind = parallel::sdpipe::parse_sync(name);
  parallel::sdpipe::parse_sync_window(o.window, &s);
  s.history = o.history;
  s.staleness = o.staleness;
  return s;
}

// One run on the MPI world or local threads; every rank returns rank 0's result.
Result run(const Options& o, const Workload& w, const parallel::PipelineConfig& p,
           const parallel::TrainConfig& config, parallel::Communicator* mpi_world) {
  Result result;
  std::mutex mutex;
  const int ranks = p.groups * p.stages;
  const int cores =
      o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  auto body = [&](parallel::Communicator* world, int threads) {
    ExecContext ctx(Device::cpu(), nullptr, threads);
    Recorder recorder;
    const bool root = world->rank() == 0;
    parallel::Trainer trainer(ctx, w.build, w.train, nullptr, config, p, world,
                              root ? &recorder : nullptr);
    const parallel::TrainSummary summary = trainer.run();
    if (!root) return;
    std::lock_guard<std::mutex> lock(mutex);
    result.train_seconds = summary.train_seconds;
    result.samples_per_s = static_cast<double>(summary.samples) / summary.train_seconds;
    if (summary.sync) {
      result.mean_group = summary.sync->mean_group();
      result.waits =
          static_cast<double>(summary.sync->enforcement_waits + summary.sync->staleness_waits);
    }
    for (const Recorder::Point& pt : recorder.points) {
      if (result.step_to_target < 0 && pt.loss <= o.target) {
        result.step_to_target = pt.step;
        result.seconds_to_target = pt.elapsed;
      }
    }
    if (!recorder.points.empty()) result.final_loss = recorder.points.back().loss;
  };
  if (mpi_world != nullptr) {
    STRATA_CHECK_EQ(mpi_world->size(), ranks)
        << "sdpipe_bench: --groups " << p.groups << " x --stages " << p.stages << " needs " << ranks
        << " MPI ranks";
    body(mpi_world, std::max(1, cores / ranks));
    Tensor t = Tensor::from_vector<double>(
        {result.samples_per_s, result.train_seconds, result.seconds_to_target,
         static_cast<double>(result.step_to_target), result.mean_group, result.waits,
         result.final_loss},
        {7});
    mpi_world->broadcast(t, 0)->wait(mpi_world->timeout(), "bench result");
    const std::vector<double> v = t.to_vector<double>();
    return Result{v[0], v[1], v[2], static_cast<int64_t>(v[3]), v[4], v[5], v[6]};
  }
  parallel::LocalWorld world(ranks);
  parallel::run_local_ranks(world, [&](parallel::LocalCommunicator& comm) {
    comm.set_timeout(std::chrono::minutes(5));
    body(&comm, std::max(1, cores / ranks));
  });
  return result;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

void mode_throughput(const Options& o, parallel::Communicator* mpi, bool root) {
  const Workload w = workload(o, false);
  const std::vector<std::string> syncs = split_list(o.syncs);
  // The homogeneous step time of allreduce, to scale the delays.
  const Result calib = run(o, w, pipeline_of(o, w, sync_config(o, "allreduce"), 0.0),
                           train_config(o, o.steps, o.steps, 1), mpi);
  const double step = calib.train_seconds / static_cast<double>(o.steps);
  const double d_a = o.ratio_a * step, d_b = 3 * d_a;
  const std::vector<std::pair<std::string, double>> settings = {
      {"homo", 0.0}, {"A", d_a}, {"B", d_b}};
  std::map<std::pair<std::string, std::string>, std::vector<double>> samples, groups;
  for (int r = 0; r < o.repeats; ++r) {
    for (const auto& [setting, delay] : settings) {
      for (const std::string& s : syncs) {
        const Result res = run(o, w, pipeline_of(o, w, sync_config(o, s), delay),
                               train_config(o, o.steps, o.steps, 1 + r), mpi);
        samples[{s, setting}].push_back(res.samples_per_s);
        groups[{s, setting}].push_back(res.mean_group);
      }
    }
  }
  if (!root) return;
  std::printf(
      "throughput, samples/s (median of %d), G=%d pipelines x S=%d stages, M=%lld, batch %lld, "
      "%lld steps; %s\n",
      o.repeats, o.groups, o.stages, static_cast<long long>(o.micro_batches),
      static_cast<long long>(o.batch_size), static_cast<long long>(o.steps),
      o.compute_ms > 0 ? "device cost model (timed layers)" : "real CPU compute");
  std::printf(
      "homogeneous allreduce step %.1f ms; stragglers p=%.2f %s, d_A=%.1f ms (%.2f x step), "
      "d_B=%.1f ms (%.2f x step)\n",
      1000 * step, o.p, o.inject_op == "iteration" ? "per step" : "per forward and per backward",
      1000 * d_a, d_a / step, 1000 * d_b, d_b / step);
  std::printf("| sync | homo | A | B | B slowdown vs homo | mean group (B) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const std::string& s : syncs) {
    const double h = median(samples[{s, "homo"}]), a = median(samples[{s, "A"}]),
                 b = median(samples[{s, "B"}]);
    std::printf("| %s | %.0f | %.0f | %.0f | %.2fx | %.2f |\n", s.c_str(), h, a, b, h / b,
                median(groups[{s, "B"}]));
  }
  if (std::find(syncs.begin(), syncs.end(), "sdpipe") != syncs.end()) {
    std::printf("sdpipe speedup:");
    for (const auto& [setting, delay] : settings) {
      for (const std::string& s : syncs) {
        if (s == "sdpipe") continue;
        std::printf(" %s over %s %.2fx;", setting.c_str(), s.c_str(),
                    median(samples[{"sdpipe", setting}]) / median(samples[{s, setting}]));
      }
    }
    std::printf("\n");
  }
}

void mode_converge(const Options& o, parallel::Communicator* mpi, bool root) {
  const Workload w = workload(o, true);
  const std::vector<std::string> syncs = split_list(o.syncs);
  const Result calib = run(o, w, pipeline_of(o, w, sync_config(o, "allreduce"), 0.0),
                           train_config(o, 10, 10, 1), mpi);
  const double step = calib.train_seconds / 10.0;
  const double d_b = 3 * o.ratio_a * step;
  std::map<std::string, std::vector<double>> seconds, steps, final_loss, throughput;
  for (int r = 0; r < o.repeats; ++r) {
    for (const std::string& s : syncs) {
      const Result res = run(o, w, pipeline_of(o, w, sync_config(o, s), d_b),
                             train_config(o, o.max_steps, o.log_every, 1 + r), mpi);
      seconds[s].push_back(res.seconds_to_target < 0 ? 1e30 : res.seconds_to_target);
      steps[s].push_back(res.step_to_target < 0 ? 1e30 : static_cast<double>(res.step_to_target));
      final_loss[s].push_back(res.final_loss);
      throughput[s].push_back(res.samples_per_s);
    }
  }
  if (!root) return;
  std::printf(
      "time to training loss <= %.3f under setting B (p=%.2f %s, d_B=%.1f ms = %.2f x the "
      "homogeneous allreduce step of %.1f ms), Fashion-MNIST MLP, G=%d x S=%d, M=%lld, batch "
      "%lld, SGD momentum 0.9 lr %g, loss checked every %lld steps, at most %lld steps; median "
      "of %d; %s\n",
      o.target, o.p, o.inject_op.c_str(), 1000 * d_b, d_b / step, 1000 * step, o.groups, o.stages,
      static_cast<long long>(o.micro_batches), static_cast<long long>(o.batch_size), o.lr,
      static_cast<long long>(o.log_every), static_cast<long long>(o.max_steps), o.repeats,
      o.compute_ms > 0 ? "device cost model (timed layers)" : "real CPU compute");
  std::printf("| sync | seconds to target | steps to target | samples/s | final loss |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const std::string& s : syncs) {
    const double t = median(seconds[s]), k = median(steps[s]);
    char ts[32], ks[32];
    std::snprintf(ts, sizeof(ts), t >= 1e29 ? "not reached" : "%.2f", t);
    std::snprintf(ks, sizeof(ks), k >= 1e29 ? "-" : "%.0f", k);
    std::printf("| %s | %s | %s | %.0f | %.4f |\n", s.c_str(), ts, ks, median(throughput[s]),
                median(final_loss[s]));
  }
}

// Exit status: 0 when the trace passes the check and replays to the same decisions.
int mode_check_trace(const Options& o) {
  using namespace parallel::sdpipe;
  STRATA_CHECK(!o.trace.empty()) << "sdpipe_bench --mode check-trace needs --trace FILE";
  const std::vector<TraceEvent> events = read_sync_trace(o.trace);
  int stages = 0, replicas = 0;
  for (const TraceEvent& e : events) {
    stages = std::max(stages, e.stage + 1);
    if (e.event == "ready") replicas = std::max(replicas, e.replica + 1);
  }
  STRATA_CHECK(replicas > 0) << "--trace " << o.trace << ": no READY in it";
  const TraceCheck check = check_sync_trace(events, replicas, o.history);
  SyncConfig sync;
  parse_sync_window(o.window, &sync);
  SchedulerConfig sc;
  sc.stages = stages;
  sc.replicas = replicas;
  sc.window_kind = sync.window_kind;
  sc.window = sync.window;
  sc.history = o.history;
  sc.token = o.token == "on";
  const std::vector<std::string> replay = replay_sync_trace(events, sc);
  std::printf(
      "%s: %d stages x %d replicas; %lld READYs, %lld groups (mean %.2f replicas), %lld held "
      "back, %lld validated, %lld accepted unchecked\n",
      o.trace.c_str(), stages, replicas, static_cast<long long>(check.readies),
      static_cast<long long>(check.groups), check.mean_group, static_cast<long long>(check.holds),
      static_cast<long long>(check.validated), static_cast<long long>(check.skipped));
  for (const std::string& v : check.violations) std::printf("violation: %s\n", v.c_str());
  for (const std::string& m : replay) std::printf("replay: %s\n", m.c_str());
  std::printf("check (history P %d): %s; replay (window %s, token %s): %s\n", o.history,
              check.violations.empty() ? "passed" : "FAILED", o.window.c_str(), o.token.c_str(),
              replay.empty() ? "same decisions" : "FAILED");
  return check.violations.empty() && replay.empty() ? 0 : 1;
}

int main_impl(int argc, char** argv) {
  Options o;
  CLI::App app("SDPipe vs All-Reduce, AD-PSGD and PS+SSP under stragglers");
  app.option_defaults()->always_capture_default();
  app.add_option("--mode", o.mode, "throughput, converge or check-trace")
      ->check(CLI::IsMember({"throughput", "converge", "check-trace"}));
  app.add_option("--trace", o.trace, "check-trace: a run's --sync-trace file");
  app.add_option("--sync-token", o.token, "check-trace: the run's --sync-token")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--groups", o.groups, "Pipelines G");
  app.add_option("--stages", o.stages, "Stages S");
  app.add_option("--micro-batches", o.micro_batches, "Micro-batches M per step");
  app.add_option("--batch-size", o.batch_size, "Global batch");
  app.add_option("--steps", o.steps, "Steps per throughput run");
  app.add_option("--repeats", o.repeats, "Repeats (interleaved; the median is reported)");
  app.add_option("--width", o.width, "Hidden units of the MLP");
  app.add_option("--depth", o.depth, "Linear layers of the MLP");
  app.add_option("--compute-ms", o.compute_ms,
                 "Device cost model: each linear layer's forward lasts this (backward twice); 0: "
                 "real CPU compute");
  app.add_option("--compute-ms-per-sample", o.compute_ms_per_sample, "... plus this per row");
  app.add_option("--ratio-a", o.ratio_a, "Setting A's delay over the homogeneous step time");
  app.add_option("--p", o.p, "Straggler probability per draw (see --inject-op)");
  app.add_option("--inject-op", o.inject_op,
                 "When stragglers draw: both (before each forward and each backward, the "
                 "authors' artifact) or iteration (once per step, the paper's text)")
      ->check(CLI::IsMember({"both", "iteration"}));
  app.add_option("--syncs", o.syncs, "The --sync strategies to compare");
  app.add_option("--sync-window", o.window, "sdpipe's window: seconds, auto or inf");
  app.add_option("--sync-history", o.history, "sdpipe's P");
  app.add_option("--ssp-staleness", o.staleness, "ps-ssp's s");
  app.add_option("--lr", o.lr, "Learning rate (SGD, momentum 0.9)");
  app.add_option("--target", o.target, "converge: the training loss to reach");
  app.add_option("--log-every", o.log_every, "converge: steps between loss points");
  app.add_option("--max-steps", o.max_steps, "converge: steps per run at most");
  app.add_option("--threads", o.threads, "CPU threads per process (0 = all cores)");
  app.add_flag("--local", o.local, "Ranks as threads of this process instead of MPI ranks");
  CLI11_PARSE(app, argc, argv);
  if (o.mode == "check-trace") return mode_check_trace(o);
  const parallel::ProcessInfo process = parallel::discover_process();
  std::unique_ptr<parallel::Communicator> mpi;
#ifdef STRATA_WITH_MPI
  std::unique_ptr<parallel::MpiSession> session;
  if (process.world_size > 1) {
    session = std::make_unique<parallel::MpiSession>(&argc, &argv);
    auto world = session->world();
    world->set_timeout(std::chrono::minutes(5));
    mpi = std::move(world);
  }
#endif
  STRATA_CHECK(o.local || mpi != nullptr)
      << "sdpipe_bench: run under mpirun -np " << o.groups * o.stages << " or with --local";
  const bool root = mpi == nullptr || mpi->rank() == 0;
  if (o.mode == "throughput") {
    mode_throughput(o, mpi.get(), root);
  } else {
    mode_converge(o, mpi.get(), root);
  }
  std::fflush(stdout);
  if (mpi != nullptr) mpi->barrier("the end of the benchmark");
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  try {
    return strata::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sdpipe_bench: %s\n", e.what());
#ifdef STRATA_WITH_MPI
    strata::parallel::abort_world(1);
#endif
    return 1;
  }
}
