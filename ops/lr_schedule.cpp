// Learning-rate schedules. Closed forms of the step index, so a resumed run needs nothing but
// the step: linear warm-up to base_lr, then constant, step decay (gamma ^ floor(k / step_size))
// or half a cosine period from base_lr down to min_lr (Loshchilov & Hutter 2017, SGDR, without
// restarts), where k counts the steps after warm-up.
#include "ops/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "engine/check.h"

namespace strata::ops {
namespace {

constexpr double kPi = 3.14159265358979323846;

}  // namespace

LrScheduleKind parse_lr_schedule(const std::string& name) {
  if (name == "constant") return LrScheduleKind::kConstant;
  if (name == "step") return LrScheduleKind::kStep;
  if (name == "cosine") return LrScheduleKind::kCosine;
  STRATA_THROW() << "unknown learning-rate schedule '" << name
                 << "'; valid schedules: constant, step, cosine";
}

const char* lr_schedule_name(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kConstant:
      return "constant";
    case LrScheduleKind::kStep:
      return "step";
    case LrScheduleKind::kCosine:
      return "cosine";
  }
  STRATA_THROW() << "lr_schedule_name: invalid LrScheduleKind " << static_cast<int>(kind);
}

double LrSchedule::lr_at(int64_t step) const {
  const char* name = lr_schedule_name(kind);
  STRATA_CHECK_GE(step, 0) << "lr_at: step counts from 0, got " << step;
  STRATA_CHECK(base_lr >= 0 && std::isfinite(base_lr))
      << name << " schedule: base_lr must be finite and >= 0, got " << base_lr;
  STRATA_CHECK_GE(warmup_steps, 0) << name << " schedule: warmup_steps must be >= 0";
  if (kind == LrScheduleKind::kStep) {
    STRATA_CHECK_GT(step_size, 0) << "step schedule: step_size must be > 0";
    STRATA_CHECK(gamma > 0 && std::isfinite(gamma))
        << "step schedule: gamma must be finite and > 0, got " << gamma;
  } else if (kind == LrScheduleKind::kCosine) {
    STRATA_CHECK_GT(total_steps, warmup_steps)
        << "cosine schedule: total_steps must be > warmup_steps";
    STRATA_CHECK(min_lr >= 0 && min_lr <= base_lr)
        << "cosine schedule: min_lr must be in [0, base_lr = " << base_lr << "], got " << min_lr;
  }

  if (step < warmup_steps) {
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  const int64_t k = step - warmup_steps;  // steps since the end of warm-up
  switch (kind) {
    case LrScheduleKind::kConstant:
      return base_lr;
    case LrScheduleKind::kStep:
      return base_lr * std::pow(gamma, static_cast<double>(k / step_size));
    case LrScheduleKind::kCosine: {
      const double p =
          std::min(1.0, static_cast<double>(k) / static_cast<double>(total_steps - warmup_steps));
      return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + std::cos(kPi * p));
    }
  }
  STRATA_THROW() << "lr_at: invalid LrScheduleKind " << static_cast<int>(kind);
}

}  // namespace strata::ops
