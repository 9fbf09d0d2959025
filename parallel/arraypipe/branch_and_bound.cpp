// Depth-first Branch and Bound over Giffler-Thompson active schedules.
//
// Why active schedules suffice: every constraint of the model is "start(y) >= start(x) + a
// non-negative constant" and Eq. 3 is monotone in the start times, so any optimal schedule can be
// left-shifted into an active one. At a node, let o* be the next operation (over all jobs) with
// the smallest earliest end of its device occupancy, est + occupancy, on device m. In an optimal
// completion, the first of the unscheduled operations on m starts before that end (else o* fits in
// front of it without delaying anything), so branching over those operations (the conflict set)
// loses nothing. Jobs with identical times are interchangeable: relabelling two of them so that
// the lower index takes the earlier start of every operation index keeps the schedule feasible
// (each chain still holds: the earlier of two predecessors plus the lag precedes the earlier of
// two successors) with the same device intervals, so some optimal active schedule runs every
// operation of job i before the same operation of an identical job j > i, and the search only
// branches on j's operation k once i has scheduled its operation k.
#include "parallel/arraypipe/branch_and_bound.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <queue>

#include "engine/check.h"

namespace strata::parallel::arraypipe {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kInf = std::numeric_limits<double>::infinity();

struct NodeState {
  std::vector<int> next_op;         // [job]
  std::vector<double> job_ready;    // [job]: earliest start of the next op; Eq. 3 end when done
  std::vector<double> device_free;  // [stage]
};

struct PendingOp {
  double release = 0;
  double duration = 0;
  double tail = 0;  // after the occupancy ends, to the job's Eq. 3 end (may be negative)
};

class Search {
 public:
  Search(const Instance& instance, const BnbOptions& options)
      : in_(instance),
        options_(options),
        jobs_(instance.jobs()),
        stages_(instance.stages()),
        ops_(instance.operations_per_job()) {
    tail_.assign(static_cast<size_t>(jobs_) * (ops_ + 1), 0.0);
    for (int j = 0; j < jobs_; ++j) {
      for (int k = ops_ - 1; k >= 0; --k) tail(j, k) = tail(j, k + 1) + in_.lag(j, k);
    }
    // Jobs with the same times everywhere are interchangeable.
    previous_twin_.assign(jobs_, -1);
    for (int j = 0; j < jobs_; ++j) {
      for (int i = j - 1; i >= 0 && previous_twin_[j] < 0; --i) {
        bool same = true;
        for (int k = 0; k < ops_ && same; ++k) {
          same = in_.lag(i, k) == in_.lag(j, k) && in_.occupancy(i, k) == in_.occupancy(j, k);
        }
        if (same) previous_twin_[j] = i;
      }
    }
  }

  NodeState root() const {
    return NodeState{std::vector<int>(jobs_, 0), std::vector<double>(jobs_, 0.0),
                     std::vector<double>(stages_, 0.0)};
  }

  double lower_bound(const NodeState& n) const {
    // Heads: the job's chain from its next operation, each operation no earlier than its device
    // is free (every unscheduled operation on a device follows the ones scheduled there).
    std::vector<double>& head = head_scratch_;
    head.assign(static_cast<size_t>(jobs_) * ops_, 0.0);
    double bound = 0;
    for (int j = 0; j < jobs_; ++j) {
      double h = n.job_ready[j];
      for (int k = n.next_op[j]; k < ops_; ++k) {
        h = std::max(h, n.device_free[in_.stage_of(k)]);
        head[static_cast<size_t>(j) * ops_ + k] = h;
        h += in_.lag(j, k);
      }
      bound = std::max(bound, h);  // the job's own chain to Eq. 3's end
    }
    std::vector<PendingOp>& pending = pending_scratch_;
    for (int s = 0; s < stages_; ++s) {
      pending.clear();
      for (int j = 0; j < jobs_; ++j) {
        for (int k : {s, ops_ - 1 - s}) {
          if (n.next_op[j] > k) continue;
          const double occ = in_.occupancy(j, k);
          pending.push_back({head[static_cast<size_t>(j) * ops_ + k], occ, tail(j, k) - occ});
        }
      }
      bound = std::max(bound, preemptive_jackson(&pending));
    }
    return bound;
  }

  void run(const std::vector<int>& initial) {
    start_ = Clock::now();
    if (!initial.empty()) {
      best_ = decode_makespan(in_, initial);
      best_sequence_ = initial;
    }
    NodeState r = root();
    root_bound_ = lower_bound(r);
    path_.reserve(static_cast<size_t>(jobs_) * ops_);
    dfs(r, root_bound_);
    proven_ = !cut_;
  }

  double best() const { return best_; }
  const std::vector<int>& best_sequence() const { return best_sequence_; }
  double dive() const { return dive_; }
  double root_bound() const { return root_bound_; }
  bool proven() const { return proven_; }
  long nodes() const { return nodes_; }

 private:
  // max over operations of (completion + tail) in the preemptive schedule that always runs the
  // released operation with the largest tail: optimal for 1|r_j,pmtn|Lmax, so a lower bound.
  static double preemptive_jackson(std::vector<PendingOp>* ops) {
    if (ops->empty()) return 0;
    std::sort(ops->begin(), ops->end(),
              [](const PendingOp& a, const PendingOp& b) { return a.release < b.release; });
    // (tail, remaining duration), largest tail first
    std::priority_queue<std::pair<double, double>> ready;
    double t = 0;
    double bound = 0;
    size_t i = 0;
    while (i < ops->size() || !ready.empty()) {
      if (ready.empty()) t = std::max(t, (*ops)[i].release);
      while (i < ops->size() && (*ops)[i].release <= t) {
        ready.push({(*ops)[i].tail, (*ops)[i].duration});
        ++i;
      }
      auto [q, remaining] = ready.top();
      ready.pop();
      const double next_release = i < ops->size() ? (*ops)[i].release : kInf;
      if (t + remaining <= next_release) {
        t += remaining;
        bound = std::max(bound, t + q);
      } else {
        ready.push({q, remaining - (next_release - t)});
        t = next_release;
      }
    }
    return bound;
  }

