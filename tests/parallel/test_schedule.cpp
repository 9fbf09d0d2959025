// Pipeline schedules: every kind passes the checker over a grid of sizes, simulated makespans
// and bubbles match the closed forms, in-flight counts match each kind's bound, and the checker
// rejects hand-broken programs with a message naming the stage, instruction and violation.
#include "parallel/schedule/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "engine/check.h"

namespace strata::parallel {
namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B,
                                   ScheduleKind::kAsync1F1B};

// Index of `in` in `program`; fails the test when absent.
size_t index_of(const Program& program, Instruction in) {
  const auto it = std::find(program.begin(), program.end(), in);
  EXPECT_NE(it, program.end()) << to_string(in);
  return static_cast<size_t>(it - program.begin());
}

// The Forward/Backward sequence of a program as a string: "FFBFBB".
std::string compute_order(const Program& program) {
  std::string order;
  for (const Instruction& in : program) {
    if (in.op == OpCode::kForward) order += 'F';
    if (in.op == OpCode::kBackward) order += 'B';
  }
  return order;
}

void expect_error(const Schedule& schedule, const std::string& message) {
  const ScheduleCheck check = check_schedule(schedule);
  EXPECT_FALSE(check.ok);
  EXPECT_EQ(check.error, message);
}

TEST(Schedule, NamesParseAndPrint) {
  for (ScheduleKind kind : kKinds) EXPECT_EQ(parse_schedule(schedule_name(kind)), kind);
  EXPECT_TRUE(is_synchronous(ScheduleKind::kGPipe));
  EXPECT_TRUE(is_synchronous(ScheduleKind::k1F1B));
  EXPECT_FALSE(is_synchronous(ScheduleKind::kAsync1F1B));
  try {
    parse_schedule("zero-bubble");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown schedule 'zero-bubble' (valid: gpipe, 1f1b, "
                                         "async-1f1b, 2bw)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(to_string({OpCode::kForward, 3}), "Forward(mb 3)");
  EXPECT_EQ(to_string({OpCode::kSendGrad, 0}), "SendGrad(mb 0)");
  EXPECT_EQ(to_string({OpCode::kOptimizerStep, -1}), "OptimizerStep");
  EXPECT_THROW(make_schedule(ScheduleKind::k1F1B, 0, 4), Error);
  EXPECT_THROW(make_schedule(ScheduleKind::k1F1B, 2, 0), Error);
  EXPECT_THROW(theoretical_bubble_fraction(ScheduleKind::kGPipe, 2, 0), Error);
}

TEST(Schedule, EveryKindPassesTheCheckerForSmallSizes) {
  for (ScheduleKind kind : kKinds) {
    for (int S = 1; S <= 6; ++S) {
      for (int64_t M = 1; M <= 12; ++M) {
        const Schedule schedule = make_schedule(kind, S, M, 2);
        const ScheduleCheck check = check_schedule(schedule);
        EXPECT_TRUE(check.ok) << schedule_name(kind) << " S=" << S << " M=" << M << ": "
                              << check.error;
        EXPECT_TRUE(check.error.empty());
      }
    }
  }
}

TEST(Schedule, MakespanAndBubbleMatchTheClosedForm) {
  for (ScheduleKind kind : kKinds) {
    for (int S = 1; S <= 6; ++S) {
      for (int64_t M = 1; M <= 12; ++M) {
        const ScheduleCheck check = check_schedule(make_schedule(kind, S, M));
        ASSERT_TRUE(check.ok) << check.error;
        // (M + S - 1) * (forward 1 + backward 2), GroPipe Sec. 2.2 for a balanced pipeline.
        EXPECT_DOUBLE_EQ(check.makespan, 3.0 * (M + S - 1))
            << schedule_name(kind) << " S=" << S << " M=" << M;
        const double expected = (S - 1.0) / (M + S - 1.0);
        EXPECT_NEAR(check.bubble_fraction, expected, 1e-12);
        EXPECT_NEAR(theoretical_bubble_fraction(kind, S, M), expected, 1e-15);
      }
    }
  }
}

TEST(Schedule, InFlightCountsFollowEachKind) {
  for (int S = 1; S <= 6; ++S) {
    for (int64_t M = 1; M <= 12; ++M) {
      const ScheduleCheck gpipe = check_schedule(make_schedule(ScheduleKind::kGPipe, S, M));
      const ScheduleCheck one = check_schedule(make_schedule(ScheduleKind::k1F1B, S, M));
      const ScheduleCheck async = check_schedule(make_schedule(ScheduleKind::kAsync1F1B, S, M));
      for (int s = 0; s < S; ++s) {
        EXPECT_EQ(gpipe.max_in_flight[s], M);
        EXPECT_EQ(one.max_in_flight[s], std::min<int64_t>(S - s, M)) << "S=" << S << " s=" << s;
        EXPECT_EQ(async.max_in_flight[s], std::min<int64_t>(S - s, M));
      }
    }
  }
}

TEST(Schedule, MessagesSitNextToTheirCompute) {
  const int S = 4;
  const int64_t M = 6, step = 3;
  for (ScheduleKind kind : kKinds) {
    const Schedule schedule = make_schedule(kind, S, M, step);
    EXPECT_EQ(schedule.first_micro_batch, step * M);
    for (int s = 0; s < S; ++s) {
      const Program& p = schedule.programs[s];
      for (size_t k = 0; k < p.size(); ++k) {
        const Instruction& in = p[k];
        if (in.micro_batch != -1) {
          EXPECT_GE(in.micro_batch, step * M);
          EXPECT_LT(in.micro_batch, step * M + M);
        }
        const int64_t mb = in.micro_batch;
        if (in.op == OpCode::kForward && s > 0) {
          EXPECT_EQ(p[k - 1], (Instruction{OpCode::kRecvAct, mb}));
        }
        if (in.op == OpCode::kForward && s < S - 1) {
          EXPECT_EQ(p[k + 1], (Instruction{OpCode::kSendAct, mb}));
        }
        if (in.op == OpCode::kBackward && s < S - 1) {
          EXPECT_EQ(p[k - 1], (Instruction{OpCode::kRecvGrad, mb}));
        }
        if (in.op == OpCode::kBackward && s > 0) {
          EXPECT_EQ(p[k + 1], (Instruction{OpCode::kSendGrad, mb}));
        }
      }
      EXPECT_EQ(std::count_if(p.begin(), p.end(),
                              [](const Instruction& in) { return in.op == OpCode::kRecvAct; }),
                s > 0 ? M : 0);
    }
  }
}

TEST(Schedule, SynchronousKindsFlushOnceAtTheEnd) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    const Schedule schedule = make_schedule(kind, 3, 5);
    for (int s = 0; s < 3; ++s) {
      const Program& p = schedule.programs[s];
      ASSERT_GE(p.size(), 2u);
      EXPECT_EQ(p[p.size() - 2].op, OpCode::kReduceGrads);
      EXPECT_EQ(p.back().op, OpCode::kOptimizerStep);
    }
  }
  // Stage s of 1f1b: S - s - 1 warm-up forwards, alternation, then the cooldown backwards.
  const Schedule one = make_schedule(ScheduleKind::k1F1B, 3, 5);
  EXPECT_EQ(compute_order(one.programs[0]), "FFFBFBFBBB");
  EXPECT_EQ(compute_order(one.programs[1]), "FFBFBFBFBB");
  EXPECT_EQ(compute_order(one.programs[2]), "FBFBFBFBFB");
  EXPECT_EQ(compute_order(make_schedule(ScheduleKind::kGPipe, 3, 5).programs[1]), "FFFFFBBBBB");
}

