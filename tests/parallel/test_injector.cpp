// --inject: the shared syntax, the seeded straggler draws and the trace replay's file checks
// (papers/sdpipe.md Sec. 5 item 12).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <thread>

#include "engine/cuda_runtime.h"
#include "engine/gpu_stress.h"
#include "parallel/runtime/injector.h"
#include "testing/require_gpu.h"
#include "testing/testing.h"

namespace strata::parallel {
namespace {

void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no strata::Error thrown";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const std::string& n : needles) {
      EXPECT_NE(what.find(n), std::string::npos) << "'" << n << "' not in: " << what;
    }
  }
}

TEST(Inject, ParsesSpecsAndCommonKeys) {
  const std::vector<InjectSpec> specs = parse_inject(
      " kind=straggler, p=0.1 ,delay=0.3 ; kind=straggler,p=1,delay=0.5,rank=3,"
      "from=4,to=6,op=backward,seed=9;");
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].kind, "straggler");
  EXPECT_DOUBLE_EQ(specs[0].number("p", 0), 0.1);
  EXPECT_DOUBLE_EQ(specs[0].number("delay", 0), 0.3);
  EXPECT_EQ(specs[0].rank, -1);
  EXPECT_TRUE(specs[0].applies(5, 1));
  EXPECT_EQ(specs[1].rank, 3);
  EXPECT_FALSE(specs[1].applies(3, 3));
  EXPECT_TRUE(specs[1].applies(3, 4));
  EXPECT_TRUE(specs[1].applies(3, 6));
  EXPECT_FALSE(specs[1].applies(3, 7));
  EXPECT_FALSE(specs[1].applies(2, 5));
  EXPECT_TRUE(parse_inject("").empty());
}

TEST(Inject, RefusesBadSpecsNamingTheFlag) {
  for (const auto& [text, words] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"p=0.1,delay=0.3", {"--inject", "no kind="}},
           {"kind=crash", {"--inject", "unknown kind crash", "straggler"}},
           {"kind=straggler,p=0.1", {"--inject", "p= and delay="}},
           {"kind=straggler,p=2,delay=1", {"--inject", "p must be in [0, 1]"}},
           {"kind=straggler,p=0.1,delay=-1", {"--inject", "delay must be >= 0"}},
           {"kind=straggler,p=x,delay=1", {"--inject", "p=x is not a number"}},
           {"kind=straggler,p=0.1,delay=1,threads=2", {"--inject", "takes no key threads"}},
           {"kind=straggler,p=0.1,delay=1,rank=a", {"--inject", "rank=a is not an integer"}},
           {"kind=straggler,p=0.1,delay=1,from=5,to=2", {"--inject", "from <= to"}},
           {"kind=straggler,p=0.1,p=0.2,delay=1", {"--inject", "p is given twice"}},
           {"kind=straggler,p=0.1,delay=1,op=sideways", {"--inject", "op must be"}},
           {"kind=trace", {"--inject", "needs file="}},
           {"kind", {"--inject", "expected key=value"}}}) {
    expect_error([&] { parse_inject(text); }, words);
  }
}

// The empirical rate of sleeps is about p, and the draws depend on the seed and the
// (rank, step, micro-batch, instruction) only.
TEST(Inject, StragglerDrawsAreSeededAtRateP) {
  for (double p : {0.05, 0.1, 0.5}) {
    int64_t hits = 0, n = 0;
    for (int rank = 0; rank < 4; ++rank) {
      for (int64_t step = 0; step < 2000; ++step) {
        for (OpCode op : {OpCode::kForward, OpCode::kBackward}) {
          hits += Injector::uniform(42, rank, step, step * 2, op) < p ? 1 : 0;
          ++n;
        }
      }
    }
    const double rate = static_cast<double>(hits) / n;
    EXPECT_NEAR(rate, p, 4 * std::sqrt(p * (1 - p) / n)) << "p = " << p;
  }
  EXPECT_EQ(Injector::uniform(1, 2, 3, 4, OpCode::kForward),
            Injector::uniform(1, 2, 3, 4, OpCode::kForward));
  EXPECT_NE(Injector::uniform(1, 2, 3, 4, OpCode::kForward),
            Injector::uniform(2, 2, 3, 4, OpCode::kForward));
  EXPECT_NE(Injector::uniform(1, 2, 3, 4, OpCode::kForward),
            Injector::uniform(1, 2, 3, 4, OpCode::kBackward));
}

// An injector sleeps where its draws say, the same in two runs, only on its rank and steps.
TEST(Inject, InjectorSleepsReproducibly) {
  const auto specs = parse_inject("kind=straggler,p=0.3,delay=0.001,rank=1,from=2,to=40");
  auto run = [&](int rank) {
    Injector injector(specs, rank, 4, 7);
    std::vector<int64_t> slept;
    for (int64_t step = 0; step < 50; ++step) {
      const int64_t before = injector.stats().injected;
      injector.before(OpCode::kForward, step, step);
      injector.before(OpCode::kBackward, step, step);
      injector.before(OpCode::kRecvAct, step, step);  // not drawn
      slept.push_back(injector.stats().injected - before);
    }
    return std::make_pair(slept, injector.stats());
  };
  const auto [a, stats] = run(1);
  const auto [b, ignored] = run(1);
  EXPECT_EQ(a, b);
  EXPECT_EQ(stats.draws, 2 * 39);  // steps 2..40 counted from 1
  EXPECT_GT(stats.injected, 5);
  EXPECT_NEAR(stats.seconds, 0.001 * stats.injected, 1e-9);
  EXPECT_EQ(a[0], 0);   // step 1: before `from`
  EXPECT_EQ(a[45], 0);  // step 46: after `to`
  EXPECT_EQ(run(2).second.draws, 0);
  expect_error([&] { Injector(parse_inject("kind=straggler,p=1,delay=0,rank=9"), 0, 4, 0); },
               {"--inject", "rank 9", "4 ranks"});
}