  bool out_of_budget() {
    if (best_ == kInf) return false;  // always finish the first dive
    if (options_.max_nodes > 0 && nodes_ >= options_.max_nodes) return true;
    if (options_.time_limit_s > 0 && (nodes_ & 255) == 0) {
      const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
      if (seconds >= options_.time_limit_s) return true;
    }
    return false;
  }

  NodeState apply(const NodeState& n, int job) const {
    NodeState c = n;
    const int op = c.next_op[job]++;
    const int s = in_.stage_of(op);
    const double e = std::max(n.job_ready[job], n.device_free[s]);
    c.device_free[s] = e + in_.occupancy(job, op);
    c.job_ready[job] = e + in_.lag(job, op);
    return c;
  }

  void dfs(const NodeState& n, double bound) {
    if (cut_) return;
    ++nodes_;
    if (out_of_budget()) {
      cut_ = true;
      return;
    }
    if (static_cast<int>(path_.size()) == jobs_ * ops_) {
      const double t = *std::max_element(n.job_ready.begin(), n.job_ready.end());
      if (dive_ == kInf) dive_ = t;
      if (t < best_) {
        best_ = t;
        best_sequence_ = path_;
      }
      return;
    }
    // o*: the next operation that can end its device occupancy first.
    int star = -1;
    double star_end = kInf;
    for (int j = 0; j < jobs_; ++j) {
      const int op = n.next_op[j];
      if (op >= ops_) continue;
      const double end =
          std::max(n.job_ready[j], n.device_free[in_.stage_of(op)]) + in_.occupancy(j, op);
      if (end < star_end) {
        star_end = end;
        star = j;
      }
    }
    const int device = in_.stage_of(n.next_op[star]);
    struct Child {
      double bound;
      double start;
      int job;
      NodeState state;
    };
    std::vector<Child> children;
    for (int j = 0; j < jobs_; ++j) {
      const int op = n.next_op[j];
      if (op >= ops_ || in_.stage_of(op) != device) continue;
      const double est = std::max(n.job_ready[j], n.device_free[device]);
      if (est >= star_end) continue;
      const int twin = previous_twin_[j];
      if (twin >= 0 && n.next_op[twin] <= op) continue;  // the twin runs operation op first
      NodeState c = apply(n, j);
      const double b = std::max(bound, lower_bound(c));
      if (b >= best_) continue;
      children.push_back({b, est, j, std::move(c)});
    }
    std::sort(children.begin(), children.end(), [](const Child& a, const Child& b) {
      if (a.bound != b.bound) return a.bound < b.bound;
      if (a.start != b.start) return a.start < b.start;
      return a.job < b.job;
    });
    for (const Child& c : children) {
      if (c.bound >= best_ || cut_) continue;
      path_.push_back(c.job);
      dfs(c.state, c.bound);
      path_.pop_back();
    }
  }

  double& tail(int j, int k) { return tail_[static_cast<size_t>(j) * (ops_ + 1) + k]; }
  double tail(int j, int k) const { return tail_[static_cast<size_t>(j) * (ops_ + 1) + k]; }

  const Instance& in_;
  BnbOptions options_;
  int jobs_, stages_, ops_;
  std::vector<double> tail_;        // [job][k]: lags of operations k..2S-1
  std::vector<int> previous_twin_;  // [job]: the last job before it with identical times, or -1
  std::vector<int> path_;
  mutable std::vector<double> head_scratch_;        // lower_bound()'s heads [job][op]
  mutable std::vector<PendingOp> pending_scratch_;  // lower_bound()'s operations of a device
  std::vector<int> best_sequence_;
  double best_ = kInf;
  double dive_ = kInf;
  double root_bound_ = 0;
  bool cut_ = false;
  bool proven_ = false;
  long nodes_ = 0;
  Clock::time_point start_;
};

}  // namespace

BnbResult branch_and_bound(const Instance& instance, const BnbOptions& options,
                           const std::vector<int>& initial_sequence) {
  validate_instance(instance);
  STRATA_CHECK(instance.jobs() <= options.max_jobs)
      << "ArrayPipe Branch and Bound: the array has " << instance.jobs()
      << " jobs, more than the B&B limit " << options.max_jobs
      << " (--array-bnb-max); the search is exponential in the jobs: use the GA";
  const auto start = Clock::now();
  Search search(instance, options);
  search.run(initial_sequence);
  BnbResult result;
  result.sequence = search.best_sequence();
  result.schedule = decode(instance, result.sequence);
  result.makespan = makespan(instance, result.schedule);
  result.dive_makespan = search.dive();
  result.root_lower_bound = search.root_bound();
  result.proven_optimal = search.proven();
  result.nodes = search.nodes();
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

double root_lower_bound(const Instance& instance) {
  validate_instance(instance);
  Search search(instance, BnbOptions{});
  return search.lower_bound(search.root());
}

}  // namespace strata::parallel::arraypipe
