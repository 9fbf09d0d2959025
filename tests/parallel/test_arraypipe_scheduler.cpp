// ArrayPipe's JAPSP scheduler against the test vectors of papers/arraypipe.md §5 (TV1-TV5),
// exhaustive search, the validator's constraints and a discrete-event replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "engine/check.h"
#include "parallel/arraypipe/branch_and_bound.h"
#include "parallel/arraypipe/genetic.h"
#include "parallel/arraypipe/instance.h"
#include "parallel/arraypipe/replay.h"
#include "parallel/arraypipe/scheduler.h"

namespace strata::parallel::arraypipe {
namespace {

Instance tv1() { return make_instance({{1, 1}, {2, 2}}, {{2, 2}, {4, 4}}); }
Instance tv2() { return make_instance({{1, 1}, {2, 2}, {3, 3}}, {{2, 2}, {4, 4}, {6, 6}}); }
Instance tv3() { return make_instance({{2, 1}, {1, 3}, {3, 2}}, {{4, 2}, {2, 6}, {6, 4}}); }
Instance tv4(int jobs, int stages) {
  return make_instance(std::vector<std::vector<double>>(jobs, std::vector<double>(stages, 1.0)),
                       std::vector<std::vector<double>>(jobs, std::vector<double>(stages, 2.0)));
}
Instance tv5() {
  Instance in = tv2();
  for (int j = 0; j < in.jobs(); ++j) {
    for (int s = 0; s < in.stages(); ++s) in.at(j, s).switch_cost = 1;
  }
  return in;
}

// The optimum over every operation sequence (semi-active decode covers every device order).
double brute_force(const Instance& in) {
  std::vector<int> seq;
  for (int j = 0; j < in.jobs(); ++j) seq.insert(seq.end(), in.operations_per_job(), j);
  double best = 1e300;
  do {
    best = std::min(best, decode_makespan(in, seq));
  } while (std::next_permutation(seq.begin(), seq.end()));
  return best;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "no error";
}

// TV1's optimal schedule as the note lists it.
TimedSchedule tv1_optimal(const Instance& in) {
  TimedSchedule t;
  t.graph.device_order = {{{0, true}, {1, true}, {0, false}, {1, false}},
                          {{0, true}, {0, false}, {1, true}, {1, false}}};
  // [job * 4 + op]: op 0 F s1, 1 F s2, 2 B s2, 3 B s1
  t.start = {0, 1, 2, 4, 1, 4, 6, 10};
  (void)in;
  return t;
}

TEST(ArrayPipeScheduler, TestVectorsOptimumByBranchAndBoundAndBruteForce) {
  struct Case {
    const char* name;
    Instance in;
    double optimum, gpipe, serial;
  };
  for (const Case& c : {Case{"TV1", tv1(), 14, 15, 18}, Case{"TV2", tv2(), 23, 27, 36},
                        Case{"TV3", tv3(), 21, 26, 36}}) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(brute_force(c.in), c.optimum);
    const BnbResult r = branch_and_bound(c.in);
    EXPECT_EQ(r.makespan, c.optimum);
    EXPECT_TRUE(r.proven_optimal);
    EXPECT_GE(r.dive_makespan, c.optimum);
    EXPECT_LE(r.root_lower_bound, c.optimum);
    validate_schedule(c.in, r.schedule);
    EXPECT_EQ(makespan(c.in, gpipe_schedule(c.in)), c.gpipe);
    EXPECT_EQ(makespan(c.in, serial_schedule(c.in)), c.serial);
  }
}

TEST(ArrayPipeScheduler, IdenticalJobsReduceToTheGpipeFormula) {
  for (auto [n, stages] : {std::pair{2, 2}, std::pair{3, 2}, std::pair{2, 3}}) {
    const Instance in = tv4(n, stages);
    const double formula = (n + stages - 1) * (1.0 + 2.0);
    EXPECT_EQ(brute_force(in), formula) << n << " jobs, " << stages << " stages";
    EXPECT_EQ(branch_and_bound(in).makespan, formula) << n << " jobs, " << stages << " stages";
    EXPECT_EQ(makespan(in, gpipe_schedule(in)), formula);
  }
}

TEST(ArrayPipeScheduler, SwitchCostAfterEveryBlockGives29) {
  const Instance in = tv5();
  EXPECT_EQ(brute_force(in), 29);
  const BnbResult r = branch_and_bound(in);
  EXPECT_EQ(r.makespan, 29);
  EXPECT_TRUE(r.proven_optimal);
}

Instance random_instance(std::mt19937_64& rng, int jobs, int stages, bool overheads) {
  std::uniform_real_distribution<double> compute(0.5, 4.0), extra(0.0, 1.0);
  std::vector<BlockTimes> times;
  for (int i = 0; i < jobs * stages; ++i) {
    BlockTimes t;
    t.forward = compute(rng);
    t.backward = 2 * compute(rng);
    if (overheads) {
      t.recompute = extra(rng);
      t.update = extra(rng);
      t.switch_cost = extra(rng);
      t.send_forward = extra(rng);
      t.send_backward = extra(rng);
    }
    times.push_back(t);
  }
  return Instance(jobs, stages, times);
}

TEST(ArrayPipeScheduler, BranchAndBoundEqualsBruteForceWithOverheads) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 8; ++trial) {
    Instance in = random_instance(rng, trial % 2 ? 3 : 2, trial % 2 ? 2 : 3, true);
    if (trial >= 4) {  // identical jobs: the search breaks their symmetry
      for (int s = 0; s < in.stages(); ++s) in.at(1, s) = in.at(0, s);
    }
    const double exact = brute_force(in);
    const BnbResult r = branch_and_bound(in);
    EXPECT_NEAR(r.makespan, exact, 1e-9) << "trial " << trial;
    EXPECT_LE(r.root_lower_bound, exact + 1e-9);
    EXPECT_LE(exact, makespan(in, fifo_schedule(in)) + 1e-9);
  }
}

