// `strata profile --colocation`: DynPipe's co-location data set (parallel/dynpipe/colocation.h).
//
// The model trains (forward, loss, backward; no update) in windows of --steps steps with the layer
// profiler attached. Solo windows (no load) come first and after every fourth loaded window; each
// loaded window runs beside a load drawn by --seed: 1 to --load-threads threads, busy 25/50/75/100%
// of the time, compute or memory. The CPU's counters are read over every window. One CSV row per
// layer and window:
//   layer, window, layer_solo_ms (forward + backward ms per sample, the median over the solo
//   windows), layer_param_bytes, layer_output_bytes, layer_activation_bytes (per sample),
//   load_threads, load_duty, load_memory, the counters (colocation.h), colocated_ms (the layer's
//   ms per sample in this window) and slowdown = colocated_ms / layer_solo_ms.
// Solo windows are rows too (load_threads 0): the model must learn what no load looks like.
// Layers whose solo time is zero (a reshape) are left out.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/check.h"
#include "engine/exec_context.h"
#include "graph/param_store.h"
#include "graph/profiler.h"
#include "graph/train_step.h"
#include "io/data_loader.h"
#include "parallel/dynpipe/colocation.h"
#include "tools/common.h"
#include "tools/profile_command.h"

namespace strata::tools {

namespace dp = parallel::dynpipe;

namespace {

struct Window {
  dp::LoadSpec load;
  dp::CpuCounters counters;
  std::vector<double> layer_ms;  // forward + backward ms per sample
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const int max_threads = o.load_threads == 0 ? 2 * cores : o.load_threads;
  STRATA_CHECK(max_threads >= 1 && max_threads <= 256)
      << "--load-threads must be 0 (twice the cores) to 256, got " << o.load_threads;
  std::ofstream out(o.colocation_output);
  STRATA_CHECK(out.good()) << "cannot write --colocation-output '" << o.colocation_output << "'";

  std::shared_ptr<const io::Dataset> data = open_profile_dataset(o);
  ExecContext ctx(Device::cpu(), nullptr, o.threads);
  std::unique_ptr<graph::Model> model = build_cli_model(o.model, o.size, o.model_spec, *data);
  graph::ParamStore store(*model, 0, model->size(), ctx.allocator());
  store.initialize(o.seed);
  graph::LayerProfiler profiler(*model);
  io::DataLoaderOptions lo;
  lo.batch_size = o.batch_size;
  lo.seed = o.seed;
  io::DataLoader loader(data, lo);
  io::Batch batch;
  int64_t epoch = 0, step = 0;
  loader.start_epoch(epoch);
  const auto run_steps = [&](int64_t count) {
    for (int64_t k = 0; k < count; ++k, ++step) {
      if (!loader.next(&batch)) {
        loader.start_epoch(++epoch);
        STRATA_CHECK(loader.next(&batch)) << "dataset " << data->name() << " yields no batches";
      }
      graph::ForwardOptions fwd;
      fwd.seed = o.seed;
      fwd.step = step;
      graph::train_forward_backward(ctx, *model, batch.input, batch.target, {}, fwd, &profiler);
      store.zero_grads(ctx);
    }
  };
  const auto measure = [&](const dp::LoadSpec& spec) {
    Window w;
    w.load = spec;
    dp::LoadGenerator load(spec);
    // Let the load's threads start before the window opens.
    std::this_thread::sleep_for(std::chrono::milliseconds(spec.threads > 0 ? 30 : 0));
    profiler.reset();
    dp::CounterWindow counters(load.thread_ids());
    run_steps(o.steps);
    w.counters = counters.finish();
    load.stop();
    for (const graph::LayerProfile& l : profiler.layers()) {
      w.layer_ms.push_back(l.samples > 0 ? 1e3 * (l.forward_seconds + l.backward_seconds) /
                                               static_cast<double>(l.samples)
                                         : 0.0);
    }
    return w;
  };

