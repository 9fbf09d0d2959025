// A discrete-event model of SDPipe's M x N mesh (papers/sdpipe.md Sec. 2.2): the real group
// scheduler (group_scheduler.h) driven by simulated workers, to test its guarantees on many
// random delays in milliseconds and to reproduce the cross-stage deadlock of Fig. 3.
//
// Worker (j, i) (stage j of pipeline i) runs iterations k = 0 .. K - 1, one micro-batch each as in
// a flushed 1F1B step: its forward starts once its group sync of k - 1 is done and (j > 0) the
// forward of (j - 1, i) for k is done; its backward once its forward is done and (j < M - 1) the
// backward of (j + 1, i) for k is done. At the end of its backward it is READY; its group is
// decided by the scheduler, and the averaging lasts `average` seconds for a group of two or more.
// Delays come from the same seeded draws as --inject kind=straggler (parallel/runtime/injector.h):
// probability p per forward and per backward, `delay` seconds; and from a scripted function.
// A deadlock is the state where no event is left while some worker has not finished: every worker
// then waits for a peer or for a group.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "parallel/sdpipe/group_scheduler.h"
#include "parallel/sdpipe/sync_graph.h"

namespace strata::parallel::sdpipe {

struct MeshSimConfig {
  SchedulerConfig scheduler;  // stages and replicas are the mesh's
  int64_t iterations = 10;
  double forward = 0.010, backward = 0.020;  // seconds per iteration, every worker
  double average = 0.002;                    // a group sync of 2 or more
  double p = 0.0, delay = 0.0;               // straggler draws
  uint64_t seed = 0;
  // Extra seconds for (stage, replica, iteration, backward?) on top of the draws (may be empty).
  std::function<double(int, int, int64_t, bool)> extra;
};

struct MeshSimResult {
  bool deadlock = false;
  double time = 0.0;  // when the last worker finished (or the deadlock)
  std::vector<Group> groups;
  std::vector<TraceEvent> trace;  // the (arrival, group) trace, as --sync-trace writes it
  // At a deadlock: one line per worker that had not finished, saying what it waited for.
  std::vector<std::string> blocked;
  int64_t enforcement_waits = 0, skipped_validations = 0;
};

MeshSimResult simulate_mesh(const MeshSimConfig& config);

}  // namespace strata::parallel::sdpipe