TEST(ArrayPipeScheduler, GeneticAlgorithmWithinOneOfTheOptimum) {
  struct Case {
    Instance in;
    double optimum;
  };
  for (const Case& c : {Case{tv1(), 14}, Case{tv2(), 23}, Case{tv3(), 21}, Case{tv5(), 29}}) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      GaOptions o;
      o.population = 50;
      o.generations = 100;
      o.seed = seed;
      const GaResult r = genetic_schedule(c.in, o);
      EXPECT_LE(r.makespan, c.optimum + 1) << "seed " << seed;
      EXPECT_GE(r.makespan, c.optimum);
      validate_schedule(c.in, r.schedule);
      EXPECT_EQ(r.generations_run, 100);
      for (size_t g = 1; g < r.best_per_generation.size(); ++g) {
        EXPECT_LE(r.best_per_generation[g], r.best_per_generation[g - 1]);
      }
    }
  }
}

TEST(ArrayPipeScheduler, ActiveDecodingGeneticAlgorithmWithinOneOfTheOptimum) {
  struct Case {
    Instance in;
    double optimum;
  };
  for (const Case& c : {Case{tv1(), 14}, Case{tv2(), 23}, Case{tv3(), 21}, Case{tv5(), 29}}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      GaOptions o;
      o.population = 50;
      o.generations = 100;
      o.seed = seed;
      o.decoding = GaDecoding::kActive;
      const GaResult r = genetic_schedule(c.in, o);
      EXPECT_LE(r.makespan, c.optimum + 1) << "seed " << seed;
      validate_schedule(c.in, r.schedule);
      EXPECT_EQ(decode_makespan(c.in, r.sequence), r.makespan);
    }
  }
  // The active decoding of any chromosome is a schedule of the same operations.
  std::mt19937_64 rng(13);
  const Instance in = random_instance(rng, 5, 3, true);
  for (int trial = 0; trial < 20; ++trial) {
    const auto chromosome = random_sequence(5, in.operations_per_job(), &rng);
    auto active = active_sequence(in, chromosome);
    validate_schedule(in, decode(in, active));
    std::sort(active.begin(), active.end());
    auto sorted = chromosome;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(active, sorted);
  }
}

TEST(ArrayPipeScheduler, GeneticAlgorithmIsDeterministicForASeed) {
  GaOptions o;
  o.population = 20;
  o.generations = 30;
  o.seed = 42;
  std::mt19937_64 rng(3);
  const Instance in = random_instance(rng, 6, 4, true);
  EXPECT_EQ(genetic_schedule(in, o).sequence, genetic_schedule(in, o).sequence);
}

