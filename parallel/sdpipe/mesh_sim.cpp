// The mesh model: a priority queue of events (forward end, backward end, sync end, deadline) in
// time order, ties in the order they were queued; after every event each worker starts what its
// dependencies allow.
#include "parallel/sdpipe/mesh_sim.h"

#include <queue>

#include "engine/check.h"
#include "parallel/runtime/injector.h"

namespace strata::parallel::sdpipe {
namespace {

enum class Phase { kWaitForward, kForward, kWaitBackward, kBackward, kWaitGroup, kSync, kDone };
enum class EventKind { kForwardEnd, kBackwardEnd, kSyncEnd, kDeadline };

struct Event {
  double time;
  int64_t seq;
  EventKind kind;
  int stage, replica;
  bool operator>(const Event& o) const { return time != o.time ? time > o.time : seq > o.seq; }
};

struct Worker {
  Phase phase = Phase::kWaitForward;
  int64_t k = 0;                                  // current iteration
  int64_t forward_done = -1, backward_done = -1;  // last iteration done
};

}  // namespace

MeshSimResult simulate_mesh(const MeshSimConfig& config) {
  const int S = config.scheduler.stages, N = config.scheduler.replicas;
  const int64_t K = config.iterations;
  STRATA_CHECK(K >= 1) << "mesh sim: iterations must be >= 1";
  GroupScheduler scheduler(config.scheduler);
  MeshSimResult result;
  std::vector<Worker> workers(static_cast<size_t>(S) * N);
  auto at = [&](int j, int i) -> Worker& { return workers[static_cast<size_t>(i) * S + j]; };
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue;
  int64_t seq = 0;
  double now = 0.0, scheduled_deadline = -1.0;
  auto push = [&](double t, EventKind kind, int j, int i) { queue.push({t, seq++, kind, j, i}); };
  auto extra = [&](int j, int i, int64_t k, bool backward) {
    const OpCode op = backward ? OpCode::kBackward : OpCode::kForward;
    double d = 0.0;
    if (config.p > 0 && Injector::uniform(config.seed, i * S + j, k, 0, op) < config.p) {
      d += config.delay;
    }
    if (config.extra) d += config.extra(j, i, k, backward);
    return d;
  };
  auto handle = [&](const std::vector<Group>& groups) {
    for (const GroupScheduler::Hold& h : scheduler.take_holds()) {
      TraceEvent e;
      e.event = "hold";
      e.stage = h.stage;
      e.members = h.members;
      e.t = h.t;
      result.trace.push_back(e);
    }
    for (const Group& g : groups) {
      TraceEvent e;
      e.event = "group";
      e.stage = g.stage;
      e.clock = g.clock;
      e.members = g.members;
      e.iterations = g.iterations;
      e.check = group_check_name(g.check);
      e.t = g.closed;
      e.window = g.window;
      result.trace.push_back(e);
      result.groups.push_back(g);
      const double cost = g.members.size() > 1 ? config.average : 0.0;
      for (int i : g.members) {
        at(g.stage, i).phase = Phase::kSync;
        push(now + cost, EventKind::kSyncEnd, g.stage, i);
      }
    }
  };
  auto start_what_can = [&] {
    for (int i = 0; i < N; ++i) {
      for (int j = 0; j < S; ++j) {
        Worker& w = at(j, i);
        if (w.phase == Phase::kWaitForward && (j == 0 || at(j - 1, i).forward_done >= w.k)) {
          w.phase = Phase::kForward;
          push(now + config.forward + extra(j, i, w.k, false), EventKind::kForwardEnd, j, i);
        }
        if (w.phase == Phase::kWaitBackward && (j == S - 1 || at(j + 1, i).backward_done >= w.k)) {
          w.phase = Phase::kBackward;
          push(now + config.backward + extra(j, i, w.k, true), EventKind::kBackwardEnd, j, i);
        }
      }
    }
    const double d = scheduler.next_deadline();
    if (d < GroupScheduler::kInf && d != scheduled_deadline) {
      scheduled_deadline = d;
      push(std::max(d, now), EventKind::kDeadline, -1, -1);
    }
  };
  start_what_can();
  while (!queue.empty()) {
    const Event e = queue.top();
    queue.pop();
    now = e.time;
    switch (e.kind) {
      case EventKind::kForwardEnd: {
        Worker& w = at(e.stage, e.replica);
        w.forward_done = w.k;
        w.phase = Phase::kWaitBackward;
        break;
      }
      case EventKind::kBackwardEnd: {
        Worker& w = at(e.stage, e.replica);
        w.backward_done = w.k;
        w.phase = Phase::kWaitGroup;
        TraceEvent r;
        r.event = "ready";
        r.stage = e.stage;
        r.replica = e.replica;
        r.iteration = w.k;
        r.last = w.k == K - 1;
        r.t = now;
        result.trace.push_back(r);
        handle(scheduler.ready(e.stage, e.replica, w.k, w.k == K - 1, now));
        break;
      }
      case EventKind::kSyncEnd: {
        Worker& w = at(e.stage, e.replica);
        ++w.k;
        w.phase = w.k == K ? Phase::kDone : Phase::kWaitForward;
        break;
      }
      case EventKind::kDeadline:
        handle(scheduler.poll(now));
        break;
    }
    start_what_can();
  }
  result.time = now;
  result.enforcement_waits = scheduler.enforcement_waits();
  result.skipped_validations = scheduler.skipped_validations();
  for (int i = 0; i < N; ++i) {
    for (int j = 0; j < S; ++j) {
      const Worker& w = at(j, i);
      if (w.phase == Phase::kDone) continue;
      result.deadlock = true;
      std::string what = w.phase == Phase::kWaitGroup ? "its group (READY sent)"
                         : w.phase == Phase::kWaitForward
                             ? "the forward of stage " + std::to_string(j - 1)
                             : "the backward of stage " + std::to_string(j + 1);
      result.blocked.push_back("worker (stage " + std::to_string(j) + ", pipeline " +
                               std::to_string(i) + ") at iteration " + std::to_string(w.k) +
                               " waits for " + what);
    }
  }
  return result;
}

}  // namespace strata::parallel::sdpipe
