// The co-location load generator and the /proc counters of DynPipe's data set
// (parallel/dynpipe/colocation.h): the load's threads run and are named, the counters are read
// and in range, and bad settings are refused. No timed assertions: whether a load slows a layer is
// what `strata profile --colocation` measures, not what a unit test may assume on a shared machine.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "engine/check.h"
#include "parallel/dynpipe/colocation.h"

namespace strata::parallel::dynpipe {
namespace {

std::string throws_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "(no error)";
}

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
    CounterWindow window(load.thread_ids());
    while (load.busy_periods() < 4) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const CpuCounters c = window.finish();
    load.stop();
    EXPECT_GE(load.busy_periods(), 4u);
    EXPECT_EQ(load.thread_ids().size(), 2u);
    EXPECT_NE(load.thread_ids()[0], load.thread_ids()[1]);
    EXPECT_GE(c.cpu_util_mean, 0.0);
    EXPECT_LE(c.cpu_util_mean, c.cpu_util_max);
    EXPECT_LE(c.cpu_util_max, 1.0);
    EXPECT_GE(c.procs_running, 0.0);
    EXPECT_GE(c.ctxt_per_s, 0.0);
    EXPECT_EQ(counter_values(c).size(), counter_names().size());
  }
  EXPECT_EQ(describe_load({}), "none");
  LoadSpec m;
  m.threads = 3;
  m.duty = 0.25;
  m.memory = true;
  EXPECT_EQ(describe_load(m), "3 memory threads at 25%");
}

TEST(DynPipeColocation, CountersOverAWindowAreRates) {
  CpuSnapshot a, b;
  a.cores = {{10, 100}, {50, 100}};
  b.cores = {{60, 200}, {150, 200}};  // cores busy 50% and 100% of the window
  a.context_switches = 1000;
  b.context_switches = 3000;
  a.voluntary = 5;
  b.voluntary = 25;
  a.involuntary = 2;
  b.involuntary = 4;
  a.seconds = 1.0;
  b.seconds = 3.0;
  const CpuCounters c = counters_between(a, b, 2.5);
  EXPECT_DOUBLE_EQ(c.cpu_util_mean, 0.75);
  EXPECT_DOUBLE_EQ(c.cpu_util_max, 1.0);
  EXPECT_DOUBLE_EQ(c.procs_running, 2.5);
  EXPECT_DOUBLE_EQ(c.ctxt_per_s, 1000.0);
  EXPECT_DOUBLE_EQ(c.voluntary_cs_per_s, 10.0);
  EXPECT_DOUBLE_EQ(c.involuntary_cs_per_s, 1.0);
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
