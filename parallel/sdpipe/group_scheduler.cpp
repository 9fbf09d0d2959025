// GroupScheduler: rounds, validation, wait-on-invalid and the token (see the header for the
// readings of the paper chosen here).
#include "parallel/sdpipe/group_scheduler.h"

#include <algorithm>
#include <cmath>

#include "engine/check.h"
#include "parallel/sdpipe/sync_graph.h"

namespace strata::parallel::sdpipe {

const char* group_check_name(GroupCheck check) {
  switch (check) {
    case GroupCheck::kOff:
      return "off";
    case GroupCheck::kWarmup:
      return "warmup";
    case GroupCheck::kValid:
      return "valid";
    case GroupCheck::kEnforced:
      return "enforced";
    case GroupCheck::kSkippedToken:
      return "skipped-token";
    case GroupCheck::kSkippedFinished:
      return "skipped-finished";
    case GroupCheck::kSkippedPaused:
      return "skipped-paused";
  }
  return "?";
}

GroupScheduler::GroupScheduler(const SchedulerConfig& config) : config_(config) {
  STRATA_CHECK(config.stages >= 1 && config.replicas >= 1)
      << "SDPipe scheduler: " << config.stages << " stages x " << config.replicas << " replicas";
  STRATA_CHECK(config.window_kind != WindowKind::kFixed ||
               (config.window >= 0 && std::isfinite(config.window)))
      << "--sync-window must be >= 0 seconds, got " << config.window;
  STRATA_CHECK(config.history >= 0) << "--sync-history must be >= 0, got " << config.history;
  stages_.resize(static_cast<size_t>(config.stages));
  for (Stage& s : stages_) {
    s.finished.assign(static_cast<size_t>(config.replicas), false);
    s.paused.assign(static_cast<size_t>(config.replicas), -1);
    s.last_ready.assign(static_cast<size_t>(config.replicas), -1.0);
  }
}

double GroupScheduler::window(int stage) const {
  switch (config_.window_kind) {
    case WindowKind::kInfinite:
      return kInf;
    case WindowKind::kFixed:
      return config_.window;
    case WindowKind::kAuto: {
      const Stage& s = stages_[stage];
      // SDPipe's T = 1/N of the iteration time, widened while groups are too small.
      return s.iteration > 0 ? s.factor * s.iteration / config_.replicas : kInf;
    }
  }
  return kInf;
}

int GroupScheduler::coming(int j) const {
  const Stage& s = stages_[j];
  int n = 0;
  for (int r = 0; r < config_.replicas; ++r) n += !s.finished[r] && s.paused[r] < 0;
  return n;
}

double GroupScheduler::next_deadline() const {
  double t = kInf;
  for (const Stage& s : stages_) {
    if (!s.candidate.empty() && !s.waiting) t = std::min(t, s.deadline);
  }
  return t;
}

std::vector<Group> GroupScheduler::close_due(double now, bool at_deadline) {
  std::vector<Group> out;
  for (int j = 0; j < config_.stages; ++j) {
    const Stage& s = stages_[j];
    const bool due = at_deadline ? now >= s.deadline : now > s.deadline;
    if (!s.candidate.empty() && !s.waiting && due) decide(j, now, true, &out);
  }
  return out;
}

std::vector<Group> GroupScheduler::poll(double now) { return close_due(now, true); }

std::vector<GroupScheduler::Hold> GroupScheduler::take_holds() {
  std::vector<Hold> h;
  h.swap(holds_);
  return h;
}

std::vector<Group> GroupScheduler::ready(int stage, int replica, int64_t iteration, bool last,
                                         double now, bool pause) {
  STRATA_CHECK(stage >= 0 && stage < config_.stages && replica >= 0 && replica < config_.replicas)
      << "SDPipe scheduler: READY from stage " << stage << ", replica " << replica << " (there are "
      << config_.stages << " stages x " << config_.replicas << " replicas)";
  Stage& s = stages_[stage];
  STRATA_CHECK(!s.finished[replica]) << "SDPipe scheduler: stage " << stage << ", replica "
                                     << replica << " is READY after its last update";
  for (const Arrival& a : s.candidate) {
    STRATA_CHECK(a.replica != replica)
        << "SDPipe scheduler: stage " << stage << ", replica " << replica << " is READY (iteration "
        << iteration << ") before its previous group (iteration " << a.iteration << ") was decided";
  }
  std::vector<Group> out = close_due(now, false);
  if (s.last_ready[replica] >= 0) {
    const double sample = now - s.last_ready[replica];
    const double w = config_.iteration_weight;
    s.iteration = s.iteration > 0 ? (1.0 - w) * s.iteration + w * sample : sample;
  }
  s.last_ready[replica] = now;
  for (Stage& other : stages_) {  // a READY after a barrier: everyone has passed it
    for (int64_t& p : other.paused) {
      if (p >= 0 && p < iteration) p = -1;
    }
  }
  if (s.candidate.empty()) {
    s.opened = now;
    s.round_window = window(stage);
    s.deadline = now + s.round_window;
  }
  s.candidate.push_back({replica, iteration, last, pause});
  decide(stage, now, false, &out);  // complete, or held back; the deadline is poll()'s
  return out;
}

void GroupScheduler::decide(int j, double now, bool due, std::vector<Group>* out) {
  Stage& s = stages_[j];
  if (s.candidate.empty()) return;
  const bool complete = static_cast<int>(s.candidate.size()) >= coming(j);
  if (!s.waiting && !due && !complete) return;
  const int p = config_.history;
  if (p == 0) return emit(j, GroupCheck::kOff, now, out);
  if (s.clock < p - 1) return emit(j, GroupCheck::kWarmup, now, out);
  std::vector<int> members;
  for (const Arrival& a : s.candidate) members.push_back(a.replica);
  std::deque<std::vector<int>> window = s.history;
  window.push_back(members);
  if (connects_all(config_.replicas, window)) {
    return emit(j, s.waiting ? GroupCheck::kEnforced : GroupCheck::kValid, now, out);
  }
  // Invalid. Can it still grow? Only with replicas that will send another READY before this
  // candidate's members can go on.
  bool can_grow = false, paused = false;
  for (int r = 0; r < config_.replicas && !can_grow; ++r) {
    if (s.finished[r] || std::find(members.begin(), members.end(), r) != members.end()) continue;
    if (s.paused[r] >= 0) {
      paused = true;
      continue;
    }
    can_grow = true;
  }
  if (!can_grow) {
    return emit(j, paused ? GroupCheck::kSkippedPaused : GroupCheck::kSkippedFinished, now, out);
  }
  if (s.waiting) return;  // still waiting for the replicas that connect it
  if (config_.token && token_ >= 0 && token_ != j) {
    ++skipped_;
    return emit(j, GroupCheck::kSkippedToken, now, out);
  }
  s.waiting = true;
  ++waits_;
  if (config_.token) token_ = j;
  holds_.push_back({j, members, now});
}

void GroupScheduler::emit(int j, GroupCheck check, double now, std::vector<Group>* out) {
  Stage& s = stages_[j];
  std::vector<Arrival> arrivals = s.candidate;
  std::sort(arrivals.begin(), arrivals.end(),
            [](const Arrival& a, const Arrival& b) { return a.replica < b.replica; });
  Group g;
  g.stage = j;
  g.clock = ++s.clock;
  for (const Arrival& a : arrivals) {
    g.members.push_back(a.replica);
    g.iterations.push_back(a.iteration);
    g.last.push_back(a.last);
    if (a.last) s.finished[a.replica] = true;
    if (a.pause) s.paused[a.replica] = a.iteration;
  }
  g.check = check;
  g.opened = s.opened;
  g.closed = now;
  g.window = s.round_window;
  if (config_.history > 1) {
    s.history.push_back(g.members);
    while (s.history.size() > static_cast<size_t>(config_.history - 1)) s.history.pop_front();
  }
  if (config_.window_kind == WindowKind::kAuto) {
    const int wanted = std::min(config_.min_group, config_.replicas);
    s.factor = static_cast<int>(g.members.size()) < wanted
                   ? std::min(s.factor * config_.widen, config_.max_factor)
                   : std::max(s.factor * config_.narrow, 1.0);
  }
  if (token_ == j) token_ = -1;
  s.waiting = false;
  s.candidate.clear();
  s.deadline = kInf;
  out->push_back(std::move(g));
}

std::vector<std::string> replay_sync_trace(const std::vector<TraceEvent>& events,
                                           const SchedulerConfig& config) {
  GroupScheduler scheduler(config);
  std::deque<Group> decided;
  std::deque<GroupScheduler::Hold> held;
  std::vector<std::string> mismatches;
  auto keep = [&](std::vector<Group> groups) {
    for (Group& g : groups) decided.push_back(std::move(g));
    for (GroupScheduler::Hold& h : scheduler.take_holds()) held.push_back(std::move(h));
  };
  auto members_str = [](const std::vector<int>& m) {
    std::string s = "{";
    for (size_t i = 0; i < m.size(); ++i) s += (i ? "," : "") + std::to_string(m[i]);
    return s + "}";
  };
  for (const TraceEvent& e : events) {
    if (mismatches.size() >= 20) break;
    if (e.event == "ready") {
      try {
        keep(scheduler.ready(e.stage, e.replica, e.iteration, e.last, e.t, e.pause));
      } catch (const Error& x) {  // the replay's decisions went apart from the run's
        mismatches.push_back("READY of stage " + std::to_string(e.stage) + ", replica " +
                             std::to_string(e.replica) + " at t = " + std::to_string(e.t) + ": " +
                             x.message());
        break;
      }
      continue;
    }
    if (e.event == "hold") {
      if (held.empty()) keep(scheduler.poll(e.t));
      if (held.empty() || held.front().stage != e.stage || held.front().members != e.members) {
        mismatches.push_back("stage " + std::to_string(e.stage) + " held " +
                             members_str(e.members) + " back at t = " + std::to_string(e.t) +
                             (held.empty() ? ": the replay holds nothing back then"
                                           : ": the replay holds back stage " +
                                                 std::to_string(held.front().stage) + " " +
                                                 members_str(held.front().members)));
      }
      if (!held.empty()) held.pop_front();
      continue;
    }
    if (decided.empty()) keep(scheduler.poll(e.t));
    const std::string where = "stage " + std::to_string(e.stage) + " group " +
                              std::to_string(e.clock) + " " + members_str(e.members) + " (" +
                              e.check + ") at t = " + std::to_string(e.t);
    if (decided.empty()) {
      mismatches.push_back(where + ": the replay decides nothing then");
      continue;
    }
    const Group g = decided.front();
    decided.pop_front();
    if (g.stage != e.stage || g.clock != e.clock || g.members != e.members ||
        group_check_name(g.check) != e.check) {
      mismatches.push_back(where + ": the replay decides stage " + std::to_string(g.stage) +
                           " group " + std::to_string(g.clock) + " " + members_str(g.members) +
                           " (" + group_check_name(g.check) + ")");
    }
  }
  for (const Group& g : decided) {
    if (mismatches.size() >= 20) break;
    mismatches.push_back("the replay decides stage " + std::to_string(g.stage) + " group " +
                         std::to_string(g.clock) + " " + members_str(g.members) +
                         ", which the run did not");
  }
  return mismatches;
}

}  // namespace strata::parallel::sdpipe