  run_steps(1);  // warm-up
  std::mt19937_64 rng(o.seed);
  const double duties[] = {0.25, 0.5, 0.75, 1.0};
  std::vector<Window> windows;
  windows.push_back(measure(dp::LoadSpec{}));
  for (int i = 0; i < o.colocation_samples; ++i) {
    dp::LoadSpec spec;
    spec.threads = 1 + static_cast<int>(rng() % static_cast<uint64_t>(max_threads));
    spec.duty = duties[rng() % 4];
    spec.memory = rng() % 2 == 1;
    windows.push_back(measure(spec));
    if ((i + 1) % 4 == 0 || i + 1 == o.colocation_samples) windows.push_back(measure({}));
  }

  const std::vector<graph::LayerProfile>& layers = profiler.layers();
  std::vector<double> solo(layers.size(), 0.0);
  for (size_t l = 0; l < layers.size(); ++l) {
    std::vector<double> v;
    for (const Window& w : windows) {
      if (w.load.threads == 0) v.push_back(w.layer_ms[l]);
    }
    solo[l] = median(v);
  }
  out << "layer,window,layer_solo_ms,layer_param_bytes,layer_output_bytes,layer_activation_bytes,"
         "load_threads,load_duty,load_memory";
  for (const std::string& n : dp::counter_names()) out << "," << n;
  out << ",colocated_ms,slowdown\n";
  out.precision(9);
  size_t rows = 0, skipped = 0;
  std::printf("co-location profile of %s on %s, batch %lld, %lld steps per window, %d cores (%s)\n",
              model->name().c_str(), data->name().c_str(), static_cast<long long>(o.batch_size),
              static_cast<long long>(o.steps), cores, describe_threads(ctx).c_str());
  std::printf("  %-6s %-28s %8s %8s %8s %10s %10s %10s %10s\n", "window", "load", "util", "maxutil",
              "runq", "ctxt/s", "vol cs/s", "invol/s", "slowdown");
  for (size_t wi = 0; wi < windows.size(); ++wi) {
    const Window& w = windows[wi];
    const std::vector<double> counters = dp::counter_values(w.counters);
    double sum_solo = 0.0, sum_here = 0.0;
    for (size_t l = 0; l < layers.size(); ++l) {
      if (solo[l] <= 0 || w.layer_ms[l] <= 0) {
        if (wi == 0) ++skipped;
        continue;
      }
      const double batch_bytes = static_cast<double>(std::max<int64_t>(1, layers[l].last_batch));
      out << layers[l].name << "," << wi << "," << solo[l] << "," << layers[l].param_bytes << ","
          << static_cast<double>(layers[l].output_bytes) / batch_bytes << ","
          << layers[l].activation_bytes_per_sample() << "," << w.load.threads << ","
          << (w.load.threads > 0 ? w.load.duty : 0.0) << "," << (w.load.memory ? 1 : 0);
      for (double c : counters) out << "," << c;
      out << "," << w.layer_ms[l] << "," << w.layer_ms[l] / solo[l] << "\n";
      ++rows;
      sum_solo += solo[l];
      sum_here += w.layer_ms[l];
    }
    std::printf("  %-6zu %-28s %8.3f %8.3f %8.2f %10.0f %10.0f %10.0f %10.3f\n", wi,
                dp::describe_load(w.load).c_str(), w.counters.cpu_util_mean,
                w.counters.cpu_util_max, w.counters.procs_running, w.counters.ctxt_per_s,
                w.counters.voluntary_cs_per_s, w.counters.involuntary_cs_per_s,
                sum_solo > 0 ? sum_here / sum_solo : 0.0);
  }
  out.close();
  STRATA_CHECK(out.good()) << "cannot write --colocation-output '" << o.colocation_output << "'";
  std::printf(
      "wrote %s: %zu rows (%zu windows x %zu layers; %zu layers of zero solo time left "
      "out)\n",
      o.colocation_output.c_str(), rows, windows.size(), layers.size() - skipped, skipped);
  return 0;
}

}  // namespace strata::tools
