// `strata profile --colocation`: DynPipe's co-location data set (parallel/dynpipe/colocation.h),
// in feature set kFeatureSet (parallel/dynpipe/slowdown_features.h: the rows training predicts
// from are built by the same function).
//
// The model trains (forward, loss, backward; no update) layer by layer in windows of --steps
// steps. A solo window (no load) comes before every loaded window and after the last, so the
// unloaded situation is sampled as often as the loaded ones; each loaded window runs beside a
// load drawn by --seed: 1 to --load-threads threads, busy 25/50/75/100% of the time, compute or
// memory. The CPU's counters are read over every window.
//
// Training's conditions (what the rows must cover):
//  - --inject "kind=device,factor=X": every layer lasts X times its CPU time, the process sleeping
//    the rest, by the injector training uses (parallel/runtime/injector.h), so the layer times,
//    the sleeps and the counters are an emulated device's as in `strata train --inject`. A
//    loaded window's load shares the emulated device of the rank whose process runs it as
//    training's --inject kind=load does (Injector::set_colocated_load: the same factor, 1 +
//    threads x duty, in the same place): without it the device's sleeps absorbed the load and
//    the loaded labels were about 1.
//  - Under mpirun (-np N), every rank profiles at once, as training's ranks share the machine's
//    cores: the windows start together (a barrier), a loaded window's load runs in one rank's
//    process (drawn by --seed; the others profile beside it), and rank 0 writes every rank's rows.
//
// One CSV row per layer, rank and window:
//   layer, rank, window, the feature set's columns (layer_solo_ms: forward + backward ms per
//   sample, the median over the rank's solo windows: the least, as training takes over its few
//   long windows, is over many short windows here a rare quiet moment of a shared machine, and
//   made every row's label large), load_threads, load_duty, load_memory, load_rank (the rank whose
//   process ran the load, -1 none), colocated_ms (the layer's ms per sample in this window, an
//   emulated device's sleep included as in training's layer times) and slowdown = colocated_ms /
//   layer_solo_ms (the monitor's measure of a stage's slowdown, per layer).
// Layers whose solo time is zero (a reshape) are left out.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/check.h"
#include "engine/exec_context.h"
#include "graph/param_store.h"
#include "graph/profiler.h"
#include "io/data_loader.h"
#include "ops/cross_entropy.h"
#include "parallel/dynpipe/colocation.h"
#include "parallel/dynpipe/slowdown_features.h"
#include "parallel/runtime/injector.h"
#include "parallel/topology.h"
#include "tools/common.h"
#include "tools/profile_command.h"

#ifdef STRATA_WITH_MPI
#include "parallel/comm/mpi_comm.h"
#endif