TEST(ArrayPipeScheduler, CrossoverAndMutationKeepEveryJobsOperations) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 50; ++trial) {
    const auto a = random_sequence(5, 6, &rng);
    const auto b = random_sequence(5, 6, &rng);
    std::vector<bool> set(5);
    for (int j = 0; j < 5; ++j) set[j] = rng() % 2;
    auto child = pox_crossover(a, b, set);
    for (size_t i = 0; i < a.size(); ++i) {
      if (set[a[i]]) {
        EXPECT_EQ(child[i], a[i]);  // the kept jobs stay in place
      }
    }
    swap_mutation(&child, &rng);
    auto sorted = child;
    std::sort(sorted.begin(), sorted.end());
    auto expected = a;
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(sorted, expected);
  }
}

TEST(ArrayPipeScheduler, EvaluatorEqualsTheReplayedEndTime) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 40; ++trial) {
    const int jobs = 1 + static_cast<int>(rng() % 6);
    const int stages = 1 + static_cast<int>(rng() % 5);
    const Instance in = random_instance(rng, jobs, stages, trial % 4 != 0);
    const auto seq = random_sequence(jobs, in.operations_per_job(), &rng);
    const TimedSchedule decoded = decode(in, seq);
    validate_schedule(in, decoded);
    const TimedSchedule evaluated = evaluate(in, decoded.graph);
    const double t = makespan(in, evaluated);
    EXPECT_DOUBLE_EQ(t, decode_makespan(in, seq));
    const ReplayResult sim = replay(in, decoded.graph);
    ASSERT_FALSE(sim.deadlocked) << "trial " << trial;
    EXPECT_NEAR(sim.end_time, t, 1e-9 * t) << "trial " << trial;
    EXPECT_GE(sim.devices_idle + 1e-9, sim.end_time);
    for (size_t i = 0; i < sim.start.size(); ++i)
      EXPECT_NEAR(sim.start[i], evaluated.start[i], 1e-9);
    for (const TimedSchedule& base : {fifo_schedule(in), gpipe_schedule(in), serial_schedule(in)}) {
      validate_schedule(in, base);
      EXPECT_NEAR(replay(in, base.graph).end_time, makespan(in, evaluate(in, base.graph)),
                  1e-9 * t);
    }
  }
}

TEST(ArrayPipeScheduler, ValidatorAcceptsTheNotesScheduleAndRejectsEachConstraint) {
  const Instance in = tv1();
  const TimedSchedule ok = tv1_optimal(in);
  validate_schedule(in, ok);
  EXPECT_EQ(makespan(in, ok), 14);
  auto with_start = [&](int job, int op, double e) {
    TimedSchedule t = ok;
    t.start[job * 4 + op] = e;
    return error_of([&] { validate_schedule(in, t); });
  };
  EXPECT_NE(with_start(1, 1, 2.5).find("(5) forward stage order"), std::string::npos);
  EXPECT_NE(with_start(0, 3, 3).find("(6) backward stage order"), std::string::npos);
  EXPECT_NE(with_start(0, 2, 1.5).find("(7) backward after forward"), std::string::npos);
  EXPECT_NE(with_start(1, 0, 0.5).find("(8) device exclusivity on stage 0"), std::string::npos);
  EXPECT_NE(with_start(1, 1, 3.5).find("(9) device exclusivity on stage 1"), std::string::npos);
  EXPECT_NE(with_start(0, 0, -1).find("job 0 forward on stage 0 starts at -1"), std::string::npos);
  TimedSchedule missing = ok;
  missing.graph.device_order[1].pop_back();
  EXPECT_NE(
      error_of([&] { validate_schedule(in, missing); }).find("stage 1 never runs job 1's backward"),
      std::string::npos);
  TimedSchedule twice = ok;
  twice.graph.device_order[0][1] = Block{0, true};
  EXPECT_NE(error_of([&] { validate_schedule(in, twice); }).find("lists job 0's forward twice"),
            std::string::npos);
  // Device orders that contradict the jobs' own order cannot be evaluated.
  TaskGraph cycle = ok.graph;
  std::swap(cycle.device_order[0][0], cycle.device_order[0][2]);  // A's backward before its forward
  EXPECT_NE(error_of([&] { evaluate(in, cycle); })
                .find("deadlocks: the device orders contradict the jobs' stage order (stage 0's "
                      "next block is job 0 backward on stage 0 but the job is still at job 0 "
                      "forward on stage 0"),
            std::string::npos);
  EXPECT_TRUE(replay(in, cycle).deadlocked);
}