// op=iteration (the paper's "at every iteration"): one draw per step, before the rank's first
// Forward of it, whatever the number of micro-batches; p = 1 sleeps once per step.
TEST(Inject, IterationDrawsOncePerStep) {
  Injector injector(parse_inject("kind=straggler,p=1,delay=0.0001,op=iteration"), 0, 2, 5);
  for (int64_t step = 0; step < 6; ++step) {
    for (int64_t mb = 0; mb < 4; ++mb) injector.before(OpCode::kForward, step, mb);
    for (int64_t mb = 0; mb < 4; ++mb) injector.before(OpCode::kBackward, step, mb);
  }
  EXPECT_EQ(injector.stats().draws, 6);
  EXPECT_EQ(injector.stats().injected, 6);
  // At p = 0.5 over many steps: about half the steps, and only the iteration draw counts.
  Injector half(parse_inject("kind=straggler,p=0.5,delay=1e-6,op=iteration"), 1, 2, 5);
  for (int64_t step = 0; step < 400; ++step) {
    half.before(OpCode::kForward, step, 2 * step);
    half.before(OpCode::kForward, step, 2 * step + 1);
  }
  EXPECT_EQ(half.stats().draws, 400);
  EXPECT_NEAR(static_cast<double>(half.stats().injected), 200.0, 4 * std::sqrt(100.0));
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Inject, TraceFilesAreReadAndCheckedNamingTheLine) {
  const std::string good = write_file("trace_good.txt",
                                      "# rank seconds fraction\n"
                                      "1 0.5 0.25\n"
                                      "\n"
                                      "1 0.0 1.0   # full speed first\n"
                                      "3 2 0.5\n");
  const SlowdownTrace t = read_slowdown_trace(good, 4);
  EXPECT_DOUBLE_EQ(t.fraction(1, 0.1), 1.0);
  EXPECT_DOUBLE_EQ(t.fraction(1, 0.6), 0.25);
  EXPECT_DOUBLE_EQ(t.fraction(3, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(t.fraction(3, 3.0), 0.5);
  EXPECT_DOUBLE_EQ(t.fraction(0, 3.0), 1.0);
  expect_error([&] { read_slowdown_trace(write_file("trace_rank.txt", "0 0 1\n4 1.0 0.5\n"), 4); },
               {"--inject trace file", "line 2", "rank 4", "outside the 4 ranks"});
  expect_error([&] { read_slowdown_trace(write_file("trace_time.txt", "# c\n1 -2 0.5\n"), 4); },
               {"line 2", "time -2", "out of range"});
  expect_error([&] { read_slowdown_trace(write_file("trace_frac.txt", "1 1 1.5\n"), 4); },
               {"line 1", "fraction 1.5", "out of range"});
  expect_error([&] { read_slowdown_trace(write_file("trace_words.txt", "1 1\n"), 4); },
               {"line 1", "expected \"rank seconds fraction\""});
  expect_error([&] { read_slowdown_trace("/nonexistent/trace", 4); },
               {"/nonexistent/trace", "cannot open"});
}

// Replay: after each instruction the rank sleeps (1/fraction - 1) times its duration.
TEST(Inject, TraceReplaySleepsByTheFraction) {
  const std::string path = write_file("trace_replay.txt", "0 0 0.5\n");
  Injector injector(parse_inject("kind=trace,file=" + path), 0, 1, 0);
  injector.start();
  const auto start = std::chrono::steady_clock::now();
  injector.after(OpCode::kForward, 0, 0, 0.02);
  const double slept =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(slept, 0.02);
  EXPECT_NEAR(injector.stats().seconds, 0.02, 1e-9);
  Injector other(parse_inject("kind=trace,file=" + path), 1, 2, 0);  // rank 1: not listed
  other.after(OpCode::kForward, 0, 0, 0.02);
  EXPECT_EQ(other.stats().injected, 0);
}

TEST(Inject, LoadSlowAndGrowParseAndRefuseBadKeys) {
  const std::vector<InjectSpec> specs = parse_inject(
      "rank=1,from=20,kind=load,threads=2; kind=slow,factor=2,rank=0; "
      "kind=grow,layers=h.0-h.3,from=30");
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].kind, "load");
  EXPECT_EQ(specs[0].from, 20);
  EXPECT_DOUBLE_EQ(specs[1].number("factor", 0), 2.0);
  EXPECT_EQ(specs[2].string("layers", ""), "h.0-h.3");
  const std::vector<InjectSpec> fail = parse_inject("rank=1,kind=fail,how=exit,at=migration");
  ASSERT_EQ(fail.size(), 1u);
  EXPECT_EQ(fail[0].rank, 1);
  EXPECT_EQ(fail[0].string("how", ""), "exit");
  // Only the failing rank's injector fails (the CLI test runs it: CheckpointCli).
  EXPECT_TRUE(Injector(fail, 1, 2, 0).fails());
  EXPECT_FALSE(Injector(fail, 0, 2, 0).fails());
  for (const auto& [text, words] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"kind=load,threads=0", {"--inject", "threads must be in 1..256"}},
           {"kind=load,threads=x", {"--inject", "threads=x is not an integer"}},
           {"kind=load,p=1", {"--inject", "kind=load takes no key p"}},
           {"kind=slow", {"--inject", "kind=slow needs factor="}},
           {"kind=slow,factor=0.5", {"--inject", "factor must be in [1, 1000]"}},
           {"kind=grow,factor=2", {"--inject", "kind=grow needs layers="}},
           {"kind=grow,layers=a,rank=1", {"--inject", "takes no rank="}},
           {"kind=fail", {"--inject", "kind=fail needs rank="}},
           {"kind=fail,rank=1,how=crash", {"--inject", "how must be stall or exit"}},
           {"kind=fail,rank=1,at=epoch", {"--inject", "at must be step or migration"}},
           {"kind=fail,rank=1,factor=2", {"--inject", "kind=fail takes no key factor"}},
       }) {
    SCOPED_TRACE(text);
    expect_error([&] { parse_inject(text); }, words);
  }
  const std::vector<std::string> names{"embed", "h.0", "h.1", "h.2", "h.3", "head"};
  EXPECT_EQ(inject_layer_range(specs[2], names), std::make_pair(size_t{1}, size_t{5}));
  EXPECT_EQ(inject_layer_range(parse_inject("kind=grow,layers=head")[0], names),
            std::make_pair(size_t{5}, size_t{6}));
  expect_error([&] { inject_layer_range(parse_inject("kind=grow,layers=h.0-h.9")[0], names); },
               {"--inject", "h.9"});
  expect_error([&] { inject_layer_range(parse_inject("kind=grow,layers=h.3-h.1")[0], names); },
               {"--inject", "empty"});
  expect_error([&] { Injector(parse_inject("kind=load;kind=load,threads=2"), 0, 1, 0); },
               {"--inject", "already has a kind=load spec"});
}

