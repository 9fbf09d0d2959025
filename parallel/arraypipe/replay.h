// A discrete-event replay of an ArrayPipe task graph: the devices run their block lists as the
// runtime's executor would (a device starts its next block when it is idle and the block's input
// has arrived: the previous stage's activations, the next stage's gradients, or on the last stage
// the job's own forward), with messages in flight between devices. It shares no code with the
// evaluator of instance.h (an event queue instead of a relaxation over the orders), so a test can
// check that the evaluator's Eq. 3 equals the replayed end time.
#pragma once

#include <vector>

#include "parallel/arraypipe/instance.h"

namespace strata::parallel::arraypipe {

struct ReplayResult {
  bool deadlocked = false;    // some device waits forever for an input
  double end_time = 0;        // Eq. 3: when the last first-stage backward's update and switch end
  double devices_idle = 0;    // when every device has finished its last block's occupancy
  std::vector<double> start;  // [job * 2S + op], as TimedSchedule::start
  int events = 0;             // events processed
};

ReplayResult replay(const Instance& instance, const TaskGraph& graph);

}  // namespace strata::parallel::arraypipe
