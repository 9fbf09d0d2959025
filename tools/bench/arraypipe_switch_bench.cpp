// ArrayPipe's switch latency and the memory manager's ablation (issue 17 item 6,
// papers/arraypipe.md §2.1: GPT-2, stop-resume 6.7 s, states loaded from host memory 0.47 s,
// prefetched 0.08 s), measured in our engine on one model's block states (GPT-2 of --size, AdamW:
// parameters, two optimizer slots, gradients).
//
//   arraypipe_switch_bench [--size 124M] [--jobs 3] [--repeats 5] [--strata PATH]
//
// One switch to a job whose state is:
//   restart       a fresh `strata train` process resuming the job's checkpoint, up to and
//                 including its first step (--strata; skipped without it): the stop-resume
//                 switch of a job run alone;
//   no sharing    a layer structure of its own (no context sharing): the model built again, a
//                 store over it, the state copied in from host memory;
//   from host     in the host pool, not prefetched (--array-slots 1): the copy in, waited for;
//   prefetched    brought in while the previous block computed (--array-slots 2 of 3 jobs; the
//                 previous block's compute is emulated by a sleep of twice the from-host time, so
//                 that the copy can finish under it): what is left of the switch;
//   resident      every job on the device (no memory manager): a rebinding of views.
// Each row: the median over --repeats of the switch's wall time, and the allocator's peak for
// the --jobs jobs' states (the device memory --mem-limit caps; on this CPU build the device is
// emulated, the copies are memory copies by the swap engine's threads).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/exec_context.h"
#include "graph/model.h"
#include "graph/model_spec.h"
#include "graph/param_store.h"
#include "models/registry.h"
#include "parallel/arraypipe/binder.h"
#include "parallel/arraypipe/state_slots.h"
#include "parallel/runtime/copy_engine.h"

namespace strata {
namespace {

namespace ap = parallel::arraypipe;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string size = "124M";
  int jobs = 3;
  int repeats = 5;
  int64_t seq_len = 64;
  std::string strata;  // the CLI, for the restart row
  std::string work_dir = "/tmp/strata_arraypipe_switch_bench";
};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

proto::ModelSpec spec_of(const Options& o) {
  return models::model_spec("gpt2", o.size, {o.seq_len}, 50257);
}

struct Row {
  std::string name;
  double seconds = 0.0;
  double peak_bytes = 0.0;
  std::string note;
};

// The jobs' states in `slots` slots (0: every job resident), and switches among them.
struct Array {
  CpuAllocator device, pool;
  std::unique_ptr<ExecContext> ctx;
  std::unique_ptr<graph::Model> model;
  std::unique_ptr<ap::Binder> binder;
  std::unique_ptr<parallel::CopyEngine> engine;
  std::unique_ptr<ap::StateSlots> slots;

