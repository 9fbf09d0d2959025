// Validation of the simulator (parallel/sim) against measured runs on this machine: real layouts
// through the Trainer (local threads, or MPI ranks under mpirun) beside the simulator's prediction
// from a profile measured here, step time predicted vs measured over a grid of S, G, M and
// schedules.
//
//   sim_validate [--repeats 3] [--steps 8 --warmup 3]             # local threads, every layout
//   mpirun -np 4 sim_validate                                      # MPI: the layouts of 4 ranks
//
// The model is an MLP of TimedLinear layers (tools/bench/timed_linear.h): each forward lasts
// --compute-ms plus --compute-ms-per-sample per sample of its micro-batch (backward twice),
// sleeping for what its matrix product leaves, so compute leaves the two shared cores free as on
// an accelerator and the CPU's own contention does not decide the schedule; the sends, the
// gradient all-reduces and the optimizer are real CPU work.
//
// What the simulator is given, all measured here before any layout runs (nothing is fitted to
// the layouts it predicts):
//   layer times   graph::LayerProfiler on the model at 2, 8 and 32 samples per call (the median of
//                 three profiles each), fitted per layer to fixed + per-sample (cost_model.h, as
//                 strata simulate --profile FILE@BATCH does);
//   optimizer     seconds per parameter byte of graph::Optimizer steps on the whole model;
//   links         the ring all-reduce's closed form fitted to all-reduces timed on 2 local ranks
//                 or on the MPI ranks (a small and a 4 MiB buffer): latency and bandwidth of the
//                 link, also used for the point-to-point messages;
//   step overhead the trainer's per-step time outside the instructions: a 1-rank run of the same
//                 model with zero compute, less its profiled work.
// Measured step time: the trainer's clock over the steps after --warmup (rank 0), median of
// --repeats runs interleaved over the layouts.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/check.h"
#include "engine/exec_context.h"
#include "graph/optimizer.h"
#include "graph/param_store.h"
#include "graph/profiler.h"
#include "graph/train_step.h"
#include "io/dataset.h"
#include "parallel/comm/local_comm.h"
#include "parallel/partition/partition.h"
#include "parallel/sim/collectives.h"
#include "parallel/sim/simulator.h"
#include "parallel/topology.h"
#include "parallel/trainer.h"
#include "tools/bench/timed_linear.h"
#ifdef STRATA_WITH_MPI
#include "parallel/comm/mpi_comm.h"
#endif

namespace strata {
namespace {

namespace sim = parallel::sim;
using Clock = std::chrono::steady_clock;

struct Options {
  int width = 256;
  int depth = 8;
  double compute_ms = 1.0;
  double compute_ms_per_sample = 0.25;
  int64_t batch_size = 32;
  int64_t steps = 8, warmup = 3;
  int repeats = 3;
  int threads = 1;  // per rank: two threads of ops on two shared cores contend (see the README)
  std::string layouts = "all";
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
    for (int64_t f = 0; f < features_; ++f) x[f] = static_cast<float>((i * 131 + f * 7) % 17) / 17;
    *static_cast<int64_t*>(target) = i % 10;
  }