TEST(Schedule, AsyncRunsAreSteady1F1BWithOneUpdatePerBackward) {
  for (int S = 1; S <= 5; ++S) {
    for (int64_t N : {1, 3, 8, 20}) {
      const Schedule schedule = make_schedule(ScheduleKind::kAsync1F1B, S, N);
      ASSERT_TRUE(check_schedule(schedule).ok);
      for (int s = 0; s < S; ++s) {
        const Program& p = schedule.programs[s];
        const int64_t warmup = std::min<int64_t>(S - s, N);
        // Warm-up forwards, then strict backward/forward alternation, then the drain.
        std::string expected(warmup, 'F');
        for (int64_t j = 0; j < N; ++j) expected += j + warmup < N ? "BF" : "B";
        EXPECT_EQ(compute_order(p), expected) << "S=" << S << " s=" << s << " N=" << N;
        int64_t updates = 0;
        for (size_t k = 0; k < p.size(); ++k) {
          if (p[k].op != OpCode::kBackward) continue;
          const size_t next = k + (s > 0 ? 2 : 1);
          ASSERT_LT(next + 1, p.size());
          EXPECT_EQ(p[next].op, OpCode::kReduceGrads);
          EXPECT_EQ(p[next + 1].op, OpCode::kOptimizerStep);
          ++updates;
        }
        EXPECT_EQ(updates, N);
        EXPECT_EQ(std::count(p.begin(), p.end(), Instruction{OpCode::kOptimizerStep, -1}), N);
      }
    }
  }
}

