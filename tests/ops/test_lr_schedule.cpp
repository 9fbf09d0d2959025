#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "engine/check.h"
#include "ops/lr_schedule.h"

namespace strata {
namespace {

using ops::LrSchedule;
using ops::LrScheduleKind;

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

LrSchedule schedule(LrScheduleKind kind, double base_lr, int64_t warmup_steps) {
  LrSchedule s;
  s.kind = kind;
  s.base_lr = base_lr;
  s.warmup_steps = warmup_steps;
  return s;
}

TEST(LrSchedule, NamesRoundTrip) {
  for (LrScheduleKind k :
       {LrScheduleKind::kConstant, LrScheduleKind::kStep, LrScheduleKind::kCosine}) {
    EXPECT_EQ(ops::parse_lr_schedule(ops::lr_schedule_name(k)), k);
  }
  EXPECT_STREQ(ops::lr_schedule_name(LrScheduleKind::kCosine), "cosine");
  expect_error([] { ops::parse_lr_schedule("linear"); },
               {"'linear'", "constant", "step", "cosine"});
}

TEST(LrSchedule, ConstantWithLinearWarmup) {
  const LrSchedule s = schedule(LrScheduleKind::kConstant, 0.1, 4);
  // base_lr (step + 1) / 4 for steps 0..3, then base_lr.
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.025);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.05);
  EXPECT_DOUBLE_EQ(s.lr_at(2), 0.075);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(1000000), 0.1);
  EXPECT_DOUBLE_EQ(schedule(LrScheduleKind::kConstant, 0.3, 0).lr_at(0), 0.3);
}

TEST(LrSchedule, StepDecayCountsFromTheEndOfWarmup) {
  LrSchedule s = schedule(LrScheduleKind::kStep, 1.0, 2);
  s.step_size = 3;
  s.gamma = 0.5;
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.5);                           // warm-up 1/2
  EXPECT_DOUBLE_EQ(s.lr_at(1), 1.0);                           // warm-up 2/2
  EXPECT_DOUBLE_EQ(s.lr_at(2), 1.0);                           // k = 0
  EXPECT_DOUBLE_EQ(s.lr_at(4), 1.0);                           // k = 2
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.5);                           // k = 3: first decay
  EXPECT_DOUBLE_EQ(s.lr_at(8), 0.25);                          // k = 6
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.25);                         // k = 8
  EXPECT_DOUBLE_EQ(s.lr_at(11), 0.125);                        // k = 9
  LrSchedule plain = schedule(LrScheduleKind::kStep, 0.1, 0);  // defaults: 1000 steps, 0.1
  EXPECT_DOUBLE_EQ(plain.lr_at(999), 0.1);
  EXPECT_DOUBLE_EQ(plain.lr_at(1000), 0.01);
  EXPECT_DOUBLE_EQ(plain.lr_at(2500), 0.001);
}

TEST(LrSchedule, CosineFromBaseToMinAfterWarmup) {
  LrSchedule s = schedule(LrScheduleKind::kCosine, 1.0, 10);
  s.total_steps = 110;
  s.min_lr = 0.1;
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);   // warm-up 1/10
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.5);   // warm-up 5/10
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1.0);   // warm-up 10/10
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1.0);  // p = 0
  // p = 1/4: 0.1 + 0.9 (1 + cos(pi / 4)) / 2 = 0.1 + 0.9 * 0.8535533905932737.
  EXPECT_NEAR(s.lr_at(35), 0.8681980515339464, 1e-15);
  EXPECT_NEAR(s.lr_at(60), 0.55, 1e-15);  // p = 1/2
  // p = 3/4: 0.1 + 0.9 * 0.14644660940672624.
  EXPECT_NEAR(s.lr_at(85), 0.23180194846605362, 1e-15);
  EXPECT_NEAR(s.lr_at(110), 0.1, 1e-15);   // p = 1
  EXPECT_NEAR(s.lr_at(5000), 0.1, 1e-15);  // held at the end
  LrSchedule no_warmup = schedule(LrScheduleKind::kCosine, 0.2, 0);
  no_warmup.total_steps = 4;
  EXPECT_DOUBLE_EQ(no_warmup.lr_at(0), 0.2);
  EXPECT_NEAR(no_warmup.lr_at(2), 0.1, 1e-16);
  EXPECT_NEAR(no_warmup.lr_at(4), 0.0, 1e-16);
}

TEST(LrSchedule, ValidatesFieldsNamingThem) {
  LrSchedule cosine = schedule(LrScheduleKind::kCosine, 1.0, 10);
  cosine.total_steps = 10;
  expect_error([&] { cosine.lr_at(0); }, {"cosine", "total_steps", "warmup_steps"});
  cosine.total_steps = 20;
  cosine.min_lr = 2.0;
  expect_error([&] { cosine.lr_at(0); }, {"cosine", "min_lr"});
  LrSchedule step = schedule(LrScheduleKind::kStep, 1.0, 0);
  step.step_size = 0;
  expect_error([&] { step.lr_at(0); }, {"step schedule", "step_size"});
  step.step_size = 10;
  step.gamma = 0.0;
  expect_error([&] { step.lr_at(0); }, {"step schedule", "gamma"});
  expect_error([] { schedule(LrScheduleKind::kConstant, 1.0, -1).lr_at(0); },
               {"constant", "warmup_steps"});
  expect_error([] { schedule(LrScheduleKind::kConstant, -1.0, 0).lr_at(0); },
               {"constant", "base_lr"});
  expect_error([] { schedule(LrScheduleKind::kConstant, 1.0, 0).lr_at(-1); }, {"lr_at", "step"});
}

}  // namespace
}  // namespace strata
