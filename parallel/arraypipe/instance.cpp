// JAPSP instance, validator, Eq. 3 and the semi-active evaluation of a task graph or of an
// operation sequence. Times are compared with a relative tolerance (kSlack) so that a schedule
// computed in floating point by one order of additions validates against another.
#include "parallel/arraypipe/instance.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "engine/check.h"

namespace strata::parallel::arraypipe {
namespace {

constexpr double kSlack = 1e-9;

bool before_or_at(double a, double b) { return a <= b + kSlack * std::max(1.0, std::fabs(b)); }

void check_time(double value, bool positive, int job, int stage, const char* what) {
  STRATA_CHECK(std::isfinite(value) && (positive ? value > 0 : value >= 0))
      << "ArrayPipe instance: job " << job << " stage " << stage << ": " << what << " is " << value
      << "; it must be finite and " << (positive ? "positive" : "not negative");
}

size_t index_of(const Instance& instance, int job, int op) {
  return static_cast<size_t>(job) * instance.operations_per_job() + op;
}

}  // namespace

Instance::Instance(int jobs, int stages, std::vector<BlockTimes> times)
    : jobs_(jobs), stages_(stages), times_(std::move(times)) {
  STRATA_CHECK(jobs > 0 && stages > 0)
      << "ArrayPipe instance: needs at least one job and one stage (got " << jobs << " jobs, "
      << stages << " stages)";
  STRATA_CHECK_EQ(times_.size(), static_cast<size_t>(jobs) * stages)
      << "ArrayPipe instance: one BlockTimes per (job, stage)";
}

const BlockTimes& Instance::at(int job, int stage) const {
  STRATA_CHECK(job >= 0 && job < jobs_ && stage >= 0 && stage < stages_)
      << "ArrayPipe instance: no block (job " << job << ", stage " << stage << ") in " << jobs_
      << " jobs x " << stages_ << " stages";
  return times_[static_cast<size_t>(job) * stages_ + stage];
}

BlockTimes& Instance::at(int job, int stage) {
  return const_cast<BlockTimes&>(static_cast<const Instance&>(*this).at(job, stage));
}

double Instance::occupancy(int job, int op) const {
  const BlockTimes& t = at(job, stage_of(op));
  if (is_forward(op)) return t.forward + t.switch_cost;        // Eq. 8
  return t.recompute + t.backward + t.update + t.switch_cost;  // Eq. 9
}

double Instance::lag(int job, int op) const {
  const int stage = stage_of(op);
  const BlockTimes& t = at(job, stage);
  if (is_forward(op)) {
    return stage + 1 < stages_ ? t.forward + t.send_forward  // Eq. 5
                               : t.forward;                  // Eq. 7 (corrected)
  }
  if (stage > 0) return t.recompute + t.backward + t.send_backward;  // Eq. 6
  return t.recompute + t.backward + t.update + t.switch_cost;        // Eq. 3
}

Instance make_instance(const std::vector<std::vector<double>>& forward,
                       const std::vector<std::vector<double>>& backward) {
  STRATA_CHECK(!forward.empty() && forward.size() == backward.size())
      << "ArrayPipe instance: forward times for " << forward.size()
      << " jobs and backward times for " << backward.size()
      << " jobs (need the same, at least one)";
  const int jobs = static_cast<int>(forward.size());
  const int stages = static_cast<int>(forward[0].size());
  std::vector<BlockTimes> times;
  times.reserve(static_cast<size_t>(jobs) * stages);
  for (int j = 0; j < jobs; ++j) {
    STRATA_CHECK(static_cast<int>(forward[j].size()) == stages &&
                 static_cast<int>(backward[j].size()) == stages)
        << "ArrayPipe instance: job " << j << " has " << forward[j].size() << " forward and "
        << backward[j].size() << " backward times; job 0 has " << stages << " stages";
    for (int s = 0; s < stages; ++s) {
      BlockTimes t;
      t.forward = forward[j][s];
      t.backward = backward[j][s];
      times.push_back(t);
    }
  }
  Instance instance(jobs, stages, std::move(times));
  validate_instance(instance);
  return instance;
}

void set_communication_times(Instance* instance,
                             const std::vector<std::vector<double>>& activation_bytes,
                             const std::vector<int>& server_of_stage, double bandwidth_inter,
                             double bandwidth_intra) {
  const int jobs = instance->jobs();
  const int stages = instance->stages();
  STRATA_CHECK(bandwidth_inter > 0 && bandwidth_intra > 0)
      << "ArrayPipe Eq. 1: bandwidths must be positive (inter " << bandwidth_inter << ", intra "
      << bandwidth_intra << ")";
  STRATA_CHECK_EQ(static_cast<int>(server_of_stage.size()), stages)
      << "ArrayPipe Eq. 1: one server per stage";
  STRATA_CHECK_EQ(static_cast<int>(activation_bytes.size()), jobs)
      << "ArrayPipe Eq. 1: activation sizes for every job";
  for (int j = 0; j < jobs; ++j) {
    STRATA_CHECK_EQ(static_cast<int>(activation_bytes[j].size()), stages - 1)
        << "ArrayPipe Eq. 1: job " << j << " needs one activation size per stage boundary";
    for (int s = 0; s + 1 < stages; ++s) {
      const double bytes = activation_bytes[j][s];
      STRATA_CHECK(std::isfinite(bytes) && bytes >= 0)
          << "ArrayPipe Eq. 1: job " << j << " activation size after stage " << s << " is "
          << bytes;
      const bool same_server = server_of_stage[s] == server_of_stage[s + 1];
      const double eta = bytes / (same_server ? bandwidth_intra : bandwidth_inter);
      instance->at(j, s).send_forward = eta;
      instance->at(j, s + 1).send_backward = eta;
    }
  }
}

bool zero_stall_prefetch(const Instance& instance,
                         const std::vector<std::vector<double>>& state_bytes,
                         const std::vector<int>& server_of_stage, double bandwidth_host,
                         std::string* why) {
  const int jobs = instance.jobs();
  const int stages = instance.stages();
  STRATA_CHECK(bandwidth_host > 0)
      << "ArrayPipe Eq. 2: the host bandwidth must be positive (got " << bandwidth_host << ")";
  STRATA_CHECK_EQ(static_cast<int>(server_of_stage.size()), stages)
      << "ArrayPipe Eq. 2: one server per stage";
  STRATA_CHECK_EQ(static_cast<int>(state_bytes.size()), jobs)
      << "ArrayPipe Eq. 2: block-state sizes for every job";
  for (int j = 0; j < jobs; ++j) {
    STRATA_CHECK_EQ(static_cast<int>(state_bytes[j].size()), stages)
        << "ArrayPipe Eq. 2: job " << j << " needs one block-state size per stage";
  }
  std::vector<int> servers = server_of_stage;
  std::sort(servers.begin(), servers.end());
  servers.erase(std::unique(servers.begin(), servers.end()), servers.end());
  for (int h : servers) {
    double swap = 0;
    double shortest = std::numeric_limits<double>::infinity();
    for (int j = 0; j < jobs; ++j) {
      double bytes = 0;
      for (int s = 0; s < stages; ++s) {
        if (server_of_stage[s] != h) continue;
        STRATA_CHECK(std::isfinite(state_bytes[j][s]) && state_bytes[j][s] >= 0)
            << "ArrayPipe Eq. 2: job " << j << " stage " << s << " block state of "
            << state_bytes[j][s] << " bytes";
        bytes += state_bytes[j][s];
        const BlockTimes& t = instance.at(j, s);
        shortest = std::min(shortest, t.forward - (s + 1 < stages ? t.send_forward : 0.0));
      }
      swap = std::max(swap, bytes / bandwidth_host);
    }
    if (swap > shortest) {
      if (why != nullptr) {
        std::ostringstream s;
        s << "server " << h << ": swapping its stages' block states takes " << swap
          << " but the shortest forward block there (less its send) takes " << shortest;
        *why = s.str();
      }
      return false;
    }
  }
  return true;
}

void validate_instance(const Instance& instance) {
  for (int j = 0; j < instance.jobs(); ++j) {
    for (int s = 0; s < instance.stages(); ++s) {
      const BlockTimes& t = instance.at(j, s);
      check_time(t.forward, true, j, s, "forward time");
      check_time(t.backward, true, j, s, "backward time");
      check_time(t.recompute, false, j, s, "recompute time");
      check_time(t.update, false, j, s, "update time");
      check_time(t.switch_cost, false, j, s, "switch time");
      check_time(t.send_forward, false, j, s, "forward send time");
      check_time(t.send_backward, false, j, s, "backward send time");
    }
  }
}

std::string block_name(const Instance& instance, int job, int op) {
  std::ostringstream s;
  s << "job " << job << (instance.is_forward(op) ? " forward" : " backward") << " on stage "
    << instance.stage_of(op);
  return s.str();
}

namespace {

// The operation of `block` on `stage`.
int op_of(const Instance& instance, int stage, const Block& block) {
  return block.forward ? stage : 2 * instance.stages() - 1 - stage;
}

void check_graph_shape(const Instance& instance, const TaskGraph& graph) {
  const int stages = instance.stages();
  const int jobs = instance.jobs();
  STRATA_CHECK_EQ(static_cast<int>(graph.device_order.size()), stages)
      << "ArrayPipe schedule: one block order per stage";
  for (int s = 0; s < stages; ++s) {
    std::vector<int> seen(static_cast<size_t>(jobs) * 2, 0);
    for (const Block& b : graph.device_order[s]) {
      STRATA_CHECK(b.job >= 0 && b.job < jobs) << "ArrayPipe schedule: stage " << s << " lists job "
                                               << b.job << " (the array has " << jobs << " jobs)";
      int& count = seen[static_cast<size_t>(b.job) * 2 + (b.forward ? 0 : 1)];
      STRATA_CHECK(++count == 1) << "ArrayPipe schedule: stage " << s << " lists job " << b.job
                                 << "'s " << (b.forward ? "forward" : "backward") << " twice";
    }
    for (int j = 0; j < jobs; ++j) {
      for (int d = 0; d < 2; ++d) {
        STRATA_CHECK(seen[static_cast<size_t>(j) * 2 + d] == 1)
            << "ArrayPipe schedule: stage " << s << " never runs job " << j << "'s "
            << (d == 0 ? "forward" : "backward");
      }
    }
  }
}

}  // namespace

void validate_schedule(const Instance& instance, const TimedSchedule& schedule) {
  check_graph_shape(instance, schedule.graph);
  const int ops = instance.operations_per_job();
  STRATA_CHECK_EQ(schedule.start.size(), static_cast<size_t>(instance.jobs()) * ops)
      << "ArrayPipe schedule: one start time per (job, operation)";
  for (int j = 0; j < instance.jobs(); ++j) {
    for (int k = 0; k < ops; ++k) {
      const double e = schedule.start_of(instance, j, k);
      STRATA_CHECK(std::isfinite(e) && e >= 0)
          << "ArrayPipe schedule: " << block_name(instance, j, k) << " starts at " << e;
    }
    // Eq. 5-7: each operation after the job's previous one, with its lag.
    for (int k = 1; k < ops; ++k) {
      const double ready = schedule.start_of(instance, j, k - 1) + instance.lag(j, k - 1);
      const double e = schedule.start_of(instance, j, k);
      const char* rule = k < instance.stages()    ? "(5) forward stage order"
                         : k == instance.stages() ? "(7) backward after forward on the last stage"
                                                  : "(6) backward stage order";
      STRATA_CHECK(before_or_at(ready, e))
          << "ArrayPipe schedule violates constraint " << rule << ": " << block_name(instance, j, k)
          << " starts at " << e << " but " << block_name(instance, j, k - 1) << " (start "
          << schedule.start_of(instance, j, k - 1) << ") lets it start at " << ready
          << " at the earliest";
    }
  }
  // Eq. 8, 9: a device's next block after the previous block's occupancy.
  for (int s = 0; s < instance.stages(); ++s) {
    const std::vector<Block>& order = schedule.graph.device_order[s];
    for (size_t i = 1; i < order.size(); ++i) {
      const int prev_op = op_of(instance, s, order[i - 1]);
      const int op = op_of(instance, s, order[i]);
      const double free_at = schedule.start_of(instance, order[i - 1].job, prev_op) +
                             instance.occupancy(order[i - 1].job, prev_op);
      const double e = schedule.start_of(instance, order[i].job, op);
      STRATA_CHECK(before_or_at(free_at, e))
          << "ArrayPipe schedule violates constraint " << (order[i - 1].forward ? "(8)" : "(9)")
          << " device exclusivity on stage " << s << ": " << block_name(instance, order[i].job, op)
          << " starts at " << e << " but " << block_name(instance, order[i - 1].job, prev_op)
          << ", the block before it on the device, holds the device until " << free_at;
    }
  }
}

double makespan(const Instance& instance, const TimedSchedule& schedule) {
  const int last = instance.operations_per_job() - 1;
  double t = 0;
  for (int j = 0; j < instance.jobs(); ++j) {
    t = std::max(t, schedule.start_of(instance, j, last) + instance.lag(j, last));  // Eq. 3
  }
  return t;
}

TimedSchedule evaluate(const Instance& instance, const TaskGraph& graph) {
  check_graph_shape(instance, graph);
  const int jobs = instance.jobs();
  const int stages = instance.stages();
  const int ops = instance.operations_per_job();
  TimedSchedule out;
  out.graph = graph;
  out.start.assign(static_cast<size_t>(jobs) * ops, 0.0);
  std::vector<int> next_op(jobs, 0);         // the job's next unscheduled operation
  std::vector<double> job_ready(jobs, 0.0);  // when it may start
  std::vector<size_t> position(stages, 0);   // the device's next block
  std::vector<double> device_free(stages, 0.0);
  int remaining = jobs * ops;
  while (remaining > 0) {
    bool progress = false;
    for (int s = 0; s < stages; ++s) {
      // Run the device's blocks in order as long as their job has reached them.
      while (position[s] < graph.device_order[s].size()) {
        const Block& b = graph.device_order[s][position[s]];
        const int op = op_of(instance, s, b);
        if (next_op[b.job] != op) break;
        const double e = std::max(job_ready[b.job], device_free[s]);
        out.start[index_of(instance, b.job, op)] = e;
        device_free[s] = e + instance.occupancy(b.job, op);
        job_ready[b.job] = e + instance.lag(b.job, op);
        ++next_op[b.job];
        ++position[s];
        --remaining;
        progress = true;
      }
    }
    if (!progress) {
      std::ostringstream stuck;
      for (int s = 0; s < stages; ++s) {
        if (position[s] >= graph.device_order[s].size()) continue;  // this device is done
        const Block& b = graph.device_order[s][position[s]];
        stuck << (stuck.tellp() > 0 ? "; " : "") << "stage " << s << "'s next block is "
              << block_name(instance, b.job, op_of(instance, s, b)) << " but the job is still at "
              << block_name(instance, b.job, next_op[b.job]);
      }
      STRATA_THROW() << "ArrayPipe schedule deadlocks: the device orders contradict the jobs' "
                        "stage order ("
                     << stuck.str() << ")";
    }
  }
  return out;
}

namespace {

void check_sequence(const Instance& instance, const std::vector<int>& sequence) {
  const int ops = instance.operations_per_job();
  STRATA_CHECK_EQ(sequence.size(), static_cast<size_t>(instance.jobs()) * ops)
      << "ArrayPipe sequence: each of the " << instance.jobs() << " jobs must appear " << ops
      << " times";
  std::vector<int> count(instance.jobs(), 0);
  for (int j : sequence) {
    STRATA_CHECK(j >= 0 && j < instance.jobs())
        << "ArrayPipe sequence: job " << j << " is not in the array of " << instance.jobs();
    STRATA_CHECK(++count[j] <= ops)
        << "ArrayPipe sequence: job " << j << " appears more than " << ops << " times";
  }
}

}  // namespace

TimedSchedule decode(const Instance& instance, const std::vector<int>& sequence) {
  check_sequence(instance, sequence);
  const int ops = instance.operations_per_job();
  TimedSchedule out;
  out.graph.device_order.assign(instance.stages(), {});
  out.start.assign(sequence.size(), 0.0);
  std::vector<int> next_op(instance.jobs(), 0);
  std::vector<double> job_ready(instance.jobs(), 0.0);
  std::vector<double> device_free(instance.stages(), 0.0);
  for (int j : sequence) {
    const int op = next_op[j]++;
    const int s = instance.stage_of(op);
    const double e = std::max(job_ready[j], device_free[s]);
    out.start[static_cast<size_t>(j) * ops + op] = e;
    out.graph.device_order[s].push_back(Block{j, instance.is_forward(op)});
    device_free[s] = e + instance.occupancy(j, op);
    job_ready[j] = e + instance.lag(j, op);
  }
  return out;
}

double decode_makespan(const Instance& instance, const std::vector<int>& sequence) {
  check_sequence(instance, sequence);
  const int jobs = instance.jobs();
  std::vector<int> next_op(jobs, 0);
  std::vector<double> job_ready(jobs, 0.0);
  std::vector<double> device_free(instance.stages(), 0.0);
  for (int j : sequence) {
    const int op = next_op[j]++;
    const int s = instance.stage_of(op);
    const double e = std::max(job_ready[j], device_free[s]);
    device_free[s] = e + instance.occupancy(j, op);
    job_ready[j] = e + instance.lag(j, op);
  }
  // After the last operation job_ready is its end per Eq. 3.
  return *std::max_element(job_ready.begin(), job_ready.end());
}

Instance without_job(const Instance& instance, int job) {
  STRATA_CHECK(job >= 0 && job < instance.jobs())
      << "ArrayPipe: cannot remove job " << job << " from an array of " << instance.jobs();
  STRATA_CHECK_GT(instance.jobs(), 1) << "ArrayPipe: cannot remove the array's only job";
  std::vector<BlockTimes> times;
  for (int j = 0; j < instance.jobs(); ++j) {
    if (j == job) continue;
    for (int s = 0; s < instance.stages(); ++s) times.push_back(instance.at(j, s));
  }
  return Instance(instance.jobs() - 1, instance.stages(), std::move(times));
}

}  // namespace strata::parallel::arraypipe
