// Scheduler selection and the baselines. Every schedule is built as a TimedSchedule and checked
// by validate_schedule() before it is returned, so a baseline can never report a makespan of an
// infeasible schedule.
#include "parallel/arraypipe/scheduler.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <sstream>

#include "engine/check.h"

namespace strata::parallel::arraypipe {

SchedulerKind parse_scheduler_kind(const std::string& name) {
  for (SchedulerKind k : {SchedulerKind::kBnb, SchedulerKind::kGa, SchedulerKind::kFifo,
                          SchedulerKind::kGpipe, SchedulerKind::kSerial}) {
    if (name == scheduler_name(k)) return k;
  }
  STRATA_THROW() << "--array-scheduler: unknown scheduler '" << name
                 << "'; valid: bnb, ga, fifo, gpipe, serial";
}

const char* scheduler_name(SchedulerKind kind) {
  switch (kind) {
    case SchedulerKind::kBnb:
      return "bnb";
    case SchedulerKind::kGa:
      return "ga";
    case SchedulerKind::kFifo:
      return "fifo";
    case SchedulerKind::kGpipe:
      return "gpipe";
    case SchedulerKind::kSerial:
      return "serial";
  }
  return "?";
}

std::vector<int> fifo_sequence(const Instance& instance) {
  const int jobs = instance.jobs();
  const int ops = instance.operations_per_job();
  std::vector<int> next_op(jobs, 0);
  std::vector<double> job_ready(jobs, 0.0);
  std::vector<double> device_free(instance.stages(), 0.0);
  std::vector<int> sequence;
  sequence.reserve(static_cast<size_t>(jobs) * ops);
  for (int step = 0; step < jobs * ops; ++step) {
    // The block that can start first; among equal starts the one whose input arrived first.
    int pick = -1;
    double pick_start = std::numeric_limits<double>::infinity();
    for (int j = 0; j < jobs; ++j) {
      if (next_op[j] >= ops) continue;
      const double e = std::max(job_ready[j], device_free[instance.stage_of(next_op[j])]);
      if (e < pick_start || (e == pick_start && job_ready[j] < job_ready[pick])) {
        pick = j;
        pick_start = e;
      }
    }
    const int op = next_op[pick]++;
    device_free[instance.stage_of(op)] = pick_start + instance.occupancy(pick, op);
    job_ready[pick] = pick_start + instance.lag(pick, op);
    sequence.push_back(pick);
  }
  return sequence;
}

TimedSchedule fifo_schedule(const Instance& instance) {
  return decode(instance, fifo_sequence(instance));
}

TimedSchedule gpipe_schedule(const Instance& instance) {
  TaskGraph graph;
  graph.device_order.assign(instance.stages(), {});
  for (auto& order : graph.device_order) {
    for (int j = 0; j < instance.jobs(); ++j) order.push_back(Block{j, true});
    for (int j = 0; j < instance.jobs(); ++j) order.push_back(Block{j, false});
  }
  return evaluate(instance, graph);
}

TimedSchedule serial_schedule(const Instance& instance) {
  const int ops = instance.operations_per_job();
  TimedSchedule out;
  out.graph.device_order.assign(instance.stages(), {});
  out.start.assign(static_cast<size_t>(instance.jobs()) * ops, 0.0);
  std::vector<double> device_free(instance.stages(), 0.0);
  double all_free = 0;
  for (int j = 0; j < instance.jobs(); ++j) {
    double ready = all_free;
    for (int op = 0; op < ops; ++op) {
      const int s = instance.stage_of(op);
      const double e = std::max(ready, device_free[s]);
      out.start[static_cast<size_t>(j) * ops + op] = e;
      out.graph.device_order[s].push_back(Block{j, instance.is_forward(op)});
      device_free[s] = e + instance.occupancy(j, op);
      ready = e + instance.lag(j, op);
    }
    all_free = std::max(ready, *std::max_element(device_free.begin(), device_free.end()));
  }
  return out;
}

ScheduleResult schedule_array(const Instance& instance, const SchedulerOptions& options) {
  validate_instance(instance);
  const auto start = std::chrono::steady_clock::now();
  ScheduleResult result;
  SchedulerKind kind = options.kind;
  result.algorithm = scheduler_name(kind);
  if (kind == SchedulerKind::kBnb && instance.jobs() > options.bnb_max_jobs) {
    std::ostringstream s;
    s << "ga (" << instance.jobs() << " jobs > bnb max " << options.bnb_max_jobs << ")";
    result.algorithm = s.str();
    kind = SchedulerKind::kGa;
  }
  switch (kind) {
    case SchedulerKind::kBnb: {
      BnbOptions bnb;
      bnb.max_jobs = options.bnb_max_jobs;
      bnb.time_limit_s = options.bnb_time_limit_s;
      // The better baseline seeds the incumbent, so the search only looks for better schedules.
      const std::vector<int> fifo = fifo_sequence(instance);
      BnbResult r = branch_and_bound(instance, bnb, fifo);
      result.schedule = std::move(r.schedule);
      result.proven_optimal = r.proven_optimal;
      if (!r.proven_optimal) result.algorithm = "bnb (cut by the time limit)";
      break;
    }
    case SchedulerKind::kGa:
      result.schedule = genetic_schedule(instance, options.ga, {fifo_sequence(instance)}).schedule;
      break;
    case SchedulerKind::kFifo:
      result.schedule = fifo_schedule(instance);
      break;
    case SchedulerKind::kGpipe:
      result.schedule = gpipe_schedule(instance);
      break;
    case SchedulerKind::kSerial:
      result.schedule = serial_schedule(instance);
      break;
  }
  validate_schedule(instance, result.schedule);
  result.makespan = makespan(instance, result.schedule);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

Rescheduled reschedule_without(const Instance& instance, int job, const GaOptions& ga) {
  Rescheduled out{without_job(instance, job), {}};
  SchedulerOptions options;
  options.kind = SchedulerKind::kGa;
  options.ga = ga;
  out.result = schedule_array(out.instance, options);
  return out;
}

}  // namespace strata::parallel::arraypipe
