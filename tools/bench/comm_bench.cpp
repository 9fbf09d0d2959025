// all_reduce benchmark of the communicator backends (f32 sum, in place).
//
//   comm_bench --backend local --ranks 4 [--numel 1048576] [--iters 50]
//   mpirun -np 4 comm_bench --backend mpi [--numel 1048576] [--iters 50]
//
// Every iteration starts from the same inputs (rank r holds r + 1 everywhere) and is checked
// against the exact sum N (N + 1) / 2. Ranks meet in a barrier before each timed all_reduce;
// rank 0 prints the median and best time per all_reduce over the iterations after 5 warm-up ones,
// with the algorithm bandwidth (bytes / time) and the bus bandwidth (2 (N - 1) / N bytes / time,
// what a ring moves per rank).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "engine/check.h"
#include "engine/tensor.h"
#include "parallel/comm/local_comm.h"
#ifdef STRATA_WITH_MPI
#include "parallel/comm/mpi_comm.h"
#endif

namespace strata {
namespace {

struct Options {
  std::string backend = "local";
  int ranks = 4;  // local backend only
  int64_t numel = 1 << 20;
  int iters = 50;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    STRATA_CHECK(i + 1 < argc) << "comm_bench: " << flag << " needs a value";
    const std::string value = argv[++i];
    if (flag == "--backend") {
      o.backend = value;
    } else if (flag == "--ranks") {
      o.ranks = std::stoi(value);
    } else if (flag == "--numel") {
      o.numel = std::stoll(value);
    } else if (flag == "--iters") {
      o.iters = std::stoi(value);
    } else {
      STRATA_THROW() << "comm_bench: unknown flag " << flag
                     << " (--backend local|mpi, --ranks, --numel, --iters)";
    }
  }
  STRATA_CHECK(o.backend == "local" || o.backend == "mpi")
      << "comm_bench: --backend must be local or mpi, got " << o.backend;
  STRATA_CHECK(o.iters > 0 && o.numel > 0 && o.ranks > 0) << "comm_bench: sizes must be positive";
  return o;
}

constexpr int kWarmup = 5;

// Runs the iterations on one rank; returns the seconds of each timed all_reduce.
std::vector<double> run_rank(parallel::Communicator& comm, const Options& o) {
  Tensor x = Tensor::empty({o.numel});
  const float expected = comm.size() * (comm.size() + 1) / 2.0f;
  std::vector<double> times;
  for (int it = 0; it < kWarmup + o.iters; ++it) {
    x.fill_(comm.rank() + 1.0);
    comm.barrier("bench barrier");
    const auto start = std::chrono::steady_clock::now();
    wait(*comm.all_reduce(x), comm, "bench all_reduce");
    const auto end = std::chrono::steady_clock::now();
    if (it >= kWarmup) times.push_back(std::chrono::duration<double>(end - start).count());
    const float* p = x.data<float>();
    STRATA_CHECK(p[0] == expected && p[o.numel - 1] == expected && p[o.numel / 2] == expected)
        << "comm_bench: wrong all_reduce result on rank " << comm.rank();
  }
  return times;
}

void report(const std::string& backend, int ranks, const Options& o, std::vector<double> times) {
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2], best = times.front();
  const double bytes = static_cast<double>(o.numel) * sizeof(float);
  std::printf(
      "%s all_reduce f32 sum, %d ranks, %lld elements (%.1f MiB): median %.3f ms, best %.3f ms; "
      "algorithm bandwidth %.2f GB/s, bus bandwidth %.2f GB/s (median)\n",
      backend.c_str(), ranks, static_cast<long long>(o.numel), bytes / (1 << 20), median * 1e3,
      best * 1e3, bytes / median / 1e9, 2.0 * (ranks - 1) / ranks * bytes / median / 1e9);
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.backend == "local") {
    parallel::LocalWorld world(o.ranks);
    std::vector<double> times;
    std::mutex mutex;
    parallel::run_local_ranks(world, [&](parallel::LocalCommunicator& comm) {
      std::vector<double> mine = run_rank(comm, o);
      std::lock_guard<std::mutex> lock(mutex);
      if (comm.rank() == 0) times = std::move(mine);
    });
    report("local", o.ranks, o, times);
    return 0;
  }
#ifdef STRATA_WITH_MPI
  parallel::MpiSession mpi(&argc, &argv);
  auto world = mpi.world();
  std::vector<double> times = run_rank(*world, o);
  if (mpi.rank() == 0) {
    std::printf("%s\n", mpi.describe().c_str());
    report("mpi", mpi.size(), o, times);
  }
  return 0;
#else
  STRATA_THROW() << "comm_bench: --backend mpi needs a build with MPI (-DSTRATA_WITH_MPI=ON)";
#endif
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  try {
    return strata::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
