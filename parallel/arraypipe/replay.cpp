// Event-driven replay: a priority queue of timed events (a message arrives at a device, a device
// becomes idle). Each device keeps the set of inputs that have arrived and runs its next listed
// block once it holds that block's input and is idle.
#include "parallel/arraypipe/replay.h"

#include <algorithm>
#include <queue>
#include <set>
#include <utility>

#include "engine/check.h"

namespace strata::parallel::arraypipe {
namespace {

struct Event {
  double time = 0;
  long sequence = 0;  // FIFO among equal times
  int device = 0;
  bool arrival = false;  // an input arrives (else: the device becomes idle)
  Block input;           // the block whose input arrived
  bool operator>(const Event& other) const {
    return time != other.time ? time > other.time : sequence > other.sequence;
  }
};

}  // namespace

ReplayResult replay(const Instance& instance, const TaskGraph& graph) {
  const int stages = instance.stages();
  const int ops = instance.operations_per_job();
  STRATA_CHECK_EQ(static_cast<int>(graph.device_order.size()), stages)
      << "ArrayPipe replay: one block order per stage";
  ReplayResult result;
  result.start.assign(static_cast<size_t>(instance.jobs()) * ops, -1.0);

  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue;
  long sequence = 0;
  std::vector<std::set<std::pair<int, bool>>> arrived(stages);  // (job, forward) inputs present
  std::vector<size_t> position(stages, 0);
  std::vector<bool> busy(stages, false);
  // Every job's first forward has its input (the mini-batch) at time 0.
  for (int j = 0; j < instance.jobs(); ++j) queue.push(Event{0.0, sequence++, 0, true, {j, true}});

  auto try_start = [&](int s, double now) {
    if (busy[s] || position[s] >= graph.device_order[s].size()) return;
    const Block& b = graph.device_order[s][position[s]];
    auto it = arrived[s].find({b.job, b.forward});
    if (it == arrived[s].end()) return;
    arrived[s].erase(it);
    ++position[s];
    busy[s] = true;
    const int op = b.forward ? s : 2 * stages - 1 - s;
    result.start[static_cast<size_t>(b.job) * ops + op] = now;
    const BlockTimes& t = instance.at(b.job, s);
    if (b.forward) {
      queue.push(Event{now + t.forward + t.switch_cost, sequence++, s, false, b});
      if (s + 1 < stages) {
        queue.push(Event{now + t.forward + t.send_forward, sequence++, s + 1, true, {b.job, true}});
      } else {
        // The loss: the job's backward on the same device may start once the forward is done.
        queue.push(Event{now + t.forward, sequence++, s, true, {b.job, false}});
      }
    } else {
      const double compute_end = now + t.recompute + t.backward;
      const double idle = compute_end + t.update + t.switch_cost;
      queue.push(Event{idle, sequence++, s, false, b});
      if (s > 0) {
        queue.push(Event{compute_end + t.send_backward, sequence++, s - 1, true, {b.job, false}});
      } else {
        result.end_time = std::max(result.end_time, idle);
      }
    }
  };

  while (!queue.empty()) {
    const Event e = queue.top();
    queue.pop();
    ++result.events;
    if (e.arrival) {
      arrived[e.device].insert({e.input.job, e.input.forward});
    } else {
      busy[e.device] = false;
      result.devices_idle = std::max(result.devices_idle, e.time);
    }
    try_start(e.device, e.time);
  }
  for (int s = 0; s < stages; ++s) {
    if (position[s] < graph.device_order[s].size()) result.deadlocked = true;
  }
  return result;
}

}  // namespace strata::parallel::arraypipe
