// PLACEHOLDER: replaced by the real code.
#include "ops/lr_schedule.h"
#include "engine/check.h"

namespace strata::ops {

LrScheduleKind parse_lr_schedule(const std::string& name) {
  STRATA_THROW() << "not implemented yet";
}

const char* lr_schedule_name(LrScheduleKind kind) {
  STRATA_THROW() << "not implemented yet";
}

double LrSchedule::lr_at(int64_t step) const {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops
