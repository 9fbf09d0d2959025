// SDPipe's group scheduler, the policy alone (papers/sdpipe.md Sec. 2.4-2.7): it is told when each
// replica of each stage becomes ready and decides the groups, on a clock it is given (seconds), so
// the same code runs in the service on rank 0 (parallel/sdpipe/scheduler_service.h), in the mesh
// simulator (mesh_sim.h) and in tests with scripted arrival times.
//
// Rounds (Alg. 2). Per stage, the first READY of a round opens it and sets its deadline to that
// arrival plus the window T; the READYs that come by the deadline join the candidate group; the
// round closes at the deadline, or at once when every replica that will still come is in it.
// Readings of what the paper leaves open (Sec. 6 items 2-6), chosen and tested here:
// - one candidate group per stage at a time, as in the authors' artifact; stages are independent;
// - T is timed from the round's first READY (not fixed ticks);
// - the window T: fixed; infinite (every replica: All-Reduce); or adaptive, T = f x t_iter / N,
//   t_iter an exponential average (weight 0.2) of the time between two READYs of a replica of the
//   stage and f a factor that grows x1.5 (up to 8) after a group smaller than 2 and decays x0.9
//   (down to 1) after any other ("slightly enlarged when there are too few ready workers"). Until
//   a stage has measured t_iter, its rounds wait for every replica;
// - clock k counts the groups of a stage (1, 2, ...), and the window P of Assumption 1 is in k;
// - validation is exact over a sliding window: the candidate with the last P - 1 groups of its
//   stage must connect all N replicas (a union-find rebuilt per check, O(P N)). The first P - 1
//   groups of a stage are not checked (no window of P groups exists yet): "warmup". P = 0 turns
//   validation off;
// - wait-on-invalid: an invalid candidate is kept, not dropped or split; it grows with every READY
//   of its stage and is re-checked at each one until it connects ("enforced");
// - the enforcement token (Fig. 3): one stage at a time may hold an invalid candidate back. A
//   stage that finds its candidate invalid while another stage holds the token accepts it
//   unchecked ("skipped-token", counted); the window check of its next group sees the gap, so the
//   debt is made up as soon as the token is free. With the token off, every stage may wait at
//   once, which can deadlock through the pipelines (the test of Fig. 3 shows it);
// - a candidate that cannot connect because a replica it needs has sent its last READY is
//   accepted ("skipped-finished"): the end of a run. Likewise ("skipped-paused") when that replica
//   was grouped with a READY that said "pause": it then waits at a barrier of every rank (the
//   trainer agrees on metrics at log points) and sends nothing more until every replica of every
//   stage is there, so waiting for it would deadlock. It counts again once any READY of a later
//   iteration arrives (every rank is then past the barrier).
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <string>
#include <vector>

namespace strata::parallel::sdpipe {

enum class WindowKind { kFixed, kAuto, kInfinite };

struct SchedulerConfig {
  int stages = 1;
  int replicas = 1;  // N: pipelines
  WindowKind window_kind = WindowKind::kAuto;
  double window = 0.0;  // kFixed: T in seconds (0: groups of simultaneous arrivals only)
  int history = 10;     // P; 0: no validation
  bool token = true;
  // Adaptive window.
  double iteration_weight = 0.2;
  int min_group = 2;
  double widen = 1.5, narrow = 0.9, max_factor = 8.0;
};

enum class GroupCheck {
  kOff,
  kWarmup,
  kValid,
  kEnforced,
  kSkippedToken,
  kSkippedFinished,
  kSkippedPaused
};
const char* group_check_name(GroupCheck check);  // "off", "warmup", "valid", ...

struct Group {
  int stage = 0;
  int64_t clock = 0;                // 1, 2, ... per stage
  std::vector<int> members;         // ascending
  std::vector<int64_t> iterations;  // each member's iteration, in member order
  std::vector<bool> last;           // each member's READY was its last
  GroupCheck check = GroupCheck::kOff;
  double opened = 0.0;  // the round's first READY
  double closed = 0.0;  // when it was decided
  double window = 0.0;  // T of its round (inf: every replica)
};

class GroupScheduler {
 public:
  static constexpr double kInf = std::numeric_limits<double>::infinity();

  explicit GroupScheduler(const SchedulerConfig& config);
  const SchedulerConfig& config() const { return config_; }

  // Replica `replica` of `stage` finished update `iteration` at `now` (`last`: it will send no
  // more; `pause`: it will send no more until every replica is past a barrier, see above). First
  // closes the rounds whose deadline is before `now` (an arrival at the deadline still joins),
  // then adds the arrival and decides what it completes. Returns the groups decided, in order.
  // Times never decrease.
  std::vector<Group> ready(int stage, int replica, int64_t iteration, bool last, double now,
                           bool pause = false);
  // Closes the rounds whose deadline is at or before `now`.
  std::vector<Group> poll(double now);
  // The candidates found invalid and held back since the last call (wait-on-invalid), for the
  // trace: a replay must see them when they happened (the token changes hands then).
  struct Hold {
    int stage;
    std::vector<int> members;
    double t;
  };
  std::vector<Hold> take_holds();
  // The earliest deadline of an open round (kInf: none).
  double next_deadline() const;

  double window(int stage) const;  // T for a round opened now
  double factor(int stage) const { return stages_[stage].factor; }
  double iteration_time(int stage) const { return stages_[stage].iteration; }
  int token_holder() const { return token_; }  // -1: free
  bool waiting(int stage) const { return stages_[stage].waiting; }
  int64_t enforcement_waits() const { return waits_; }
  int64_t skipped_validations() const { return skipped_; }

 private:
  struct Arrival {
    int replica;
    int64_t iteration;
    bool last;
    bool pause;
  };
  struct Stage {
    std::vector<Arrival> candidate;
    double opened = 0.0, deadline = kInf, round_window = kInf;
    bool waiting = false;  // an invalid candidate held back (wait-on-invalid)
    int64_t clock = 0;
    std::deque<std::vector<int>> history;  // the last P - 1 groups
    std::vector<bool> finished;            // replicas whose last READY was grouped
    // Per replica: the iteration of its pausing READY once grouped (-1: not paused). A READY of a
    // later iteration from any replica of any stage means every rank is past that barrier.
    std::vector<int64_t> paused;
    std::vector<double> last_ready;  // per replica; < 0: none yet
    double iteration = 0.0;          // t_iter; 0: not measured
    double factor = 1.0;
  };
  // Decides stage j's candidate if its round is due; appends what it emits.
  void decide(int j, double now, bool due, std::vector<Group>* out);
  void emit(int j, GroupCheck check, double now, std::vector<Group>* out);
  int coming(int j) const;  // replicas of stage j neither finished nor paused

  std::vector<Group> close_due(double now, bool at_deadline);

  SchedulerConfig config_;
  std::vector<Stage> stages_;
  std::vector<Hold> holds_;
  int token_ = -1;
  int64_t waits_ = 0, skipped_ = 0;
};

struct TraceEvent;

// Replays a run's trace (--sync-trace) through a new scheduler of `config`: its READYs at their
// times, its decisions at theirs. Returns where the replay decides otherwise than the run did
// (empty: the run's decisions are what the policy makes of its arrivals).
std::vector<std::string> replay_sync_trace(const std::vector<TraceEvent>& events,
                                           const SchedulerConfig& config);

}  // namespace strata::parallel::sdpipe
