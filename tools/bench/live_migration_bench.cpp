// vPIPE's live migration under async-1f1b: the throughput around a migration, live against
// stop-and-restart, and how long a migration takes with and without chunks and flow control.
//
//   live_migration_bench sim [--stages 4] [--micro-batches 4] [--steps 24] [--at 8]
//       The protocol replay of parallel/runtime/live_protocol.h over a link model (a SIMULATION
//       in ticks, not a measurement): per step, the ticks it took, live vs restart; then the ticks
//       and steps from the migration's prepare to its last arrival, and the slowest step, for
//       whole messages in one queue, chunks in one queue, and chunks behind the training traffic
//       with a window (the protocol's transfers).
//   live_migration_bench transfer [--mb 64] [--steps 60] [--repeats 3]
//       A MEASUREMENT on two local ranks: a training-like loop (compute, then an activation to the
//       other rank and a gradient back, every step) while a LiveTransfer
//       (parallel/runtime/live_transfer.h) moves --mb MiB from rank 0 to rank 1 from step 10; per
//       variant (whole tensors at normal priority; 1 MiB chunks, 4 MiB window, nice 19) the median
//       step time before and during the transfer, the slowest step during it, and the steps the
//       transfer took. Under mpirun -np 2 with --backend mpi, the same over MPI.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "engine/check.h"
#include "engine/tensor.h"
#include "parallel/comm/local_comm.h"
#include "parallel/runtime/live_protocol.h"
#include "parallel/runtime/live_transfer.h"
#ifdef STRATA_WITH_MPI
#include "parallel/comm/mpi_comm.h"
#endif