// slow: after each layer the rank sleeps (factor - 1) x the layer's time, from its step on and
// only on its rank.
TEST(Inject, SlowSleepsFactorMinusOneTimesEachLayer) {
  Injector injector(parse_inject("kind=slow,factor=3,rank=0,from=2"), 0, 2, 0);
  ASSERT_TRUE(injector.per_layer());
  injector.after_layer(0, false, 0, 0.01);  // step 1: before from
  EXPECT_EQ(injector.stats().injected, 0);
  const auto start = std::chrono::steady_clock::now();
  injector.after_layer(0, false, 1, 0.01);
  injector.after_layer(3, true, 1, 0.005);
  const double slept =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(slept, 0.03);
  EXPECT_EQ(injector.stats().injected, 2);
  EXPECT_GE(injector.stats().slow_seconds, 0.03);
  EXPECT_EQ(injector.stats().seconds, injector.stats().slow_seconds);
  // Short layers owe their sleep until it reaches 1 ms: 4 x 2^-12 s owed, the 5th pays.
  Injector fine(parse_inject("kind=slow,factor=2"), 0, 1, 0);
  for (int k = 0; k < 4; ++k) fine.after_layer(5, false, 0, 0x1p-12);
  EXPECT_EQ(fine.stats().injected, 0);
  fine.after_layer(5, true, 0, 0x1p-12);
  EXPECT_EQ(fine.stats().injected, 1);
  EXPECT_GE(fine.stats().slow_seconds, 5 * 0x1p-12);
  Injector other(parse_inject("kind=slow,factor=3,rank=0"), 1, 2, 0);
  EXPECT_FALSE(other.per_layer());  // nothing applies to rank 1
  EXPECT_FALSE(Injector(parse_inject("kind=straggler,p=1,delay=0"), 0, 1, 0).per_layer());
}

// Factors compound: two slow specs x2 and x3 on one rank make its layers last 6x (5x the
// layer's time slept), not 4x (their extra times added).
TEST(Inject, SlowFactorsOnOneRankMultiply) {
  Injector injector(parse_inject("kind=slow,factor=2,rank=0; kind=slow,factor=3,rank=0"), 0, 1, 0);
  const auto start = std::chrono::steady_clock::now();
  injector.after_layer(0, false, 0, 0.004);
  const double slept =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(slept, 0.02);
  EXPECT_GE(injector.stats().slow_seconds, 0.02);
  EXPECT_EQ(injector.stats().device_seconds, 0.0);
}

// device: a layer lasts factor x its CPU time (the rank sleeps the rest of it); a slow spec and,
// on the emulated device, a load multiply on top; a layer already longer owes nothing.
TEST(Inject, DeviceEmulatesLayersAsAFactorOfTheirCpuTime) {
  Injector device(parse_inject("kind=device,factor=8"), 1, 2, 0);
  ASSERT_TRUE(device.per_layer());
  // 1 ms of CPU in 2 ms of wall time: the layer is to last 8 ms, 6 ms slept. (Each call another
  // layer: a sleep's overshoot is credited to its layer's next one.)
  size_t layer = 0;
  auto slept = [&layer](Injector& inj, int64_t step, double wall, double cpu) {
    const double before = inj.stats().seconds;
    inj.after_layer_cpu(layer++, false, step, wall, cpu);
    return inj.stats().seconds - before;
  };
  const double plain = slept(device, 0, 0.002, 0.001);
  EXPECT_GE(plain, 0.006);
  EXPECT_LT(plain, 0.006 + 0.05);  // a sleep overshoots, not by this much on any machine
  EXPECT_EQ(device.stats().device_seconds, device.stats().seconds);
  // The wall time beyond the emulated time: nothing owed, nothing credited.
  EXPECT_EQ(slept(device, 0, 0.009, 0.001), 0.0);
  Injector both(parse_inject("kind=device,factor=8; rank=0,kind=slow,factor=3,from=2"), 0, 2, 0);
  EXPECT_GE(slept(both, 0, 0.002, 0.001), 0.006);  // step 1: device only
  // From step 2: 8 x 3 x 1 ms = 24 ms, 22 ms slept, split between the kinds by log factor.
  const double compounded = slept(both, 1, 0.002, 0.001);
  EXPECT_GE(compounded, 0.022);
  EXPECT_GT(both.stats().slow_seconds, 0.0);
  EXPECT_GT(both.stats().device_seconds, both.stats().slow_seconds);
  EXPECT_NEAR(both.stats().slow_seconds + both.stats().device_seconds, both.stats().seconds, 1e-9);
  // A load of 2 threads on an emulated device: x3 (8 x 3 x 1 ms = 24 ms).
  Injector loaded(parse_inject("kind=device,factor=8; rank=0,kind=load,threads=2,from=3"), 0, 1, 0);
  EXPECT_GE(slept(loaded, 0, 0.002, 0.001), 0.006);
  EXPECT_GE(slept(loaded, 2, 0.002, 0.001), 0.022);
  loaded.stop_load();
  // A load run by another component in the rank's process (the co-location profile's): the
  // same factor, 1 + threads x duty (2 threads at 100%: x3 as kind=load's; at 50%: x2).
  EXPECT_DOUBLE_EQ(Injector::device_load_factor(2, 1.0), 3.0);
  EXPECT_DOUBLE_EQ(Injector::device_load_factor(2, 0.5), 2.0);
  Injector profiled(parse_inject("kind=device,factor=8"), 0, 1, 0);
  profiled.set_colocated_load(2, 1.0);
  EXPECT_GE(slept(profiled, 0, 0.002, 0.001), 0.022);
  profiled.set_colocated_load(2, 0.5);  // 8 x 2 x 1 ms = 16 ms, 14 ms slept
  const double half = slept(profiled, 0, 0.002, 0.001);
  EXPECT_GE(half, 0.014);
  EXPECT_LT(half, 0.014 + 0.05);
  profiled.set_colocated_load(0, 1.0);  // none: the device alone again
  EXPECT_LT(slept(profiled, 0, 0.002, 0.001), 0.006 + 0.05);
  expect_error([&] { profiled.set_colocated_load(1, 0.0); }, {"duty in (0, 1]"});
  // Without a device spec a load is no factor (it acts through the cores).
  Injector slow_load(parse_inject("kind=slow,factor=2; kind=load,threads=1"), 0, 1, 0);
  EXPECT_LT(slept(slow_load, 0, 0.002, 0.002), 0.002 + 0.05);
  // The thread's CPU time is what after_layer measures: it advances with work.
  const double t0 = Injector::thread_cpu_seconds();
  volatile double x = 1;
  for (int i = 0; i < 2000000; ++i) x = x * 1.0000001 + 1e-9;
  EXPECT_GT(Injector::thread_cpu_seconds(), t0);
  expect_error([] { parse_inject("kind=device"); }, {"--inject", "kind=device needs factor="});
  expect_error([] { parse_inject("kind=device,factor=0.5"); }, {"factor must be in [1, 1000]"});
  expect_error([] { Injector(parse_inject("kind=device,factor=2;kind=device,factor=3"), 0, 1, 0); },
               {"--inject", "already has a kind=device spec"});
}