TEST(Schedule, GPipeMakespanFollowsTheLongestPathForUnequalStages) {
  // GroPipe Eq. 2-7: T = (M - 1) max_j t_j + sum_j t_j, for the forward wave and then the
  // backward wave (gpipe's backwards start when the last stage's forwards end).
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> cost(1, 9);
  for (int trial = 0; trial < 20; ++trial) {
    const int S = 1 + trial % 5;
    const int64_t M = 1 + trial % 7;
    std::vector<double> f(S), b(S);
    for (int s = 0; s < S; ++s) f[s] = cost(rng), b[s] = cost(rng);
    auto wave = [&](const std::vector<double>& t) {
      double sum = 0, top = 0;
      for (double x : t) sum += x, top = std::max(top, x);
      return (M - 1) * top + sum;
    };
    const Simulation sim = simulate_schedule(make_schedule(ScheduleKind::kGPipe, S, M), f, b);
    EXPECT_DOUBLE_EQ(sim.makespan, wave(f) + wave(b)) << "trial " << trial;
    double busy = 0;
    for (int s = 0; s < S; ++s) busy += M * (f[s] + b[s]);
    EXPECT_NEAR(sim.bubble_fraction, 1.0 - busy / (S * sim.makespan), 1e-12);
  }
  EXPECT_THROW(simulate_schedule(make_schedule(ScheduleKind::kGPipe, 2, 2), {1.0}, {2.0, 2.0}),
               Error);
}

// ---- hand-broken programs ----

TEST(ScheduleChecker, SwappedSendAndReceiveDeadlocks) {
  Schedule schedule = make_schedule(ScheduleKind::k1F1B, 2, 2);
  Program& p = schedule.programs[0];  // F0 SA0 F1 SA1 RG0 B0 RG1 B1 ReduceGrads OptimizerStep
  std::swap(p[index_of(p, {OpCode::kSendAct, 0})], p[index_of(p, {OpCode::kRecvGrad, 0})]);
  expect_error(schedule,
               "deadlock: no stage can proceed; stage 0, instruction 1 (RecvGrad(mb 0)) waits for "
               "stage 1, stage 1, instruction 0 (RecvAct(mb 0)) waits for stage 0");
}

TEST(ScheduleChecker, MissingReceiveLeavesASendUnmatched) {
  Schedule schedule = make_schedule(ScheduleKind::k1F1B, 3, 4);
  Program& p1 = schedule.programs[1];
  p1.erase(p1.begin() + index_of(p1, {OpCode::kRecvAct, 2}));
  const size_t send = index_of(schedule.programs[0], {OpCode::kSendAct, 2});
  expect_error(schedule, "stage 0, instruction " + std::to_string(send) +
                             " (SendAct(mb 2)) has no matching RecvAct(mb 2) on stage 1");
}

