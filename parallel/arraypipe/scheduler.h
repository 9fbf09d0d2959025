// The ArrayPipe scheduler's front (`--array-scheduler bnb|ga|fifo|gpipe|serial`) and the
// baselines it is compared with.
//
//   bnb     the paper's selection (§2.7): exact Branch and Bound for arrays of at most
//           bnb_max_jobs jobs (--array-bnb-max, default 30), the GA beyond; the result says which
//           one ran and whether the B&B proved its schedule optimal (it starts from the FIFO
//           schedule and stops at bnb_time_limit_s with the best one found).
//   ga      the genetic algorithm at any size (its first population holds the FIFO schedule).
//   fifo    every device runs the block that became ready first (non-delay list scheduling; ties
//           by job index).
//   gpipe   a fixed order on every device: all forwards in job order, then all backwards in job
//           order (GPipe's order with jobs for micro-batches).
//   serial  one job at a time (a job's first block waits until every device is done with the
//           previous job): running the jobs one after another on the same stages.
#pragma once

#include <string>
#include <vector>

#include "parallel/arraypipe/branch_and_bound.h"
#include "parallel/arraypipe/genetic.h"
#include "parallel/arraypipe/instance.h"

namespace strata::parallel::arraypipe {

enum class SchedulerKind { kBnb, kGa, kFifo, kGpipe, kSerial };

// "bnb" ... "serial"; anything else throws strata::Error listing the valid names.
SchedulerKind parse_scheduler_kind(const std::string& name);
const char* scheduler_name(SchedulerKind kind);

struct SchedulerOptions {
  SchedulerKind kind = SchedulerKind::kBnb;
  int bnb_max_jobs = 30;  // --array-bnb-max
  // The exact search is exponential: past about 5 jobs x 8 stages it rarely proves optimality in
  // seconds (tools/bench/arraypipe_sched_bench), so it stops here with the best schedule found
  // (ScheduleResult says so). 0: search until proven optimal.
  double bnb_time_limit_s = 10;
  GaOptions ga;
};

struct ScheduleResult {
  std::string algorithm;  // what ran: "bnb", "ga", "ga (25 jobs > bnb max 20)", "fifo", ...
  TimedSchedule schedule;
  double makespan = 0;          // Eq. 3
  bool proven_optimal = false;  // only B&B proves it
  double seconds = 0;
};

ScheduleResult schedule_array(const Instance& instance, const SchedulerOptions& options = {});

// Baselines (see the top of the file).
TimedSchedule fifo_schedule(const Instance& instance);
TimedSchedule gpipe_schedule(const Instance& instance);
TimedSchedule serial_schedule(const Instance& instance);
// The FIFO schedule as an operation sequence (decode() gives fifo_schedule()).
std::vector<int> fifo_sequence(const Instance& instance);

// A job left the array (ended early or diverged): the instance without it and a new schedule of
// the others from the GA, the paper's prompt rescheduling (§2.7). Jobs after `job` move down.
struct Rescheduled {
  Instance instance;
  ScheduleResult result;
};
Rescheduled reschedule_without(const Instance& instance, int job, const GaOptions& ga = {});

}  // namespace strata::parallel::arraypipe
