// The co-location load generator and the /proc counters of DynPipe's data set
// (parallel/dynpipe/colocation.h): the load's threads run and are named, the counters are read
// and in range, and bad settings are refused. No timed assertions: whether a load slows a layer is
// what `strata profile --colocation` measures, not what a unit test may assume on a shared machine.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "engine/check.h"
#include "parallel/dynpipe/colocation.h"
#include "parallel/dynpipe_test_util.h"

namespace strata::parallel::dynpipe {
namespace {

using testing::throws_message;

TEST(DynPipeColocation, SnapshotReadsEveryCoreAndTheRunQueue) {
  const CpuSnapshot s = read_cpu_snapshot();
  EXPECT_GE(s.cores.size(), 1u);
  for (const CpuSnapshot::Core& c : s.cores) EXPECT_LE(c.busy, c.total);
  EXPECT_GT(s.context_switches, 0u);
  EXPECT_GE(s.procs_running, 1u);  // this thread
}

TEST(DynPipeColocation, LoadThreadsRunAndAreLeftOutOfTheProcessCounters) {
  for (const bool memory : {false, true}) {
    LoadSpec spec;
    spec.threads = 2;
    spec.duty = 0.5;
    spec.memory = memory;
    spec.memory_bytes = 1u << 20;
    LoadGenerator load(spec);
    ASSERT_EQ(load.thread_ids().size(), 2u);
    while (load.busy_periods() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    // Named as a load's: every snapshot leaves them out, listed or not (--inject kind=load's
    // threads carry the name too, so training's monitor leaves them out as the profile does).
    for (int tid : load.thread_ids()) {
      std::ifstream comm("/proc/self/task/" + std::to_string(tid) + "/comm");
      std::string name;
      std::getline(comm, name);
      EXPECT_EQ(name, kLoadThreadName);
    }
    CounterWindow window(load.thread_ids());
    const uint64_t before = load.busy_periods();
    while (load.busy_periods() < before + 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const CpuCounters c = window.finish();
    // Left out of the process's counters, they are the co-located load's counter.
    EXPECT_GT(c.colocated_threads, 0.0);
    load.stop();
    EXPECT_GE(load.busy_periods(), 4u - 2u);
    EXPECT_EQ(load.thread_ids().size(), 2u);
    EXPECT_NE(load.thread_ids()[0], load.thread_ids()[1]);
    EXPECT_GE(c.cpu_util_mean, 0.0);
    EXPECT_LE(c.cpu_util_mean, c.cpu_util_max);
    EXPECT_LE(c.cpu_util_max, 1.0);
    EXPECT_GE(c.runq_per_core, 0.0);
    EXPECT_GE(c.run_delay_per_cpu_s, 0.0);
    EXPECT_GE(c.preempt_per_cpu_s, 0.0);
    EXPECT_EQ(counter_values(c).size(), counter_names().size());
  }
  EXPECT_EQ(describe_load({}), "none");
  LoadSpec m;
  m.threads = 3;
  m.duty = 0.25;
  m.memory = true;
  EXPECT_EQ(describe_load(m), "3 memory threads at 25%");
}

TEST(DynPipeColocation, CountersOverAWindowAreNormalized) {
  CpuSnapshot a, b;
  a.cores = {{10, 100}, {50, 100}};
  b.cores = {{60, 200}, {150, 200}};  // cores busy 50% and 100% of the window
  a.context_switches = 1000;
  b.context_switches = 3000;
  a.voluntary = 5;
  b.voluntary = 25;
  a.involuntary = 2;
  b.involuntary = 4;
  a.exec_ns = 1000000000;
  b.exec_ns = 3000000000;  // 2 CPU seconds in the window
  a.run_delay_ns = 0;
  b.run_delay_ns = 1000000000;  // waited 1 s for a core
  a.load_exec_ns = 5000000000;
  b.load_exec_ns = 11000000000;  // the load's threads: 6 CPU seconds in the window
  a.load_delay_ns = 0;
  b.load_delay_ns = 2000000000;  // and 2 s runnable, waiting for a core
  a.seconds = 1.0;
  b.seconds = 5.0;
  const CpuCounters c = counters_between(a, b, 2.5);
  EXPECT_DOUBLE_EQ(c.cpu_util_mean, 0.75);
  EXPECT_DOUBLE_EQ(c.cpu_util_max, 1.0);
  EXPECT_DOUBLE_EQ(c.runq_per_core, 1.25);  // 2.5 over 2 cores
  EXPECT_DOUBLE_EQ(c.run_delay_per_cpu_s, 0.5);
  EXPECT_DOUBLE_EQ(c.preempt_per_cpu_s, 1.0);  // 2 per 2 CPU seconds
  EXPECT_DOUBLE_EQ(c.cpu_per_s, 0.5);
  EXPECT_DOUBLE_EQ(c.colocated_threads, 2.0);  // (6 + 2) s over 4 s: 2 threads wanting a core
  // The same window on a machine of twice the cores and twice the run queue: the same row.
  CpuSnapshot a2 = a, b2 = b;
  a2.cores.insert(a2.cores.end(), a.cores.begin(), a.cores.end());
  b2.cores.insert(b2.cores.end(), b.cores.begin(), b.cores.end());
  EXPECT_EQ(counter_values(counters_between(a2, b2, 5.0)), counter_values(c));
  // Under a millisecond of CPU the process's ratios are none, not noise.
  b.exec_ns = a.exec_ns + 500000;
  const CpuCounters idle = counters_between(a, b, 2.5);
  EXPECT_EQ(idle.run_delay_per_cpu_s, 0.0);
  EXPECT_EQ(idle.preempt_per_cpu_s, 0.0);
  EXPECT_EQ(counter_values(counters_from_values(counter_values(c))), counter_values(c));
  EXPECT_NE(throws_message([] { counters_from_values({1.0}); }).find("counter values"),
            std::string::npos);
}

TEST(DynPipeColocation, ProcessCountersReadSchedstat) {
  // This thread runs: its CPU time grows between two snapshots (the kernel has schedstat).
  const CpuSnapshot a = read_cpu_snapshot();
  volatile double x = 1.0;
  for (int i = 0; i < 20000000; ++i) x = x * 1.0000001 + 1e-9;
  const CpuSnapshot b = read_cpu_snapshot();
  EXPECT_GT(b.exec_ns, a.exec_ns);
  EXPECT_GE(b.run_delay_ns, a.run_delay_ns);
}

TEST(DynPipeColocation, BadLoadsAreRefused) {
  LoadSpec s;
  s.threads = -1;
  EXPECT_NE(throws_message([&] { LoadGenerator g(s); }).find("load threads must be >= 0"),
            std::string::npos);
  s.threads = 1;
  s.duty = 0;
  EXPECT_NE(throws_message([&] { LoadGenerator g(s); }).find("load duty must be in (0, 1]"),
            std::string::npos);
}

}  // namespace
}  // namespace strata::parallel::dynpipe
