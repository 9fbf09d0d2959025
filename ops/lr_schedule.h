// Learning-rate schedules: constant, step decay, cosine; each with an optional linear warm-up.
#pragma once

#include <cstdint>
#include <string>

namespace strata::ops {

enum class LrScheduleKind { kConstant, kStep, kCosine };

// Parses constant|step|cosine; throws strata::Error listing them otherwise.
LrScheduleKind parse_lr_schedule(const std::string& name);
const char* lr_schedule_name(LrScheduleKind kind);

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  double base_lr = 1e-3;
  int64_t warmup_steps = 0;  // lr = base_lr (step + 1) / warmup_steps for step < warmup_steps
  // step: lr = base_lr * gamma ^ floor((step - warmup_steps) / step_size)
  int64_t step_size = 1000;
  double gamma = 0.1;
  // cosine: lr = min_lr + (base_lr - min_lr) (1 + cos(pi p)) / 2,
  //         p = (step - warmup_steps) / (total_steps - warmup_steps), held at 1 past the end
  int64_t total_steps = 0;
  double min_lr = 0.0;

  // The learning rate of optimizer step `step` (counting from 0). Validates the fields (errors
  // name the field): base_lr finite and >= 0, warmup_steps >= 0; step: step_size > 0 and gamma
  // finite and > 0; cosine: total_steps > warmup_steps and 0 <= min_lr <= base_lr.
  double lr_at(int64_t step) const;
};

}  // namespace strata::ops