namespace strata {
namespace {

using parallel::Communicator;
using parallel::LiveReplayOptions;
using parallel::LiveReplayResult;
using parallel::LiveTransfer;
using parallel::LiveTransferConfig;
using parallel::Partition;

int64_t flag(int argc, char** argv, const std::string& name, int64_t fallback) {
  for (int i = 2; i + 1 < argc; ++i) {
    if (name == argv[i]) return std::atoll(argv[i + 1]);
  }
  return fallback;
}

std::string flag_str(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 2; i + 1 < argc; ++i) {
    if (name == argv[i]) return argv[i + 1];
  }
  return fallback;
}

// Ticks each step took: step t ends when its last micro-batch's backward ends on stage 0.
std::vector<int64_t> step_ticks(const LiveReplayResult& r, int64_t M) {
  std::vector<int64_t> out;
  int64_t last = 0;
  for (size_t t = 0; (t + 1) * static_cast<size_t>(M) <= r.done_at.size(); ++t) {
    int64_t end = 0;
    for (size_t j = t * static_cast<size_t>(M); j < (t + 1) * static_cast<size_t>(M); ++j) {
      end = std::max(end, r.done_at[j]);
    }
    out.push_back(end - last);
    last = end;
  }
  return out;
}

int64_t step_of_tick(const LiveReplayResult& r, int64_t M, int64_t tick) {
  for (size_t j = 0; j < r.done_at.size(); ++j) {
    if (r.done_at[j] >= tick) return static_cast<int64_t>(j) / M;
  }
  return static_cast<int64_t>(r.done_at.size()) / M;
}

int sim(int argc, char** argv) {
  const int S = static_cast<int>(flag(argc, argv, "--stages", 4));
  const int64_t M = flag(argc, argv, "--micro-batches", 4);
  const int64_t steps = flag(argc, argv, "--steps", 24);
  const int64_t at = flag(argc, argv, "--at", 8);
  Partition initial, next;
  for (int s = 0; s < S; ++s) initial.push_back({size_t(2 * s), size_t(2 * s + 2)});
  next = initial;
  next[0].end = 1;  // layer 1 moves from stage 0 to stage 1
  next[1].begin = 1;
  LiveReplayOptions base;
  base.initial = initial;
  base.next = next;
  base.first_backward = at * M;
  base.micro_batches = steps * M;
  base.forward_ticks = flag(argc, argv, "--forward-ticks", 2);
  base.backward_ticks = flag(argc, argv, "--backward-ticks", 4);
  base.bandwidth = flag(argc, argv, "--bandwidth", 1000);
  base.activation_bytes = flag(argc, argv, "--activation-bytes", 2000);
  base.tape_bytes = flag(argc, argv, "--tape-bytes", 8000);
  base.param_bytes = flag(argc, argv, "--param-bytes", 60000);
  std::printf(
      "protocol replay (simulation, ticks): S=%d M=%lld, layer 1 moves 0->1 at step %lld "
      "(K=%lld); fwd %lld, bwd %lld ticks; link %lld B/tick; activation %lld B, tape %lld "
      "B, parameters %lld B\n",
      S, static_cast<long long>(M), static_cast<long long>(at), static_cast<long long>(at * M),
      static_cast<long long>(base.forward_ticks), static_cast<long long>(base.backward_ticks),
      static_cast<long long>(base.bandwidth), static_cast<long long>(base.activation_bytes),
      static_cast<long long>(base.tape_bytes), static_cast<long long>(base.param_bytes));
  struct Variant {
    const char* name;
    bool restart;
    int64_t chunk;
    bool priority;
    int64_t window;
  };
  const int64_t chunk = flag(argc, argv, "--chunk-bytes", 1000);
  const int64_t window = flag(argc, argv, "--window-bytes", 2000);
  const std::vector<Variant> variants = {
      {"restart (drain, move, refill)", true, 0, false, 0},
      {"live, whole messages, one queue", false, 0, false, 0},
      {"live, chunks, one queue", false, chunk, false, 0},
      {"live, chunks behind training, window", false, chunk, true, window},
  };
  std::vector<std::vector<int64_t>> timelines;
  std::printf("\n%-40s %8s %8s %8s %10s %10s\n", "variant", "start", "end", "steps", "max step",
              "steady");
  for (const Variant& v : variants) {
    LiveReplayOptions o = base;
    o.restart = v.restart;
    o.chunk_bytes = v.chunk;
    o.priority = v.priority;
    o.window_bytes = v.window;
    const LiveReplayResult r = parallel::replay_live_migration(o);
    for (const std::string& violation : r.violations)
      std::printf("VIOLATION: %s\n", violation.c_str());
    const std::vector<int64_t> t = step_ticks(r, M);
    timelines.push_back(t);
    const int64_t steady = t[static_cast<size_t>(at - 2)];
    const int64_t worst = *std::max_element(t.begin() + at - 2, t.end() - 1);
    const int64_t first = step_of_tick(r, M, r.migration_start);
    const int64_t last = step_of_tick(r, M, r.migration_end);
    std::printf("%-40s %8lld %8lld %8lld %10lld %10lld\n", v.name,
                static_cast<long long>(r.migration_start), static_cast<long long>(r.migration_end),
                static_cast<long long>(last - first + 1), static_cast<long long>(worst),
                static_cast<long long>(steady));
  }
  std::printf(
      "\nticks per step around the migration (step %lld is the first of the new "
      "partition's backwards)\n%-6s",
      static_cast<long long>(at), "step");
  for (const Variant& v : variants) std::printf(" %12.12s", v.name);
  std::printf("\n");
  for (int64_t s = std::max<int64_t>(0, at - 3); s < std::min<int64_t>(steps - 1, at + 5); ++s) {
    std::printf("%-6lld", static_cast<long long>(s));
    for (const auto& t : timelines) std::printf(" %12lld", static_cast<long long>(t[size_t(s)]));
    std::printf("\n");
  }
  return 0;
}

// A training-like step: `work` rounds of arithmetic over a buffer, then an activation to the
// peer and its gradient back.
double train_step(Communicator& pipe, Tensor& act, Tensor& scratch, int work) {
  const auto t0 = std::chrono::steady_clock::now();
  float* p = scratch.data<float>();
  for (int r = 0; r < work; ++r) {
    for (int64_t i = 0; i < scratch.numel(); ++i) p[i] = p[i] * 0.999f + 0.001f;
  }
  const int peer = 1 - pipe.rank();
  if (pipe.rank() == 0) {
    pipe.isend(act, peer, 1)->wait(pipe.timeout(), "bench activation");
    pipe.irecv(act, peer, 2)->wait(pipe.timeout(), "bench gradient");
  } else {
    pipe.irecv(act, peer, 1)->wait(pipe.timeout(), "bench activation");
    pipe.isend(act, peer, 2)->wait(pipe.timeout(), "bench gradient");
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct TransferRun {
  double before = 0, during = 0;  // median step seconds
  double worst = 0;               // the slowest step during the transfer
  int64_t steps = 0;              // steps from the first post to the last arrival
};

TransferRun transfer_run(Communicator& pipe, Communicator& migrate, int64_t mb, int64_t steps,
                         bool chunked) {
  Tensor act = Tensor::zeros({256 * 1024});  // 1 MiB
  Tensor scratch = Tensor::zeros({64 * 1024});
  LiveTransferConfig config;
  config.chunk_bytes = chunked ? (size_t{1} << 20) : 0;
  config.window_bytes = chunked ? (size_t{4} << 20) : 0;
  config.low_priority = chunked;
  const int64_t items = 8;
  const int64_t per_item = mb * (1 << 20) / 4 / items;
  const bool source = pipe.rank() == 0;
  LiveTransfer t(migrate, 1 - pipe.rank(),
                 source ? LiveTransfer::Role::kSource : LiveTransfer::Role::kTarget, items,
                 "bench migration", config);
  std::vector<double> before, during;
  int64_t started = -1, finished = -1;
  const int64_t from = 10;
  for (int64_t s = 0; s < steps; ++s) {
    if (s == from) {
      started = s;
      for (int64_t i = 0; i < items; ++i) {
        if (source) {
          t.post(i, {Tensor::full({per_item}, static_cast<double>(i))});
        } else {
          t.expect(i, {{Shape{per_item}, DType::kF32}});
        }
      }
    }
    const double sec = train_step(pipe, act, scratch, 40);
    if (s >= 3 && s < from) before.push_back(sec);
    if (started >= 0 && finished < 0) {
      during.push_back(sec);
      // Both ranks agree on the step the transfer ended: the target's view, sent with a flag.
      Tensor done = Tensor::full({1}, source ? 0.0 : (t.arrived(items - 1) ? 1.0 : 0.0));
      if (source) {
        pipe.irecv(done, 1, 3)->wait(pipe.timeout(), "bench done");
      } else {
        pipe.isend(done, 0, 3)->wait(pipe.timeout(), "bench done");
      }
      if (done.item<float>() > 0) finished = s;
    }
  }
  t.finish();
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  TransferRun out;
  out.before = median(before);
  out.during = median(during);
  out.worst = during.empty() ? 0.0 : *std::max_element(during.begin(), during.end());
  out.steps = finished < 0 ? -1 : finished - started + 1;
  return out;
}

void transfer_on(Communicator& pipe, Communicator& migrate, int64_t mb, int64_t steps,
                 int repeats) {
  std::vector<TransferRun> whole, chunked;
  for (int r = 0; r < repeats; ++r) {  // interleaved
    whole.push_back(transfer_run(pipe, migrate, mb, steps, false));
    chunked.push_back(transfer_run(pipe, migrate, mb, steps, true));
  }
  if (pipe.rank() != 0) return;
  auto report = [&](const char* name, std::vector<TransferRun> runs) {
    std::sort(runs.begin(), runs.end(),
              [](const TransferRun& a, const TransferRun& b) { return a.during < b.during; });
    const TransferRun& m = runs[runs.size() / 2];
    std::printf("%-44s %10.2f %10.2f %10.2f %8lld\n", name, m.before * 1e3, m.during * 1e3,
                m.worst * 1e3, static_cast<long long>(m.steps));
  };
  std::printf(
      "%lld MiB moved from step 10 (%s, %d interleaved repeats, median of the runs by "
      "step time during)\n%-44s %10s %10s %10s %8s\n",
      static_cast<long long>(mb), pipe.backend().c_str(), repeats, "variant", "ms before",
      "ms during", "max during", "steps");
  report("whole tensors, no window, normal priority", whole);
  report("1 MiB chunks, 4 MiB window, nice 19", chunked);
}

int transfer(int argc, char** argv) {
  const int64_t mb = flag(argc, argv, "--mb", 64);
  const int64_t steps = flag(argc, argv, "--steps", 60);
  const int repeats = static_cast<int>(flag(argc, argv, "--repeats", 3));
  const std::string backend = flag_str(argc, argv, "--backend", "local");
  if (backend == "mpi") {
#ifdef STRATA_WITH_MPI
    parallel::MpiSession session(&argc, &argv);
    auto world = session.world();
    STRATA_CHECK_EQ(world->size(), 2) << "live_migration_bench transfer: run with mpirun -np 2";
    auto migrate = world->split(0, world->rank());
    transfer_on(*world, *migrate, mb, steps, repeats);
    return 0;
#else
    STRATA_THROW() << "built without MPI";
#endif
  }
  parallel::LocalWorld world(2);
  parallel::run_local_ranks(world, [&](parallel::LocalCommunicator& pipe) {
    auto migrate = pipe.split(0, pipe.rank());
    transfer_on(pipe, *migrate, mb, steps, repeats);
  });
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "sim") return strata::sim(argc, argv);
    if (mode == "transfer") return strata::transfer(argc, argv);
    std::fprintf(stderr, "usage: live_migration_bench sim|transfer [flags] (see the source)\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "live_migration_bench: %s\n", e.what());
    return 1;
  }
}