// grow: only the named layers, from their step on, on whichever rank runs them.
TEST(Inject, GrowSlowsOnlyItsLayers) {
  Injector injector(parse_inject("kind=grow,layers=h.0-h.1,from=3"), 1, 2, 0);
  injector.set_layer_names({"embed", "h.0", "h.1", "head"});
  injector.after_layer(1, false, 1, 0.01);  // step 2: not grown yet
  EXPECT_EQ(injector.stats().injected, 0);
  injector.after_layer(0, false, 2, 0.01);  // embed: not named
  injector.after_layer(3, true, 2, 0.01);   // head: not named
  EXPECT_EQ(injector.stats().injected, 0);
  injector.after_layer(1, false, 2, 0.004);  // factor 2 by default: sleeps the layer's time
  injector.after_layer(2, true, 5, 0.006);
  EXPECT_EQ(injector.stats().injected, 2);
  EXPECT_GE(injector.stats().grow_seconds, 0.01);
  EXPECT_EQ(injector.stats().slow_seconds, 0.0);
}

// load: threads that really run from the spec's first step to its last, then stop.
TEST(Inject, LoadThreadsRunFromTheirStepToTheirLast) {
  Injector injector(parse_inject("kind=load,threads=2,rank=0,from=2,to=3"), 0, 1, 0);
  EXPECT_FALSE(injector.per_layer());
  injector.before(OpCode::kForward, 0, 0);  // step 1
  EXPECT_EQ(injector.stats().load_threads, 0);
  injector.before(OpCode::kForward, 1, 0);  // step 2: started
  EXPECT_EQ(injector.stats().load_threads, 2);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (injector.load_rounds() < 4 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(injector.load_rounds(), 4) << "the load threads did no work";
  injector.before(OpCode::kBackward, 2, 0);  // step 3: still running
  EXPECT_EQ(injector.stats().load_seconds, 0.0);
  injector.before(OpCode::kForward, 3, 0);  // step 4: past `to`, stopped
  EXPECT_GT(injector.stats().load_seconds, 0.0);
  const int64_t rounds = injector.load_rounds();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(injector.load_rounds(), rounds) << "the load threads still run";
  injector.before(OpCode::kForward, 1, 0);  // an earlier step again: not restarted
  EXPECT_EQ(injector.load_rounds(), rounds);
  Injector other(parse_inject("kind=load,threads=2,rank=0"), 1, 2, 0);
  other.before(OpCode::kForward, 0, 0);
  EXPECT_EQ(other.stats().load_threads, 0);
}

// kind=load's GPU form: target= and streams= are checked, and a GPU load on a CPU rank is refused
// before training (Injector::set_device), naming the spec and the rank's device.
TEST(Inject, GpuLoadKeysAreCheckedAndACpuRankRefusesIt) {
  expect_error([] { parse_inject("kind=load,target=tpu"); }, {"target must be cpu, gpu or auto"});
  expect_error([] { parse_inject("kind=load,target=cpu,streams=2"); }, {"streams= is the GPU"});
  expect_error([] { parse_inject("kind=load,target=gpu,threads=2"); }, {"threads= is the CPU"});
  expect_error([] { parse_inject("kind=load,streams=0"); }, {"streams must be in 1..16"});
  EXPECT_EQ(parse_inject("kind=load,target=gpu,streams=3")[0].number("streams", 1), 3);
  Injector gpu(parse_inject("rank=0,kind=load,target=gpu"), 0, 1, 0);
  expect_error([&] { gpu.set_device(Device::cpu()); },
               {"--inject \"rank=0,kind=load,target=gpu\"", "rank 0 runs on cpu"});
  Injector streams(parse_inject("kind=load,streams=2"), 0, 1, 0);
  expect_error([&] { streams.set_device(Device::cpu()); },
               {"streams= is the GPU load's, but rank 0 runs on cpu"});
  Injector threads(parse_inject("kind=load,threads=2"), 0, 1, 0);
  expect_error([&] { threads.set_device(Device::cuda(0)); },
               {"threads= is the CPU load's, but rank 0 runs on cuda:0"});
  // target=auto on a CPU rank: the CPU threads, as before.
  Injector cpu(parse_inject("kind=load,threads=1"), 0, 1, 0);
  cpu.set_device(Device::cpu());
  cpu.before(OpCode::kForward, 0, 0);
  EXPECT_EQ(cpu.stats().load_threads, 1);
  EXPECT_EQ(cpu.stats().load_streams, 0);
  cpu.stop_load();
}

// Without a GPU the stress kernel cannot start, and says why.
TEST(Inject, GpuStressWithoutADeviceIsAnError) {
  if (strata::testing::why_no_cuda_device().empty()) GTEST_SKIP() << "this machine has a GPU";
  try {
    cuda::GpuStress stress(cuda::GpuStress::Options{});
    ADD_FAILURE() << "a GPU stress started without a device";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("no CUDA support") != std::string::npos ||
                what.find("cudaGetDeviceCount") != std::string::npos ||
                what.find("no device cuda:0") != std::string::npos)
        << what;
  }
}

