// An emulated link's queue (the device's cost model, not a measured network): the logic of
// parallel/comm/shaped_comm.h, kept free of threads and clocks so that tests can drive it with
// virtual time.
//
// A link is one direction between two ranks, a single server that transmits one message at a
// time at `bytes_per_second` (a message of b bytes holds it b / rate seconds; a token bucket whose
// depth is one message). Messages are of two classes: the pipeline's training traffic
// (activations, gradients) and bulk traffic (a migration's state). With flow control
// (`priority`), a free link takes the oldest training message that waits, and a bulk message only
// when no training message waits (DynPipe §2.10, ../shared/papers/dynpipe.md: checkpoint traffic
// below training traffic, SO_PRIORITY's two queues); without it, the oldest message of either
// class (FIFO). Either way a message in transmission is never interrupted (non-preemptive, the
// discipline of Eq. 8), so a bulk message as large as a whole tensor holds training messages back
// for its whole transmission: chunks are what let them in between.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>

namespace strata::parallel {

enum class TrafficClass { kTraining, kBulk };

const char* traffic_class_name(TrafficClass c);

// The class of the messages this thread sends (kTraining unless a scope says otherwise): a
// migration's transfer thread and a re-layout mark theirs kBulk.
TrafficClass current_traffic_class();

class TrafficClassScope {
 public:
  explicit TrafficClassScope(TrafficClass c);
  ~TrafficClassScope();
  TrafficClassScope(const TrafficClassScope&) = delete;
  TrafficClassScope& operator=(const TrafficClassScope&) = delete;

 private:
  TrafficClass saved_;
};

// Eq. 8: the non-preemptive two-class priority M/M/1 queue (Poisson arrivals λ1 of training
// messages, λ2 of bulk ones, exponential service at rate μ): the mean number waiting of each
// class, Lq1 = λ1 ρ / (μ - λ1) and Lq2 = λ2 ρ / ((μ - λ1)(1 - ρ)) with ρ = (λ1 + λ2) / μ, and the
// mean waits Wq = Lq / λ (Little). DynPipe sizes the bulk queue at Lq2. Throws unless the rates
// are positive and ρ < 1 (no steady state otherwise).
struct PriorityQueueModel {
  double rho = 0.0;
  double lq_training = 0.0, lq_bulk = 0.0;
  double wq_training = 0.0, wq_bulk = 0.0;
};
PriorityQueueModel priority_queue_model(double lambda_training, double lambda_bulk, double mu);

struct LinkClassCounters {
  int64_t messages = 0;  // transmitted
  size_t bytes = 0;
  double wait_seconds = 0.0;      // summed: from arrival to the start of transmission
  double max_wait_seconds = 0.0;  // the longest of those
  double first_start = -1.0;      // the first transmission's start (-1: none)
  double last_finish = -1.0;      // the last one's end
};

class LinkQueue {
 public:
  LinkQueue(double bytes_per_second, bool priority);

  // A message of `bytes` arrives at time `now` (seconds, any origin, not decreasing across
  // calls); returns its id (0, 1, ... in arrival order).
  uint64_t push(size_t bytes, TrafficClass c, double now);

  struct Transmission {
    uint64_t id = 0;
    TrafficClass traffic = TrafficClass::kTraining;
    size_t bytes = 0;
    double start = 0.0, finish = 0.0;
  };
  // If the link is free at `now` (the last transmission has finished) and a message waits: the
  // one the discipline takes, transmitted from max(now, its arrival) for bytes / rate seconds.
  std::optional<Transmission> start(double now);

  bool empty() const { return training_.empty() && bulk_.empty(); }
  size_t waiting(TrafficClass c) const;
  double busy_until() const { return busy_until_; }
  double bytes_per_second() const { return rate_; }
  bool priority() const { return priority_; }
  const LinkClassCounters& counters(TrafficClass c) const;

 private:
  struct Waiting {
    uint64_t id;
    size_t bytes;
    double arrival;
  };
  double rate_;
  bool priority_;
  uint64_t next_id_ = 0;
  std::deque<Waiting> training_, bulk_;
  double busy_until_ = -1e300;
  LinkClassCounters counters_[2];
};

}  // namespace strata::parallel