TEST(ScheduleChecker, MissingSendLeavesAReceiveUnmatched) {
  Schedule schedule = make_schedule(ScheduleKind::kGPipe, 3, 2);
  Program& p2 = schedule.programs[2];
  p2.erase(p2.begin() + index_of(p2, {OpCode::kSendGrad, 1}));
  const size_t recv = index_of(schedule.programs[1], {OpCode::kRecvGrad, 1});
  expect_error(schedule, "stage 1, instruction " + std::to_string(recv) +
                             " (RecvGrad(mb 1)) has no matching SendGrad(mb 1) on stage 2");
}

TEST(ScheduleChecker, BackwardBeforeItsForward) {
  Schedule schedule = make_schedule(ScheduleKind::kGPipe, 1, 2);  // F0 F1 B0 B1 ...
  Program& p = schedule.programs[0];
  std::rotate(p.begin(), p.begin() + 2, p.begin() + 3);  // B0 F0 F1 B1 ...
  expect_error(schedule,
               "stage 0: Backward(mb 0) at instruction 0 comes before its Forward(mb 0) at "
               "instruction 1");
}

TEST(ScheduleChecker, ReceiveAfterTheForwardThatNeedsIt) {
  Schedule schedule = make_schedule(ScheduleKind::k1F1B, 2, 3);
  Program& p = schedule.programs[1];  // RA0 F0 B0 SG0 ...
  std::swap(p[0], p[1]);
  expect_error(schedule,
               "stage 1: Forward(mb 0) at instruction 0 comes before its RecvAct(mb 0) at "
               "instruction 1");
}

TEST(ScheduleChecker, TooManyInFlight) {
  // 1f1b on stage 1, but stage 0 runs gpipe's order: four forwards before the first backward.
  Schedule schedule = make_schedule(ScheduleKind::k1F1B, 2, 4);
  schedule.programs[0] = make_schedule(ScheduleKind::kGPipe, 2, 4).programs[0];
  const size_t third = index_of(schedule.programs[0], {OpCode::kForward, 2});
  expect_error(schedule, "stage 0 has 3 micro-batches in flight after instruction " +
                             std::to_string(third) +
                             " (Forward(mb 2)); 1f1b allows at most S - s = 2");
  // async-1f1b with one warm-up forward too many on the last stage.
  Schedule async = make_schedule(ScheduleKind::kAsync1F1B, 2, 3);
  async.programs[1] = {
      {OpCode::kRecvAct, 0},        {OpCode::kForward, 0},  {OpCode::kRecvAct, 1},
      {OpCode::kForward, 1},        {OpCode::kBackward, 0}, {OpCode::kSendGrad, 0},
      {OpCode::kOptimizerStep, -1}, {OpCode::kBackward, 1}, {OpCode::kSendGrad, 1},
      {OpCode::kOptimizerStep, -1}, {OpCode::kRecvAct, 2},  {OpCode::kForward, 2},
      {OpCode::kBackward, 2},       {OpCode::kSendGrad, 2}, {OpCode::kOptimizerStep, -1}};
  const ScheduleCheck check = check_schedule(async);
  EXPECT_FALSE(check.ok);
  EXPECT_EQ(check.error,
            "stage 1 has 2 micro-batches in flight after instruction 3 (Forward(mb 1)); "
            "async-1f1b allows at most S - s = 1");
  EXPECT_EQ(check.max_in_flight, (std::vector<int64_t>{2, 2}));
}

TEST(ScheduleChecker, DuplicatedMicroBatch) {
  Schedule schedule = make_schedule(ScheduleKind::kGPipe, 1, 3);  // F0 F1 F2 B0 B1 B2 ...
  schedule.programs[0][2].micro_batch = 1;
  expect_error(schedule, "stage 0: Forward(mb 1) appears twice (instructions 1 and 2)");
}

