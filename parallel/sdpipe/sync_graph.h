// SDPipe's sync graph (papers/sdpipe.md Sec. 2.3, 2.5-2.6): the algebra of a group sync and the
// connectivity check over the recent groups of a stage, plus the offline check of a run's
// (arrival, group) trace.
//
// Eq. 2: a group S of the N replicas of a stage turns X (columns = replicas) into X W with
//   W(u, v) = 1/|S| if u, v in S;  1 if u = v not in S;  0 otherwise,
// symmetric and doubly stochastic: the members become equal, the others keep their values, and
// the mean over the replicas is preserved.
// Assumption 1: the union of the complete edge sets of any P consecutive groups of a stage
// connects all N replicas. A check is a union-find over N nodes with at most P (N - 1) unions.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace strata::parallel::sdpipe {

class DisjointSets {
 public:
  explicit DisjointSets(int n);
  int find(int x);
  void unite(int a, int b);
  int components() const { return components_; }

 private:
  std::vector<int> parent_, rank_;
  int components_;
};

// Whether the groups (each a list of replicas in [0, n)) together connect all n replicas.
bool connects_all(int n, const std::deque<std::vector<int>>& groups);
bool connects_all(int n, const std::vector<std::vector<int>>& groups);

// W of Eq. 2 for `members` among n replicas (row-major n x n).
std::vector<double> mixing_matrix(int n, const std::vector<int>& members);

// One line of a run's sync trace (--sync-trace, JSON Lines written by the scheduler):
//   {"event":"ready","stage":0,"replica":2,"iteration":7,"last":false,"t":1.234}
//   {"event":"group","stage":0,"clock":12,"members":[0,2],"check":"valid","t":1.240,
//    "window":0.004,"iterations":[7,6]}
//   {"event":"hold","stage":1,"members":[3],"t":1.250}   (an invalid candidate held back)
struct TraceEvent {
  std::string event;  // "ready", "group" or "hold"
  int stage = 0;
  int replica = -1;          // ready
  int64_t iteration = -1;    // ready
  bool last = false;         // ready
  bool pause = false;        // ready: a barrier of every rank follows (written only when true)
  int64_t clock = 0;         // group
  std::vector<int> members;  // group, hold
  std::vector<int64_t> iterations;  // group: each member's iteration
  std::string check;                // group: GroupCheck name
  double t = 0.0;
  double window = 0.0;  // group: the window T of its round (inf: every replica)
};
std::string trace_event_json(const TraceEvent& e);
TraceEvent parse_trace_event(const std::string& line);  // errors name the line
std::vector<TraceEvent> read_sync_trace(const std::string& path);

// The offline check of a trace (papers/sdpipe.md Sec. 5 items 4, 6, 15) for `replicas` replicas
// per stage and window P = `history` (0: no validation was asked):
// - every READY got exactly one group holding its replica, after it, and groups hold only
//   replicas that were ready;
// - every group checked as valid or enforced connects all replicas with the P - 1 groups of its
//   stage before it (so the union of those P consecutive groups is connected).
struct TraceCheck {
  int64_t readies = 0, groups = 0, holds = 0;
  int64_t validated = 0;                // groups checked as valid or enforced
  int64_t skipped = 0;                  // accepted unchecked (token conflicts, finished replicas)
  std::vector<std::string> violations;  // empty: the trace passes
  double mean_group = 0.0;
};
TraceCheck check_sync_trace(const std::vector<TraceEvent>& events, int replicas, int history);

}  // namespace strata::parallel::sdpipe