namespace strata::tools {

namespace dp = parallel::dynpipe;

namespace {

using Clock = std::chrono::steady_clock;

struct Window {
  dp::LoadSpec load;
  int load_rank = -1;
  dp::CpuCounters counters;
  std::vector<double> layer_ms;  // forward + backward ms per sample
};

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// One training step's forward, loss and backward, layer by layer: each layer's time, with the
// emulated device's sleep after it (as the executor's layer times include it), added to
// `layer_s`.
void step_layers(ExecContext& ctx, graph::Model& model, const io::Batch& batch,
                 const graph::ForwardOptions& options, graph::LayerProfiler* profiler,
                 parallel::Injector* injector, int64_t step, std::vector<double>* layer_s) {
  Tape tape;
  tape.layers.assign(model.size(), LayerTape{});
  graph::ForwardOptions fwd = options;
  fwd.keep_tape = true;
  TensorList x = {batch.input};
  if (injector != nullptr) injector->before(parallel::OpCode::kForward, step, 0);
  for (size_t i = 0; i < model.size(); ++i) {
    const auto start = Clock::now();
    x = model.forward_layer(ctx, i, x, tape.layers[i], fwd, profiler);
    if (injector != nullptr) injector->after_layer(i, false, step, seconds_since(start));
    (*layer_s)[i] += seconds_since(start);
  }
  STRATA_CHECK_EQ(x.size(), 1u) << "model " << model.name() << " must end in one output";
  const Tensor logits = x[0].reshape({-1, x[0].size(-1)});
  ops::CrossEntropyOptions loss;
  loss.num_classes = model.loss_classes();
  const Tensor dlogits =
      ops::cross_entropy_backward(ctx, logits, batch.target.reshape({-1}), loss, 1.0);
  TensorList grads = {dlogits.view(x[0].shape())};
  if (injector != nullptr) injector->before(parallel::OpCode::kBackward, step, 0);
  for (size_t i = model.size(); i-- > 0;) {
    const auto start = Clock::now();
    grads = model.backward_layer(ctx, i, grads, tape.layers[i], profiler);
    if (injector != nullptr) injector->after_layer(i, true, step, seconds_since(start));
    (*layer_s)[i] += seconds_since(start);
  }
}

// --inject for the profile: one kind=device spec (an emulated device), nothing else.
std::vector<parallel::InjectSpec> device_spec(const std::string& text) {
  if (text.empty()) return {};
  std::vector<parallel::InjectSpec> specs = parallel::parse_inject(text);
  STRATA_CHECK(specs.size() == 1 && specs[0].kind == "device" && specs[0].rank < 0 &&
               !specs[0].has("from") && !specs[0].has("to"))
      << "profile --colocation --inject \"" << text
      << "\": only one kind=device spec for every rank and step (an emulated device, "
         "\"kind=device,factor=X\"); the loads are the profile's own";
  return specs;
}

// Rank 0 gets every rank's text (in rank order); the others get "".
std::string gather_text(parallel::Communicator* world, const std::string& mine) {
  if (world == nullptr || world->size() == 1) return mine;
  const auto timeout = world->timeout();
  if (world->rank() != 0) {
    Tensor size = Tensor::zeros({1}, DType::kI64);
    size.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
    world->isend(size, 0, 1)->wait(timeout, "co-location rows' size");
    Tensor bytes =
        Tensor::zeros({std::max<int64_t>(1, static_cast<int64_t>(mine.size()))}, DType::kU8);
    std::copy(mine.begin(), mine.end(), bytes.data<uint8_t>());
    world->isend(bytes, 0, 2)->wait(timeout, "co-location rows");
    return "";
  }
  std::string all = mine;
  for (int r = 1; r < world->size(); ++r) {
    Tensor size = Tensor::zeros({1}, DType::kI64);
    world->irecv(size, r, 1)->wait(timeout, "co-location rows' size of rank " + std::to_string(r));
    const int64_t n = size.data<int64_t>()[0];
    Tensor bytes = Tensor::zeros({std::max<int64_t>(1, n)}, DType::kU8);
    world->irecv(bytes, r, 2)->wait(timeout, "co-location rows of rank " + std::to_string(r));
    all.append(reinterpret_cast<const char*>(bytes.data<uint8_t>()), static_cast<size_t>(n));
  }
  return all;
}

int profile(const ProfileOptions& o, parallel::Communicator* world) {
  const int rank = world != nullptr ? world->rank() : 0;
  const int ranks = world != nullptr ? world->size() : 1;
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const int max_threads = o.load_threads == 0 ? 2 * cores : o.load_threads;
  STRATA_CHECK(max_threads >= 1 && max_threads <= 256)
      << "--load-threads must be 0 (twice the cores) to 256, got " << o.load_threads;
  const std::vector<parallel::InjectSpec> device = device_spec(o.inject);
  std::ofstream out;
  if (rank == 0) {
    out.open(o.colocation_output);
    STRATA_CHECK(out.good()) << "cannot write --colocation-output '" << o.colocation_output << "'";
  }

  std::shared_ptr<const io::Dataset> data = open_profile_dataset(o);
  ExecContext ctx(Device::cpu(), nullptr, o.threads);
  std::unique_ptr<graph::Model> model = build_cli_model(o.model, o.size, o.model_spec, *data);
  graph::ParamStore store(*model, 0, model->size(), ctx.allocator());
  store.initialize(o.seed);
  graph::LayerProfiler profiler(*model);
  std::unique_ptr<parallel::Injector> injector;
  if (!device.empty()) injector = std::make_unique<parallel::Injector>(device, 0, 1, o.seed);
  io::DataLoaderOptions lo;
  lo.batch_size = o.batch_size;
  lo.seed = o.seed + static_cast<uint64_t>(rank);
  io::DataLoader loader(data, lo);
  io::Batch batch;
  int64_t epoch = 0, step = 0;
  loader.start_epoch(epoch);
  const size_t L = model->size();
  std::vector<double> layer_s(L, 0.0);
  int64_t samples = 0;
  const auto run_steps = [&](int64_t count) {
    for (int64_t k = 0; k < count; ++k, ++step) {
      if (!loader.next(&batch)) {
        loader.start_epoch(++epoch);
        STRATA_CHECK(loader.next(&batch)) << "dataset " << data->name() << " yields no batches";
      }
      graph::ForwardOptions fwd;
      fwd.seed = o.seed;
      fwd.step = step;
      step_layers(ctx, *model, batch, fwd, &profiler, injector.get(), step, &layer_s);
      samples += batch.input.size(0);
      store.zero_grads(ctx);
    }
  };
  const auto measure = [&](const dp::LoadSpec& spec, int load_rank) {
    Window w;
    w.load = spec;
    w.load_rank = spec.threads > 0 ? load_rank : -1;
    if (world != nullptr) world->barrier("co-location window");
    const bool loaded_here = rank == w.load_rank;
    dp::LoadGenerator load(loaded_here ? spec : dp::LoadSpec{});
    if (injector) injector->set_colocated_load(loaded_here ? spec.threads : 0, spec.duty);
    // Let the load's threads start before the window opens.
    std::this_thread::sleep_for(std::chrono::milliseconds(spec.threads > 0 ? 30 : 0));
    std::fill(layer_s.begin(), layer_s.end(), 0.0);
    samples = 0;
    dp::CounterWindow counters(load.thread_ids());
    run_steps(o.steps);
    w.counters = counters.finish();
    load.stop();
    if (injector) injector->set_colocated_load(0, 1.0);
    for (size_t l = 0; l < L; ++l) {
      w.layer_ms.push_back(samples > 0 ? 1e3 * layer_s[l] / static_cast<double>(samples) : 0.0);
    }
    return w;
  };

  run_steps(1);  // warm-up
  std::mt19937_64 rng(o.seed);
  const double duties[] = {0.25, 0.5, 0.75, 1.0};
  std::vector<Window> windows;
  for (int i = 0; i < o.colocation_samples; ++i) {
    windows.push_back(measure(dp::LoadSpec{}, -1));
    dp::LoadSpec spec;
    spec.threads = 1 + static_cast<int>(rng() % static_cast<uint64_t>(max_threads));
    spec.duty = duties[rng() % 4];
    spec.memory = rng() % 2 == 1;
    const int load_rank = static_cast<int>(rng() % static_cast<uint64_t>(ranks));
    windows.push_back(measure(spec, load_rank));
  }
  windows.push_back(measure(dp::LoadSpec{}, -1));

  const std::vector<graph::LayerProfile>& layers = profiler.layers();
  std::vector<double> solo(L, 0.0);
  for (size_t l = 0; l < L; ++l) {
    std::vector<double> v;
    for (const Window& w : windows) {
      if (w.load_rank < 0 && w.layer_ms[l] > 0) v.push_back(w.layer_ms[l]);
    }
    solo[l] = median(v);
  }
  std::ostringstream rows_text;
  rows_text.precision(9);
  size_t skipped = 0;
  if (rank == 0) {
    std::printf(
        "co-location profile of %s on %s, batch %lld, %lld steps per window, %d cores (%s)%s, "
        "%d rank%s\n",
        model->name().c_str(), data->name().c_str(), static_cast<long long>(o.batch_size),
        static_cast<long long>(o.steps), cores, describe_threads(ctx).c_str(),
        device.empty() ? "" : (", emulated device " + device[0].text).c_str(), ranks,
        ranks == 1 ? "" : "s");
    std::printf("  rank 0's windows:\n  %-6s %-36s %7s %7s %7s %9s %9s %7s %7s %9s\n", "window",
                "load", "util", "maxutil", "runq/c", "delay/cpu", "preempt/s", "cpu/s", "load",
                "slowdown");
  }
  for (size_t wi = 0; wi < windows.size(); ++wi) {
    const Window& w = windows[wi];
    // The target: the slowdown of the layers this rank ran, as the monitor measures a stage's
    // (their time in the window over their solo time, summed), on every layer's row. A layer's
    // own ratio is a column for study: for a layer of microseconds it is mostly when the emulated
    // device's sleep, owed per layer and paid once it reaches a millisecond, fell.
    double sum_solo = 0.0, sum_here = 0.0;
    for (size_t l = 0; l < L; ++l) {
      if (solo[l] > 0 && w.layer_ms[l] > 0) {
        sum_solo += solo[l];
        sum_here += w.layer_ms[l];
      }
    }
    const double stage_slowdown = sum_solo > 0 ? sum_here / sum_solo : 0.0;
    for (size_t l = 0; l < L; ++l) {
      if (solo[l] <= 0 || w.layer_ms[l] <= 0) {
        if (wi == 0) ++skipped;
        continue;
      }
      const double batch_bytes = static_cast<double>(std::max<int64_t>(1, layers[l].last_batch));
      dp::LayerFeatures lf;
      lf.solo_ms = solo[l];
      lf.param_bytes = static_cast<double>(layers[l].param_bytes);
      lf.output_bytes = static_cast<double>(layers[l].output_bytes) / batch_bytes;
      lf.activation_bytes = layers[l].activation_bytes_per_sample();
      rows_text << layers[l].name << "," << rank << "," << wi;
      for (double v : dp::slowdown_feature_row(lf, w.counters)) rows_text << "," << v;
      rows_text << "," << w.load.threads << "," << (w.load.threads > 0 ? w.load.duty : 0.0) << ","
                << (w.load.memory ? 1 : 0) << "," << w.load_rank << "," << w.layer_ms[l] << ","
                << w.layer_ms[l] / solo[l] << "," << stage_slowdown << "\n";
    }
    if (rank == 0) {
      std::string load = dp::describe_load(w.load);
      if (w.load_rank >= 0 && ranks > 1) load += " in rank " + std::to_string(w.load_rank);
      std::printf("  %-6zu %-36s %7.3f %7.3f %7.2f %9.3f %9.0f %7.3f %7.3f %9.3f\n", wi,
                  load.c_str(), w.counters.cpu_util_mean, w.counters.cpu_util_max,
                  w.counters.runq_per_core, w.counters.run_delay_per_cpu_s,
                  w.counters.preempt_per_cpu_s, w.counters.cpu_per_s, w.counters.colocated_threads,
                  stage_slowdown);
    }
  }
  const std::string all = gather_text(world, rows_text.str());
  if (rank != 0) return 0;
  out << "layer,rank,window";
  for (const std::string& n : dp::slowdown_features()) out << "," << n;
  out << ",load_threads,load_duty,load_memory,load_rank,colocated_ms,layer_slowdown,slowdown\n"
      << all;
  out.close();
  STRATA_CHECK(out.good()) << "cannot write --colocation-output '" << o.colocation_output << "'";
  const size_t total = static_cast<size_t>(std::count(all.begin(), all.end(), '\n'));
  std::printf(
      "wrote %s: %zu rows, feature set %s (%zu windows x %zu layers x %d rank%s; %zu layers of "
      "zero solo time left out)\n",
      o.colocation_output.c_str(), total, dp::kFeatureSet, windows.size(), L - skipped, ranks,
      ranks == 1 ? "" : "s", skipped);
  return 0;
}

}  // namespace

int run_colocation_profile(const ProfileOptions& o) {
  STRATA_CHECK(!o.colocation_output.empty()) << "--colocation needs --colocation-output FILE.csv";
  STRATA_CHECK(o.colocation_samples >= 1 && o.colocation_samples <= 10000)
      << "--colocation-samples must be 1 to 10000, got " << o.colocation_samples;
  STRATA_CHECK(o.steps > 0) << "--steps must be positive";
  STRATA_CHECK(o.batch_size > 0) << "--batch-size must be positive";
  STRATA_CHECK(o.output.empty()) << "--output is the plain profile's; --colocation writes "
                                    "--colocation-output";
  const parallel::ProcessInfo process = parallel::discover_process();
  if (process.world_size == 1) return profile(o, nullptr);
#ifdef STRATA_WITH_MPI
  parallel::MpiSession session;
  std::unique_ptr<parallel::MpiCommunicator> world = session.world();
  return profile(o, world.get());
#else
  STRATA_THROW() << "profile --colocation under " << process.launcher << " with "
                 << process.world_size << " ranks: this strata was built without MPI";
#endif
}

}  // namespace strata::tools