TEST(ScheduleChecker, MissingMicroBatchAndWrongRange) {
  Schedule schedule = make_schedule(ScheduleKind::kGPipe, 1, 3, 1);  // micro-batches 3, 4, 5
  Program& p = schedule.programs[0];
  p.erase(p.begin() + index_of(p, {OpCode::kBackward, 4}));
  expect_error(schedule, "stage 0 never runs Backward(mb 4)");
  schedule = make_schedule(ScheduleKind::kGPipe, 1, 3, 1);
  schedule.programs[0][0].micro_batch = 6;
  expect_error(schedule,
               "stage 0, instruction 0 (Forward(mb 6)): micro-batch outside this schedule's "
               "range [3, 6)");
}

TEST(ScheduleChecker, MessagesBeyondTheEndsOfThePipeline) {
  Schedule schedule = make_schedule(ScheduleKind::kGPipe, 2, 1);
  schedule.programs[0].insert(schedule.programs[0].begin(), {OpCode::kRecvAct, 0});
  expect_error(schedule,
               "stage 0, instruction 0 (RecvAct(mb 0)): the first stage has no previous stage "
               "to talk to");
  schedule = make_schedule(ScheduleKind::kGPipe, 2, 1);
  schedule.programs[1].push_back({OpCode::kRecvGrad, 0});
  expect_error(schedule,
               "stage 1, instruction 6 (RecvGrad(mb 0)): the last stage has no next stage to "
               "talk to");
  schedule.programs.pop_back();
  expect_error(schedule, "schedule has 1 programs for 2 stages");
  schedule = make_schedule(ScheduleKind::kGPipe, 1, 1);
  schedule.programs[0][1].op = static_cast<OpCode>(9);
  expect_error(schedule, "stage 0, instruction 1: unknown opcode 9");
}

TEST(ScheduleChecker, UpdatesAsTheKindRequires) {
  Schedule schedule = make_schedule(ScheduleKind::k1F1B, 2, 2);
  schedule.programs[1].pop_back();  // no OptimizerStep
  expect_error(schedule,
               "stage 1: 1f1b must end the step with ReduceGrads then OptimizerStep (the flush), "
               "but the program ends with ReduceGrads");
  schedule = make_schedule(ScheduleKind::kGPipe, 1, 2);
  schedule.programs[0].insert(schedule.programs[0].begin() + 3, {OpCode::kOptimizerStep, -1});
  expect_error(schedule,
               "stage 0, instruction 3 (OptimizerStep): gpipe updates once, with ReduceGrads "
               "then OptimizerStep as the last two instructions of the step");

  Schedule async = make_schedule(ScheduleKind::kAsync1F1B, 2, 3);
  Program& p = async.programs[0];  // F0 SA0 F1 SA1 RG0 B0 ReduceGrads OptimizerStep ...
  const size_t b0 = index_of(p, {OpCode::kBackward, 0});
  p.erase(p.begin() + b0 + 1, p.begin() + b0 + 3);
  const size_t forward = index_of(p, {OpCode::kForward, 2});
  expect_error(async, "stage 0, instruction " + std::to_string(forward) +
                          " (Forward(mb 2)): async-1f1b needs ReduceGrads and OptimizerStep right "
                          "after Backward(mb 0)");
  async = make_schedule(ScheduleKind::kAsync1F1B, 1, 2);
  async.programs[0].insert(async.programs[0].begin(), {OpCode::kReduceGrads, -1});
  expect_error(async,
               "stage 0, instruction 0 (ReduceGrads): follows no Backward (one ReduceGrads per "
               "backward)");
  async = make_schedule(ScheduleKind::kAsync1F1B, 1, 2);
  async.programs[0].erase(async.programs[0].begin() + 2);  // B0's ReduceGrads
  expect_error(async,
               "stage 0, instruction 2 (OptimizerStep): needs a ReduceGrads right before it");
  async = make_schedule(ScheduleKind::kAsync1F1B, 1, 2);
  async.programs[0].pop_back();
  expect_error(async, "stage 0: the program ends without the OptimizerStep after Backward(mb 1)");
}

}  // namespace
}  // namespace strata::parallel