// On a GPU rank kind=load runs stress kernels on the rank's GPU from its step to its last.
TEST(Inject, GpuLoadRunsStressKernelsOnTheRanksGpu) {
  STRATA_REQUIRE_CUDA();
  Injector injector(parse_inject("kind=load,streams=2,rank=0,from=2,to=2"), 0, 1, 0);
  injector.set_device(Device::cuda(0));
  injector.before(OpCode::kForward, 0, 0);  // step 1
  EXPECT_EQ(injector.stats().load_streams, 0);
  injector.before(OpCode::kForward, 1, 0);  // step 2: started
  EXPECT_EQ(injector.stats().load_streams, 2);
  EXPECT_EQ(injector.stats().load_threads, 0) << "a GPU rank's load spun CPU threads";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  injector.before(OpCode::kForward, 2, 0);  // step 3: past `to`, stopped
  EXPECT_GT(injector.stats().load_kernels, 0) << "no stress kernel finished in 200 ms";
  EXPECT_GT(injector.stats().load_seconds, 0.0);
  cuda::GpuStress::Options o;
  o.streams = 1;
  o.bytes = 1 << 20;
  cuda::GpuStress stress(o);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (stress.kernels() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stress.stop();
  stress.stop();  // idempotent
  EXPECT_GE(stress.kernels(), 3);
  EXPECT_STREQ(stress.error(), "");
}

}  // namespace
}  // namespace strata::parallel