 private:
  int64_t n_, features_;
};

struct Layout {
  int groups, stages;
  int64_t micro_batches;
  parallel::ScheduleKind kind;
};

std::string name(const Layout& l) {
  return std::to_string(l.groups) + "x" + std::to_string(l.stages) +
         " M=" + std::to_string(l.micro_batches) + " " + parallel::schedule_name(l.kind);
}

std::vector<Layout> grid() {
  using K = parallel::ScheduleKind;
  return {{1, 1, 1, K::k1F1B},     {1, 2, 2, K::kGPipe}, {1, 2, 4, K::kGPipe},
          {1, 2, 8, K::kGPipe},    {1, 2, 4, K::k1F1B},  {1, 4, 4, K::kGPipe},
          {1, 4, 8, K::k1F1B},     {1, 4, 8, K::kGPipe}, {2, 1, 1, K::k1F1B},
          {2, 1, 4, K::k1F1B},     {4, 1, 2, K::k1F1B},  {2, 2, 2, K::k1F1B},
          {2, 2, 4, K::k1F1B},     {2, 2, 4, K::kGPipe}, {1, 2, 4, K::kAsync1F1B},
          {1, 4, 8, K::kAsync1F1B}};
}

parallel::ModelBuilder builder(const Options& o, double compute_ms, double per_sample_ms) {
  const auto forward = std::chrono::microseconds(static_cast<int64_t>(compute_ms * 1000));
  const auto per_row = std::chrono::microseconds(static_cast<int64_t>(per_sample_ms * 1000));
  return [o, forward, per_row] {
    auto model = std::make_unique<graph::Model>("timed_mlp", Shape{o.width});
    for (int l = 0; l < o.depth; ++l) {
      const int out = l + 1 == o.depth ? 10 : o.width;
      model->add(std::make_unique<bench::TimedLinear>("fc" + std::to_string(l), o.width, out,
                                                      forward, per_row));
    }
    return model;
  };
}

double median(std::vector<double> v);

// Per-layer profile of the model at `rows` samples per call: the median over `runs` profiles of
// 5 calls each (after a warm-up call), so that a moment of load on the shared cores (a sleep
// that wakes late) does not set the cost model.
sim::MeasuredProfile profile_at(const parallel::ModelBuilder& build, int64_t rows, int runs = 3) {
  std::unique_ptr<graph::Model> model = build();
  ExecContext ctx(Device::cpu(), nullptr, 1);
  graph::ParamStore store(*model, 0, model->size(), ctx.allocator());
  store.initialize(1);
  const Tensor x = Tensor::full({rows, model->input_shape()[0]}, 0.1);
  Tensor target = Tensor::zeros({rows}, DType::kI64);
  std::vector<std::vector<double>> forward(model->size()), backward(model->size());
  for (int run = 0; run < runs; ++run) {
    graph::LayerProfiler profiler(*model);
    for (int step = 0; step < 6; ++step) {
      graph::ForwardOptions fwd;
      fwd.step = step;
      graph::train_forward_backward(ctx, *model, {x}, target, {}, fwd, &profiler);
      store.zero_grads(ctx);
      if (step == 0) profiler.reset();
    }
    for (size_t l = 0; l < model->size(); ++l) {
      forward[l].push_back(profiler.layers()[l].forward_ms_per_sample());
      backward[l].push_back(profiler.layers()[l].backward_ms_per_sample());
    }
  }
  sim::MeasuredProfile p;
  p.source = "measured";
  p.batch = rows;
  for (size_t l = 0; l < model->size(); ++l) {
    p.names.push_back(model->layer(l).name());
    p.forward_ms.push_back(median(forward[l]));
    p.backward_ms.push_back(median(backward[l]));
  }
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

// Seconds per parameter byte of SGD-with-momentum steps on the whole model.
double optimizer_seconds_per_byte(const parallel::ModelBuilder& build) {
  std::unique_ptr<graph::Model> model = build();
  ExecContext ctx(Device::cpu(), nullptr, 1);
  graph::ParamStore store(*model, 0, model->size(), ctx.allocator());
  store.initialize(1);
  graph::OptimizerConfig c;
  c.kind = graph::OptimizerKind::kSgd;
  c.momentum = 0.9;
  c.schedule.base_lr = 0.01;
  store.ensure_state(graph::optimizer_slot_names(c).size());
  graph::Optimizer opt(store, c);
  std::vector<double> t;
  for (int i = 0; i < 9; ++i) {
    const auto start = Clock::now();
    opt.step(ctx, i);
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return median(t) / static_cast<double>(store.params().nbytes());
}

// Median seconds of an all-reduce of `numel` floats on `comm`.
double time_all_reduce(parallel::Communicator& comm, int64_t numel) {
  Tensor t = Tensor::full({numel}, 1.0);
  std::vector<double> times;
  for (int i = 0; i < 12; ++i) {
    Tensor b = Tensor::zeros({1});
    comm.all_reduce(b)->wait(comm.timeout(), "barrier");
    const auto start = Clock::now();
    comm.all_reduce(t)->wait(comm.timeout(), "calibration");
    if (i >= 2) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  Tensor m = Tensor::from_vector<double>({median(times)}, {1});
  comm.all_reduce(m, parallel::ReduceOp::kMax)->wait(comm.timeout(), "calibration result");
  return m.to_vector<double>()[0];
}

// Latency and bandwidth of the ring formula from all-reduces of two sizes on 2 local ranks, or on
// every MPI rank.
sim::LinkSpec calibrate_link(parallel::Communicator* mpi, int64_t large) {
  const int64_t small = 256;
  double t_small = 0, t_large = 0;
  auto measure = [&](parallel::Communicator& comm) {
    const double a = time_all_reduce(comm, small), b = time_all_reduce(comm, large);
    if (comm.rank() == 0) t_small = a, t_large = b;
  };
  if (mpi != nullptr) {
    STRATA_CHECK(mpi->size() >= 2) << "sim_validate under MPI needs 2 or more ranks";
    measure(*mpi);
    Tensor r = Tensor::from_vector<double>({t_small, t_large}, {2});
    mpi->broadcast(r, 0)->wait(mpi->timeout(), "calibration");
    t_small = r.to_vector<double>()[0];
    t_large = r.to_vector<double>()[1];
  } else {
    parallel::LocalWorld world(2);
    std::mutex mutex;
    parallel::run_local_ranks(world, [&](parallel::LocalCommunicator& comm) { measure(comm); });
  }
  // The ring's closed form on n ranks: T = 2 (n - 1) / n x bytes / B + 2 (n - 1) L.
  const double n = mpi != nullptr ? mpi->size() : 2;
  sim::LinkSpec l;
  l.kind = sim::LinkClass::kSameDevice;
  const double bytes_small = 4.0 * small, bytes_large = 4.0 * large;
  l.bandwidth = 2 * (n - 1) / n * (bytes_large - bytes_small) / std::max(1e-9, t_large - t_small);
  l.latency_s =
      std::max(0.0, (t_small - 2 * (n - 1) / n * bytes_small / l.bandwidth) / (2 * (n - 1)));
  return l;
}

class StepClock final : public parallel::TrainObserver {
 public:
  void on_step(const parallel::StepRecord& r) override { elapsed.push_back(r.elapsed_s); }
  std::vector<double> elapsed;
};

parallel::TrainConfig train_config(const Options& o) {
  parallel::TrainConfig c;
  c.steps = o.steps;
  c.batch_size = o.batch_size;
  c.seed = 1;
  c.num_workers = 1;
  c.log_every = 1 << 30;
  c.optimizer.kind = graph::OptimizerKind::kSgd;
  c.optimizer.momentum = 0.9;
  c.optimizer.schedule.base_lr = 0.01;
  return c;
}

// One run of a layout; every rank returns rank 0's step time (seconds per step after warmup).
double measure(const Options& o, const parallel::ModelBuilder& build, const Layout& l,
               parallel::Communicator* mpi) {
  parallel::PipelineConfig p;
  p.groups = l.groups;
  p.stages = l.stages;
  p.micro_batches = l.micro_batches;
  p.schedule = l.kind;
  for (const parallel::LayerRange& r : parallel::uniform_partition(o.depth, l.stages)) {
    p.partition.push_back({r.begin, r.end});
  }
  auto data = std::make_shared<RandomFeatures>(4096, o.width);
  const parallel::TrainConfig config = train_config(o);
  const int ranks = l.groups * l.stages;
  double result = 0;
  std::mutex mutex;
  auto body = [&](parallel::Communicator* world, int threads) {
    ExecContext ctx(Device::cpu(), nullptr, threads);
    StepClock clock;
    const bool root = world == nullptr || world->rank() == 0;
    parallel::Trainer trainer(ctx, build, data, nullptr, config, p, world, root ? &clock : nullptr);
    trainer.run();
    if (!root) return;
    const size_t n = clock.elapsed.size();
    const size_t warm = static_cast<size_t>(std::min<int64_t>(o.warmup, n - 1));
    std::lock_guard<std::mutex> lock(mutex);
    result = (clock.elapsed.back() - (warm > 0 ? clock.elapsed[warm - 1] : 0.0)) /
             static_cast<double>(n - warm);
  };
  if (mpi != nullptr) {
    body(mpi, o.threads);
    Tensor t = Tensor::from_vector<double>({result}, {1});
    mpi->broadcast(t, 0)->wait(mpi->timeout(), "result");
    return t.to_vector<double>()[0];
  }
  if (ranks == 1) {
    body(nullptr, o.threads);
    return result;
  }
  parallel::LocalWorld world(ranks);
  parallel::run_local_ranks(world,
                            [&](parallel::LocalCommunicator& comm) { body(&comm, o.threads); });
  return result;
}

sim::SimResult predict(const Options& o, const sim::CostModel& costs, const sim::Cluster& cluster,
                       const Layout& l) {
  sim::SimConfig c;
  c.groups = l.groups;
  c.stages = l.stages;
  c.micro_batches = l.micro_batches;
  c.micro_batch_rows = static_cast<double>(o.batch_size) / l.groups / l.micro_batches;
  c.schedule = l.kind;
  c.partition = parallel::uniform_partition(o.depth, l.stages);
  c.optimizer_slots = 1;
  c.receive_lookahead = 4;
  c.input_on_device = false;
  if (!parallel::is_synchronous(l.kind)) c.steps = 1;
  return sim::simulate(c, costs, cluster);
}

// The cost model's measured numbers, flattened: per layer forward fixed, forward per sample,
// backward fixed, backward per sample (seconds); then the optimizer's seconds per parameter byte
// and the step overhead.
sim::CostModel cost_model(const std::vector<sim::LayerWork>& work, const std::vector<double>& v) {
  sim::CostModel costs;
  costs.source = "profiled here";
  for (size_t l = 0; l < work.size(); ++l) {
    sim::LayerModel m;
    m.work = work[l];
    m.forward_s = {v[4 * l], v[4 * l + 1]};
    m.backward_s = {v[4 * l + 2], v[4 * l + 3]};
    costs.layers.push_back(m);
  }
  costs.optimizer_s_per_param_byte = v[4 * work.size()];
  costs.step_overhead_s = v[4 * work.size() + 1];
  return costs;
}

// One calibration, on rank 0 alone (the other MPI ranks wait for its numbers).
std::vector<double> calibrate(const Options& o, const parallel::ModelBuilder& build,
                              const std::vector<sim::LayerWork>& work,
                              parallel::Communicator* mpi) {
  std::vector<double> v(4 * work.size() + 2, 0.0);
  if (mpi == nullptr || mpi->rank() == 0) {
    // Three micro-batch sizes spanning the layouts' (1 to 32 samples).
    const sim::CostModel costs = sim::profile_cost_model(
        work, {profile_at(build, 2), profile_at(build, 8), profile_at(build, 32)});
    for (size_t l = 0; l < work.size(); ++l) {
      v[4 * l] = costs.layers[l].forward_s.fixed;
      v[4 * l + 1] = costs.layers[l].forward_s.per_sample;
      v[4 * l + 2] = costs.layers[l].backward_s.fixed;
      v[4 * l + 3] = costs.layers[l].backward_s.per_sample;
    }
    v[4 * work.size()] = optimizer_seconds_per_byte(build);
    // The trainer's overhead per step: one rank, zero compute, less what the cost model sees.
    const parallel::ModelBuilder idle = builder(o, 0.0, 0.0);
    const Layout single{1, 1, 1, parallel::ScheduleKind::k1F1B};
    const double idle_step = measure(o, idle, single, nullptr);
    sim::CostModel idle_costs =
        sim::profile_cost_model(work, {profile_at(idle, 2), profile_at(idle, 32)});
    idle_costs.optimizer_s_per_param_byte = v[4 * work.size()];
    sim::DeviceSpec cpu;
    cpu.name = "cpu";
    const double modelled =
        predict(o, idle_costs, sim::make_cluster(cpu, 1, 1), single).step_time_s;
    v[4 * work.size() + 1] = std::max(0.0, idle_step - modelled);
  }
  if (mpi != nullptr) {
    Tensor t = Tensor::from_vector<double>(v, {static_cast<int64_t>(v.size())});
    mpi->broadcast(t, 0)->wait(std::chrono::milliseconds(600000), "calibration");
    v = t.to_vector<double>();
  }
  return v;
}

int bench_main(int argc, char** argv) {
  Options o;
  CLI::App app("Simulator validation: predicted vs measured step time on this machine");
  app.option_defaults()->always_capture_default();
  app.add_option("--width", o.width, "Hidden units of the timed MLP");
  app.add_option("--depth", o.depth, "Timed linear layers");
  app.add_option("--compute-ms", o.compute_ms, "Forward ms of each layer (backward twice)");
  app.add_option("--compute-ms-per-sample", o.compute_ms_per_sample, "... plus this per sample");
  app.add_option("--batch-size", o.batch_size, "Global batch");
  app.add_option("--steps", o.steps, "Steps per run");
  app.add_option("--warmup", o.warmup, "Steps not timed");
  app.add_option("--repeats", o.repeats, "Runs per layout (median)");
  app.add_option("--threads", o.threads, "CPU threads of ops per rank");
  app.add_option("--layouts", o.layouts, "all, or one layout GxS:M:schedule (debugging)");
  CLI11_PARSE(app, argc, argv);
  STRATA_CHECK(o.steps > o.warmup && o.warmup >= 0) << "--steps must exceed --warmup";

  std::unique_ptr<parallel::Communicator> mpi;
#ifdef STRATA_WITH_MPI
  std::unique_ptr<parallel::MpiSession> session;
  if (parallel::discover_process().world_size > 1) {
    session = std::make_unique<parallel::MpiSession>(&argc, &argv);
    mpi = session->world();
  }
#endif
  const bool root = mpi == nullptr || mpi->rank() == 0;
  const parallel::ModelBuilder build = builder(o, o.compute_ms, o.compute_ms_per_sample);

  std::unique_ptr<graph::Model> model = build();
  const std::vector<sim::LayerWork> work = sim::model_work(*model, nullptr, sim::WorkOptions{});
  // Bucket-sized and larger buffers: the bandwidth term must dominate the larger one.
  const int64_t large = std::max<int64_t>(static_cast<int64_t>(work[0].param_bytes / 4), 1 << 20);
  const sim::LinkSpec link = calibrate_link(mpi.get(), large);
  std::vector<Layout> layouts;
  for (const Layout& l : grid()) {
    const int ranks = l.groups * l.stages;
    if (o.layouts != "all" && o.layouts != name(l)) continue;
    if (mpi != nullptr ? ranks == mpi->size() : true) layouts.push_back(l);
  }
  // Every repeat calibrates (on rank 0, the others waiting), then runs every layout; the cost
  // model takes the median of the calibrations, as the table the median of the runs.
  std::vector<std::vector<double>> calibrations;
  std::vector<std::vector<double>> measured(layouts.size());
  for (int r = 0; r < o.repeats; ++r) {
    calibrations.push_back(calibrate(o, build, work, mpi.get()));
    for (size_t i = 0; i < layouts.size(); ++i) {
      measured[i].push_back(measure(o, build, layouts[i], mpi.get()));
    }
  }
  std::vector<double> values(calibrations.front().size());
  for (size_t k = 0; k < values.size(); ++k) {
    std::vector<double> v;
    for (const auto& c : calibrations) v.push_back(c[k]);
    values[k] = median(v);
  }
  const sim::CostModel costs = cost_model(work, values);
  if (root) {
    std::printf(
        "sim_validate: %d timed linear layers of %d, %.3g ms + %.3g ms/sample forward "
        "(backward 2x), batch %lld, SGD momentum; %s\n",
        o.depth, o.width, o.compute_ms, o.compute_ms_per_sample,
        static_cast<long long>(o.batch_size),
        mpi ? ("MPI ranks: " + std::to_string(mpi->size())).c_str() : "local threads");
    std::printf(
        "calibrated: fc0 forward %.3f ms + %.4f ms/sample, backward %.3f + %.4f; "
        "optimizer %.3g ns/param byte; link %.3g GB/s, %.3g us; step overhead %.3f ms\n",
        1e3 * costs.layers[0].forward_s.fixed, 1e3 * costs.layers[0].forward_s.per_sample,
        1e3 * costs.layers[0].backward_s.fixed, 1e3 * costs.layers[0].backward_s.per_sample,
        1e9 * costs.optimizer_s_per_param_byte, link.bandwidth / 1e9, link.latency_s * 1e6,
        1e3 * costs.step_overhead_s);
    std::fflush(stdout);
  }
  if (!root) return 0;
  std::printf("\n%-22s %12s %12s %8s %9s %9s\n", "layout", "measured ms", "predicted ms", "error",
              "bubble", "spread");
  int within = 0;
  for (size_t i = 0; i < layouts.size(); ++i) {
    const Layout& l = layouts[i];
    sim::DeviceSpec cpu;
    cpu.name = "cpu";
    sim::Cluster cluster = sim::make_cluster(cpu, l.groups * l.stages, l.groups * l.stages);
    cluster.intra = link;
    const sim::SimResult r = predict(o, costs, cluster, l);
    const double m = median(measured[i]);
    const double error = r.step_time_s / m - 1.0;
    const auto [lo, hi] = std::minmax_element(measured[i].begin(), measured[i].end());
    within += std::abs(error) <= 0.10;
    std::printf("%-22s %12.2f %12.2f %+7.1f%% %8.1f%% %8.1f%%\n", name(l).c_str(), 1e3 * m,
                1e3 * r.step_time_s, 100 * error, 100 * r.bubble, 100 * (*hi - *lo) / m);
  }
  std::printf("%d of %zu layouts within 10%%\n", within, layouts.size());
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  try {
    return strata::bench_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sim_validate: %s\n", e.what());
    return 1;
  }
}