  Array(const Options& o, int k) {
    ctx = std::make_unique<ExecContext>(Device::cpu(), &device, 1);
    model = graph::build_model(spec_of(o));
    binder = std::make_unique<ap::Binder>(*model, 0, model->size(), device);
    if (k < o.jobs) engine = std::make_unique<parallel::CopyEngine>(*ctx, pool, "--swap-pool");
    slots = std::make_unique<ap::StateSlots>(*binder, std::min(k, o.jobs), engine.get(), false);
    for (int j = 0; j < o.jobs; ++j) {
      binder->add_job(static_cast<uint64_t>(j + 1), 2);
      slots->admit(j);
    }
  }
};

Row from_host(const Options& o) {
  Array a(o, 1);
  std::vector<double> t;
  for (int r = 0; r < o.repeats + 1; ++r) {
    const int job = (r + 1) % o.jobs;  // never the one in the slot
    const auto start = Clock::now();
    a.slots->use(job);
    if (r > 0) t.push_back(seconds_since(start));  // the first one warms the pool
  }
  const ap::SlotStats s = a.slots->stats();
  return {"from host (1 slot, not prefetched)", median(t),
          static_cast<double>(a.device.stats().peak),
          std::to_string(s.not_prefetched) + " loads not prefetched, state " +
              format_bytes(s.state_bytes)};
}

Row prefetched(const Options& o, double compute_s) {
  Array a(o, 2);
  std::vector<double> t;
  std::vector<int> order;
  for (int r = 0; r < 2 * (o.repeats + 2); ++r) order.push_back(r % o.jobs);
  for (size_t b = 0; b < order.size(); ++b) {
    const auto start = Clock::now();
    a.slots->before_block(
        std::vector<int>(order.begin() + static_cast<std::ptrdiff_t>(b), order.end()));
    if (b >= static_cast<size_t>(o.jobs)) t.push_back(seconds_since(start));
    // The block's compute, under which the next job's copy runs.
    std::this_thread::sleep_for(std::chrono::duration<double>(compute_s));
  }
  const ap::SlotStats s = a.slots->stats();
  return {
      "prefetched (2 slots)", median(t), static_cast<double>(a.device.stats().peak),
      std::to_string(s.prefetched) + " prefetched loads, " + std::to_string(s.stalls) + " stalls"};
}

Row resident(const Options& o) {
  Array a(o, o.jobs);
  std::vector<double> t;
  for (int r = 0; r < o.repeats + 1; ++r) {
    const auto start = Clock::now();
    a.slots->use(r % o.jobs);
    if (r > 0) t.push_back(seconds_since(start));
  }
  return {"resident (no memory manager)", median(t), static_cast<double>(a.device.stats().peak),
          "every job's state on the device"};
}

// No context sharing: each switch makes the job's own layer structure and store, and copies its
// state in from host memory.
Row no_sharing(const Options& o) {
  CpuAllocator device, host;
  std::vector<std::vector<Tensor>> saved;  // each job's values on the host
  {
    auto model = graph::build_model(spec_of(o));
    for (int j = 0; j < o.jobs; ++j) {
      graph::ParamStore store(*model, 0, model->size(), device);
      store.initialize(static_cast<uint64_t>(j + 1));
      store.ensure_state(2);
      std::vector<Tensor> values;
      for (const Tensor* v : ap::state_values(store)) {
        Tensor h = Tensor::empty(v->shape(), v->dtype(), &host);
        h.copy_from(*v);
        values.push_back(h);
      }
      saved.push_back(std::move(values));
    }
  }
  device.reset_peak();
  std::vector<double> t;
  std::unique_ptr<graph::Model> model;  // outlives the store (which unbinds its layers)
  std::unique_ptr<graph::ParamStore> store;
  for (int r = 0; r < o.repeats + 1; ++r) {
    const auto start = Clock::now();
    store.reset();
    model = graph::build_model(spec_of(o));
    store = std::make_unique<graph::ParamStore>(*model, 0, model->size(), device);
    store->ensure_state(2);
    const std::vector<Tensor*> values = ap::state_values(*store);
    const std::vector<Tensor>& from = saved[static_cast<size_t>(r % o.jobs)];
    for (size_t i = 0; i < values.size(); ++i) values[i]->copy_from(from[i]);
    if (r > 0) t.push_back(seconds_since(start));
  }
  return {"no context sharing (a layer structure per job)", median(t),
          static_cast<double>(device.stats().peak), "model built, store made, state copied in"};
}

Row restart(const Options& o) {
  if (o.strata.empty()) return {"restart (process)", -1, 0, "skipped: no --strata"};
  namespace fs = std::filesystem;
  fs::remove_all(o.work_dir);
  fs::create_directories(o.work_dir);
  const std::string common = o.strata + " train --model gpt2 --size " + o.size +
                             " --dataset brown --seq-len " + std::to_string(o.seq_len) +
                             " --train-samples 64 --batch-size 1 --threads 1 --progress off "
                             "--checkpoint-dir " +
                             o.work_dir + "/ckpt";
  const std::string quiet = " > " + o.work_dir + "/log.txt 2>&1";
  STRATA_CHECK(std::system((common + " --steps 1 --save-every 1" + quiet).c_str()) == 0)
      << "restart: the first run failed; see " << o.work_dir << "/log.txt";
  std::vector<double> t;
  for (int r = 0; r < std::max(1, o.repeats / 2); ++r) {
    const auto start = Clock::now();
    STRATA_CHECK(
        std::system((common + " --steps 2 --resume auto --save-every 0" + quiet).c_str()) == 0)
        << "restart: the resumed run failed; see " << o.work_dir << "/log.txt";
    t.push_back(seconds_since(start));
  }
  return {"restart (process)", median(t), 0,
          "fresh strata train: start, data, model, checkpoint, first step"};
}

int run(const Options& o) {
  STRATA_CHECK(o.jobs >= 3) << "--jobs must be >= 3 (2 slots of 3 jobs for the prefetched row)";
  STRATA_CHECK(o.repeats >= 1) << "--repeats must be >= 1";
  std::vector<Row> rows;
  rows.push_back(restart(o));
  rows.push_back(no_sharing(o));
  rows.push_back(from_host(o));
  rows.push_back(prefetched(o, 2 * rows.back().seconds));
  rows.push_back(resident(o));
  std::printf("GPT-2 %s, %d jobs (AdamW), median of %d switches\n\n", o.size.c_str(), o.jobs,
              o.repeats);
  std::printf("| switch | seconds | device peak (states) | notes |\n|---|---:|---:|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %s | %s | %s |\n", r.name.c_str(),
                r.seconds < 0 ? "-" : (std::to_string(r.seconds).substr(0, 8)).c_str(),
                r.peak_bytes > 0 ? format_bytes(static_cast<size_t>(r.peak_bytes)).c_str() : "-",
                r.note.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  strata::Options o;
  CLI::App app{"ArrayPipe switch latency: restart / no context sharing / from host / prefetched"};
  app.add_option("--size", o.size, "GPT-2 size (tiny, 124M, ...)");
  app.add_option("--jobs", o.jobs, "jobs in the array (>= 3)");
  app.add_option("--repeats", o.repeats, "switches measured per row");
  app.add_option("--seq-len", o.seq_len, "tokens per sample");
  app.add_option("--strata", o.strata, "the strata CLI, for the restart row (skipped without)");
  app.add_option("--work-dir", o.work_dir, "checkpoints of the restart row");
  CLI11_PARSE(app, argc, argv);
  try {
    return strata::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "arraypipe_switch_bench: %s\n", e.what());
    return 1;
  }
}