TEST(ArrayPipeScheduler, InstanceErrorsNameTheBlock) {
  EXPECT_NE(error_of([] {
              make_instance({{1, 0}}, {{1, 1}});
            }).find("job 0 stage 1: forward time is 0"),
            std::string::npos);
  Instance in = tv1();
  in.at(1, 0).switch_cost = -1;
  EXPECT_NE(error_of([&] { validate_instance(in); }).find("job 1 stage 0: switch time is -1"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              make_instance({{1, 1}, {1}}, {{1, 1}, {1}});
            }).find("job 1 has 1"),
            std::string::npos);
}

TEST(ArrayPipeScheduler, CommunicationTimesFollowServerPlacement) {
  Instance in = tv4(1, 3);
  set_communication_times(&in, {{100, 200}}, {0, 0, 1}, /*inter=*/10, /*intra=*/100);
  EXPECT_EQ(in.at(0, 0).send_forward, 1);  // same server: 100 / 100
  EXPECT_EQ(in.at(0, 1).send_backward, 1);
  EXPECT_EQ(in.at(0, 1).send_forward, 20);  // across servers: 200 / 10
  EXPECT_EQ(in.at(0, 2).send_backward, 20);
}

TEST(ArrayPipeScheduler, ZeroStallPrefetchConditionPerServer) {
  Instance in = tv2();  // forward times 1, 2, 3 on both stages
  in.at(0, 0).send_forward = 0.25;
  std::string why;
  // One server: the largest job swaps 2 + 2 bytes at 8 bytes/unit = 0.5 <= 1 - 0.25.
  EXPECT_TRUE(zero_stall_prefetch(in, {{1, 1}, {2, 2}, {1, 1}}, {0, 0}, 8, &why));
  // 4 + 4 bytes: 1 > 0.75.
  EXPECT_FALSE(zero_stall_prefetch(in, {{1, 1}, {4, 4}, {1, 1}}, {0, 0}, 8, &why));
  EXPECT_NE(why.find("server 0: swapping its stages' block states takes 1 but the shortest"),
            std::string::npos)
      << why;
  // The same states on two servers: each swaps one stage's (0.5), within both servers' blocks.
  EXPECT_TRUE(zero_stall_prefetch(in, {{1, 1}, {4, 4}, {1, 1}}, {0, 1}, 8));
  EXPECT_NE(error_of([&] {
              zero_stall_prefetch(in, {{1, 1}}, {0, 0}, 8);
            }).find("block-state sizes for every job"),
            std::string::npos);
}

TEST(ArrayPipeScheduler, SelectionLimitsAndRescheduling) {
  EXPECT_EQ(parse_scheduler_kind("gpipe"), SchedulerKind::kGpipe);
  EXPECT_EQ(parse_ga_decoding("active"), GaDecoding::kActive);
  EXPECT_NE(error_of([] { parse_ga_decoding("lazy"); }).find("valid: semi-active, active"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_scheduler_kind("1f1b"); }).find("valid: bnb, ga"),
            std::string::npos);
  std::mt19937_64 rng(9);
  const Instance big = random_instance(rng, 8, 3, true);
  BnbOptions small;
  small.max_jobs = 5;
  EXPECT_NE(error_of([&] { branch_and_bound(big, small); }).find("more than the B&B limit 5"),
            std::string::npos);
  BnbOptions cut;
  cut.max_nodes = 50;
  const BnbResult r = branch_and_bound(big, cut);
  EXPECT_FALSE(r.proven_optimal);
  validate_schedule(big, r.schedule);

  SchedulerOptions o;
  o.bnb_max_jobs = 5;
  o.ga.population = 20;
  o.ga.generations = 10;
  const ScheduleResult s = schedule_array(big, o);
  EXPECT_EQ(s.algorithm, "ga (8 jobs > bnb max 5)");
  EXPECT_LE(s.makespan, makespan(big, fifo_schedule(big)));  // seeded with FIFO

  const Rescheduled rest = reschedule_without(tv2(), 1, o.ga);
  EXPECT_EQ(rest.instance.jobs(), 2);
  EXPECT_EQ(rest.instance.at(1, 0).forward, 3);  // job C moved down
  validate_schedule(rest.instance, rest.result.schedule);
}

}  // namespace
}  // namespace strata::parallel::arraypipe
