// SDPipe's policy without ranks: Eq. 2's algebra, the scheduler's rounds on scripted arrival
// times, the adaptive window, the sync-graph validation and wait-on-invalid on the mesh model with
// random delays, the cross-stage deadlock of the paper's Fig. 3 (token off) and its prevention
// (token on), and the offline trace check and replay (papers/sdpipe.md Sec. 5 items 3-8, 15).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "engine/check.h"
#include "parallel/sdpipe/group_scheduler.h"
#include "parallel/sdpipe/mesh_sim.h"
#include "parallel/sdpipe/sync_graph.h"

namespace strata::parallel::sdpipe {
namespace {

SchedulerConfig fixed(int stages, int replicas, double window, int history = 0) {
  SchedulerConfig c;
  c.stages = stages;
  c.replicas = replicas;
  c.window_kind = WindowKind::kFixed;
  c.window = window;
  c.history = history;
  return c;
}

// Item 3: W of Eq. 2 is symmetric and doubly stochastic; X W keeps the mean, makes the members
// equal and leaves the others as they were.
TEST(SdpipeAlgebra, MixingMatrixIsSymmetricDoublyStochastic) {
  std::mt19937 rng(3);
  for (int n : {2, 3, 5, 8}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<int> members;
      for (int r = 0; r < n; ++r) {
        if (rng() % 2) members.push_back(r);
      }
      if (members.empty()) members.push_back(static_cast<int>(rng() % n));
      const std::vector<double> w = mixing_matrix(n, members);
      for (int u = 0; u < n; ++u) {
        double row = 0, col = 0;
        for (int v = 0; v < n; ++v) {
          EXPECT_EQ(w[u * n + v], w[v * n + u]);
          EXPECT_GE(w[u * n + v], 0.0);
          row += w[u * n + v];
          col += w[v * n + u];
        }
        EXPECT_NEAR(row, 1.0, 1e-12);
        EXPECT_NEAR(col, 1.0, 1e-12);
      }
      std::vector<double> x(n), y(n, 0.0);
      for (double& v : x) v = std::uniform_real_distribution<double>(-1, 1)(rng);
      for (int v = 0; v < n; ++v) {
        for (int u = 0; u < n; ++u) y[v] += x[u] * w[u * n + v];  // (X W)_v, X a row
      }
      double mean_x = 0, mean_y = 0;
      for (int v = 0; v < n; ++v) mean_x += x[v], mean_y += y[v];
      EXPECT_NEAR(mean_x, mean_y, 1e-12);
      std::set<int> in(members.begin(), members.end());
      for (int v = 0; v < n; ++v) {
        if (in.count(v)) {
          EXPECT_NEAR(y[v], y[members[0]], 1e-12);
        } else {
          EXPECT_EQ(y[v], x[v]);
        }
      }
    }
  }
}

TEST(SdpipeAlgebra, DisjointSetsCountComponents) {
  DisjointSets d(5);
  EXPECT_EQ(d.components(), 5);
  d.unite(0, 1);
  d.unite(3, 4);
  d.unite(1, 0);
  EXPECT_EQ(d.components(), 3);
  EXPECT_EQ(d.find(0), d.find(1));
  EXPECT_NE(d.find(0), d.find(3));
  EXPECT_TRUE(connects_all(4, std::vector<std::vector<int>>{{0, 1}, {2, 3}, {1, 2}}));
  EXPECT_FALSE(connects_all(4, std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_TRUE(connects_all(1, std::vector<std::vector<int>>{}));
}

// Drives `s` with arrivals (time, stage, replica) in time order, closing rounds at their
// deadlines in between; returns every group decided.
struct Arrive {
  double t;
  int stage, replica;
};
std::vector<Group> drive(GroupScheduler& s, std::vector<Arrive> arrivals) {
  std::stable_sort(arrivals.begin(), arrivals.end(),
                   [](const Arrive& a, const Arrive& b) { return a.t < b.t; });
  std::vector<Group> out;
  std::map<std::pair<int, int>, int64_t> iteration;
  for (const Arrive& a : arrivals) {
    while (s.next_deadline() < a.t) {
      for (Group& g : s.poll(s.next_deadline())) out.push_back(g);
    }
    for (Group& g : s.ready(a.stage, a.replica, iteration[{a.stage, a.replica}]++, false, a.t)) {
      out.push_back(g);
    }
  }
  while (s.next_deadline() < GroupScheduler::kInf) {
    for (Group& g : s.poll(s.next_deadline())) out.push_back(g);
  }
  return out;
}

// Item 4: with scripted arrival times the groups are the sets of arrivals within T of their
// round's first arrival (a brute force over the same times), and every READY gets exactly one
// group holding its replica.
TEST(SdpipeScheduler, GroupsAreTheArrivalsWithinTheWindow) {
  std::mt19937 rng(11);
  for (double T : {0.0, 0.05, 0.1, 0.3}) {
    const int N = 6;
    std::vector<Arrive> arrivals;
    std::vector<std::vector<int>> expected;
    for (int k = 0; k < 15; ++k) {
      // Iteration k: every replica within [k, k + 0.5), distinct times.
      std::vector<std::pair<double, int>> offsets;
      for (int r = 0; r < N; ++r) {
        offsets.push_back({std::uniform_real_distribution<double>(0, 0.5)(rng), r});
      }
      std::sort(offsets.begin(), offsets.end());
      for (const auto& [o, r] : offsets) arrivals.push_back({k + o, 0, r});
      // Brute force: the first unassigned arrival opens a round; members arrive by open + T.
      size_t i = 0;
      while (i < offsets.size()) {
        std::vector<int> g;
        const double open = offsets[i].first;
        while (i < offsets.size() && offsets[i].first <= open + T) g.push_back(offsets[i++].second);
        std::sort(g.begin(), g.end());
        expected.push_back(g);
      }
    }
    GroupScheduler s(fixed(1, N, T));
    const std::vector<Group> groups = drive(s, arrivals);
    ASSERT_EQ(groups.size(), expected.size()) << "T = " << T;
    for (size_t g = 0; g < groups.size(); ++g) {
      EXPECT_EQ(groups[g].members, expected[g]) << "T = " << T << ", group " << g;
      EXPECT_EQ(groups[g].clock, static_cast<int64_t>(g + 1));
      EXPECT_EQ(groups[g].check, GroupCheck::kOff);
    }
  }
}

TEST(SdpipeScheduler, ZeroWindowGivesSingletonsExceptSimultaneousArrivals) {
  GroupScheduler s(fixed(1, 4, 0.0));
  const std::vector<Group> groups =
      drive(s, {{0.0, 0, 0}, {0.1, 0, 1}, {0.2, 0, 2}, {0.2, 0, 3}, {1.0, 0, 0}});
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0].members, std::vector<int>({0}));
  EXPECT_EQ(groups[1].members, std::vector<int>({1}));
  EXPECT_EQ(groups[2].members, std::vector<int>({2, 3}));
  EXPECT_EQ(groups[3].members, std::vector<int>({0}));
}

TEST(SdpipeScheduler, InfiniteWindowGivesEveryReplica) {
  SchedulerConfig c = fixed(2, 4, 0.0, 10);
  c.window_kind = WindowKind::kInfinite;
  GroupScheduler s(c);
  std::vector<Arrive> arrivals;
  for (int k = 0; k < 5; ++k) {
    for (int r = 0; r < 4; ++r) {
      arrivals.push_back({k + 0.2 * r, 0, r});
      arrivals.push_back({k + 0.1 * r + 0.05, 1, 3 - r});
    }
  }
  const std::vector<Group> groups = drive(s, arrivals);
  ASSERT_EQ(groups.size(), 10u);
  for (const Group& g : groups) EXPECT_EQ(g.members, std::vector<int>({0, 1, 2, 3}));
  // A group is decided by its last arrival, at once.
  EXPECT_EQ(groups[0].stage, 1);
  EXPECT_DOUBLE_EQ(groups[0].closed, 0.35);
  EXPECT_EQ(groups[1].stage, 0);
  EXPECT_DOUBLE_EQ(groups[1].closed, 0.6);
}

// Item 5: the adaptive window T = f t_iter / N rises while groups are undersized, decays after.
TEST(SdpipeScheduler, AdaptiveWindowRisesOnSmallGroupsAndDecays) {
  SchedulerConfig c;
  c.stages = 1;
  c.replicas = 4;
  c.window_kind = WindowKind::kAuto;
  c.history = 0;
  GroupScheduler s(c);
  EXPECT_EQ(s.window(0), GroupScheduler::kInf);  // no iteration time measured yet
  // Iterations of 4 s with the replicas 1.2 s apart: at f = 1, T = 4 / 4 = 1 s catches none of
  // them, so f grows until T exceeds 1.2 s; then all at once: groups of 4, and f decays to 1.
  double t = 0, widest = 0;
  int64_t k = 0;
  auto arrive = [&](double at, int r) {
    while (s.next_deadline() < at) s.poll(s.next_deadline());
    s.ready(0, r, k, false, at);
  };
  for (; k < 8; ++k, t += 4.0) {
    for (int r = 0; r < 4; ++r) arrive(t + 1.2 * r, r);
    while (s.next_deadline() < GroupScheduler::kInf) s.poll(s.next_deadline());
    widest = std::max(widest, s.factor(0));
  }
  EXPECT_GT(widest, 1.2);
  for (int i = 0; i < 30; ++i, ++k, t += 4.0) {
    for (int r = 0; r < 4; ++r) arrive(t, r);
  }
  EXPECT_DOUBLE_EQ(s.factor(0), 1.0);
  EXPECT_NEAR(s.iteration_time(0), 4.0, 0.5);
  EXPECT_NEAR(s.window(0), s.iteration_time(0) / 4, 1e-12);
}

MeshSimConfig random_mesh(int stages, int replicas, int history, uint64_t seed, bool token) {
  MeshSimConfig m;
  m.scheduler = fixed(stages, replicas, 0.004, history);
  m.scheduler.token = token;
  m.iterations = 40;
  m.p = 0.2;
  m.delay = 0.03;
  m.seed = seed;
  return m;
}

// Item 6: under random delays every accepted group connects all replicas with the P - 1 groups of
// its stage before it; the product of W over any (N - 1) P consecutive checked syncs is
// entrywise positive; and every READY got exactly one group.
TEST(SdpipeScheduler, ValidatedGroupsKeepTheLastPGroupsConnected) {
  int64_t groups = 0, skipped = 0, waits = 0;
  for (int history : {2, 3, 5}) {
    for (uint64_t seed = 0; seed < 12; ++seed) {
      const MeshSimResult r = simulate_mesh(random_mesh(3, 4, history, seed, true));
      ASSERT_FALSE(r.deadlock) << r.blocked.front();
      const TraceCheck c = check_sync_trace(r.trace, 4, history);
      EXPECT_TRUE(c.violations.empty()) << c.violations.front();
      EXPECT_EQ(c.readies, 3 * 4 * 40);
      groups += c.groups;
      skipped += c.skipped;
      waits += r.enforcement_waits;
      // The product of the W of (N - 1) P consecutive validated groups of a stage is positive.
      const int n = 4;
      const size_t span = static_cast<size_t>((n - 1) * history);
      for (int stage = 0; stage < 3; ++stage) {
        std::vector<const Group*> mine;
        for (const Group& g : r.groups) {
          if (g.stage == stage) mine.push_back(&g);
        }
        for (size_t first = 0; first + span <= mine.size(); first += span / 2 + 1) {
          bool checked = true;
          for (size_t i = first; i < first + span; ++i) {
            checked = checked && (mine[i]->check == GroupCheck::kValid ||
                                  mine[i]->check == GroupCheck::kEnforced);
          }
          if (!checked) continue;
          std::vector<double> product = mixing_matrix(n, {0});  // identity
          for (size_t i = first; i < first + span; ++i) {
            const std::vector<double> w = mixing_matrix(n, mine[i]->members);
            std::vector<double> next(n * n, 0.0);
            for (int a = 0; a < n; ++a)
              for (int b = 0; b < n; ++b)
                for (int c2 = 0; c2 < n; ++c2)
                  next[a * n + b] += product[a * n + c2] * w[c2 * n + b];
            product = next;
          }
          for (double x : product) EXPECT_GT(x, 0.0) << "stage " << stage << " from " << first;
        }
      }
    }
  }
  EXPECT_GT(waits, 0);  // the random delays did make candidates invalid
  std::printf(
      "random meshes 3 x 4, window 4 ms, delay 30 ms at p = 0.2: %lld groups, %lld "
      "enforcement waits, %lld skipped validations\n",
      static_cast<long long>(groups), static_cast<long long>(waits),
      static_cast<long long>(skipped));
}

// Item 8's second test: with SDPipe's adaptive window and the paper's straggler rate, the
// validations skipped for the token are few, and counted.
TEST(SdpipeScheduler, SkippedValidationsAreFewAndCounted) {
  int64_t groups = 0, skipped = 0, waits = 0;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    MeshSimConfig m = random_mesh(4, 4, 10, seed, true);
    m.scheduler.window_kind = WindowKind::kAuto;
    m.p = 0.1;
    m.iterations = 60;
    const MeshSimResult r = simulate_mesh(m);
    ASSERT_FALSE(r.deadlock);
    const TraceCheck c = check_sync_trace(r.trace, 4, 10);
    EXPECT_TRUE(c.violations.empty()) << c.violations.front();
    EXPECT_EQ(c.skipped, r.skipped_validations);
    groups += c.groups;
    skipped += r.skipped_validations;
    waits += r.enforcement_waits;
  }
  std::printf(
      "random meshes 4 x 4, adaptive window, P = 10, delay 30 ms at p = 0.1: %lld "
      "groups, %lld enforcement waits, %lld skipped validations\n",
      static_cast<long long>(groups), static_cast<long long>(waits),
      static_cast<long long>(skipped));
  EXPECT_LT(static_cast<double>(skipped), 0.1 * static_cast<double>(groups));
}

// Item 7: pipelines {0, 1} and {2, 3} arrive in two clusters far apart; their natural groups never
// bridge the two sides, so the scheduler holds the candidate back until it does, within P syncs.
TEST(SdpipeScheduler, WaitOnInvalidBridgesAPartition) {
  MeshSimConfig m;
  m.scheduler = fixed(1, 4, 0.005, 2);
  m.iterations = 30;
  m.extra = [](int, int replica, int64_t k, bool backward) {
    return k == 0 && !backward && replica >= 2 ? 0.015 : 0.0;  // the second pair runs behind
  };
  const MeshSimResult r = simulate_mesh(m);
  ASSERT_FALSE(r.deadlock);
  EXPECT_GT(r.enforcement_waits, 0);
  const TraceCheck c = check_sync_trace(r.trace, 4, 2);
  EXPECT_TRUE(c.violations.empty()) << c.violations.front();
  // Without validation the same arrivals never bridge.
  MeshSimConfig off = m;
  off.scheduler.history = 0;
  const MeshSimResult u = simulate_mesh(off);
  bool bridged = false;
  for (const Group& g : u.groups) {
    bridged = bridged || (g.members.front() < 2 && g.members.back() >= 2);
  }
  EXPECT_FALSE(bridged);
  // With it, every checked group bridges with the one before it (P = 2).
  int bridging = 0;
  for (size_t i = 1; i < r.groups.size(); ++i) {
    const GroupCheck c2 = r.groups[i].check;
    if (c2 != GroupCheck::kValid && c2 != GroupCheck::kEnforced) continue;
    ++bridging;
    EXPECT_TRUE(connects_all(
        4, std::vector<std::vector<int>>{r.groups[i - 1].members, r.groups[i].members}))
        << "groups " << i << " and " << i + 1;
  }
  EXPECT_GT(bridging, 20);
}

// Item 8: the deadlock of Fig. 3 on 2 pipelines (A = 0, B = 1) x 2 stages, scripted. At
// iteration 2 worker (stage 1, A) and worker (stage 0, B) are slow before their backward, so
// both stages form singletons, and with P = 2 the second singleton of each stage cannot connect:
// stage 1 holds (1, A) back for (1, B), which needs the forward of (0, B), which stage 0 holds
// back for (0, A), which needs the backward of (1, A): a cycle. The token lets one stage wait
// and the other accept its group unchecked, and training goes on.
MeshSimConfig figure3(bool token) {
  MeshSimConfig m;
  m.scheduler = fixed(2, 2, 0.05, 2);
  m.scheduler.token = token;
  m.iterations = 6;
  m.extra = [](int stage, int replica, int64_t k, bool backward) {
    if (k != 2 || !backward) return 0.0;
    if (stage == 1 && replica == 0) return 0.3;
    if (stage == 0 && replica == 1) return 0.8;
    return 0.0;
  };
  return m;
}

TEST(SdpipeScheduler, Figure3DeadlocksWithoutTheTokenAndNotWithIt) {
  const MeshSimResult off = simulate_mesh(figure3(false));
  ASSERT_TRUE(off.deadlock);
  EXPECT_EQ(off.blocked.size(), 4u);
  for (const std::string& b : off.blocked) std::printf("token off: %s\n", b.c_str());
  const MeshSimResult on = simulate_mesh(figure3(true));
  EXPECT_FALSE(on.deadlock) << (on.blocked.empty() ? "" : on.blocked.front());
  EXPECT_GE(on.skipped_validations, 1);
  const TraceCheck c = check_sync_trace(on.trace, 2, 2);
  EXPECT_TRUE(c.violations.empty()) << c.violations.front();
  EXPECT_EQ(c.skipped, on.skipped_validations);
}

// Random delays on 2 x 2 and 4 x 4 meshes: with the token nothing ever deadlocks; without it
// some runs do.
TEST(SdpipeScheduler, TokenPreventsDeadlocksUnderRandomDelays) {
  int deadlocks_off = 0, deadlocks_on = 0, runs = 0;
  for (int n : {2, 4}) {
    for (uint64_t seed = 0; seed < 25; ++seed) {
      MeshSimConfig m = random_mesh(n, n, 2, seed, false);
      m.p = 0.3;
      m.delay = 0.05;
      m.scheduler.window = 0.002;
      deadlocks_off += simulate_mesh(m).deadlock ? 1 : 0;
      m.scheduler.token = true;
      deadlocks_on += simulate_mesh(m).deadlock ? 1 : 0;
      ++runs;
    }
  }
  std::printf("%d random meshes: %d deadlocks with the token off, %d with it on\n", runs,
              deadlocks_off, deadlocks_on);
  EXPECT_EQ(deadlocks_on, 0);
  EXPECT_GT(deadlocks_off, 0);
}

// Item 15: the trace round-trips through JSON, the offline check catches what it should, and a
// replay through a new scheduler decides what the run decided.
TEST(SdpipeTrace, RoundTripCheckAndReplay) {
  MeshSimConfig m = random_mesh(2, 4, 3, 5, true);
  SchedulerConfig adaptive = m.scheduler;
  adaptive.window_kind = WindowKind::kAuto;
  m.scheduler = adaptive;
  const MeshSimResult r = simulate_mesh(m);
  ASSERT_FALSE(r.deadlock);
  std::vector<TraceEvent> parsed;
  for (const TraceEvent& e : r.trace) {
    parsed.push_back(parse_trace_event(trace_event_json(e)));
    EXPECT_EQ(trace_event_json(parsed.back()), trace_event_json(e));
  }
  EXPECT_TRUE(check_sync_trace(parsed, 4, 3).violations.empty());
  const std::vector<std::string> replay = replay_sync_trace(parsed, adaptive);
  EXPECT_TRUE(replay.empty()) << replay.front();
  // A replay under another window decides otherwise.
  SchedulerConfig other = adaptive;
  other.window_kind = WindowKind::kInfinite;
  EXPECT_FALSE(replay_sync_trace(parsed, other).empty());
  // A group marked valid that does not connect, and a READY never answered, are caught.
  std::vector<TraceEvent> bad = parsed;
  for (TraceEvent& e : bad) {
    if (e.event == "group" && e.clock > 5 && e.members.size() > 1) {
      e.members = {e.members.front()};
      e.check = "valid";
      break;
    }
  }
  TraceEvent lost;
  lost.event = "ready";
  lost.stage = 0;
  lost.replica = 1;
  lost.iteration = 99;
  bad.push_back(lost);
  const TraceCheck c = check_sync_trace(bad, 4, 3);
  EXPECT_GE(c.violations.size(), 2u);
}

// A READY that says "pause" (every rank meets after that update: the trainer's log points): a
// replica grouped with it sends nothing more until the others are there too, so a candidate that
// needs it is accepted (skipped-paused) instead of held back for ever; its next READY counts
// again. Without the flag the same arrivals hold the last replica back (the hang it prevents).
TEST(SdpipeScheduler, PausedReplicasAreNotWaitedFor) {
  for (bool pause : {true, false}) {
    GroupScheduler s(fixed(1, 3, 0.01, 2));
    for (int r = 0; r < 3; ++r) s.ready(0, r, 0, false, 0.0);
    EXPECT_TRUE(s.ready(0, 0, 1, false, 1.0, pause).empty());
    EXPECT_TRUE(s.ready(0, 1, 1, false, 1.0, pause).empty());
    const std::vector<Group> pair = s.poll(1.02);
    ASSERT_EQ(pair.size(), 1u);
    EXPECT_EQ(pair[0].members, std::vector<int>({0, 1}));
    EXPECT_EQ(pair[0].check, GroupCheck::kValid);
    const std::vector<Group> late = s.ready(0, 2, 1, false, 1.5, pause);
    if (!pause) {
      EXPECT_TRUE(late.empty());
      EXPECT_TRUE(s.poll(1.52).empty());
      EXPECT_TRUE(s.waiting(0));  // for replicas 0 and 1, which wait at the barrier
      continue;
    }
    ASSERT_EQ(late.size(), 1u);
    EXPECT_EQ(late[0].members, std::vector<int>({2}));
    EXPECT_EQ(late[0].check, GroupCheck::kSkippedPaused);
    EXPECT_FALSE(s.waiting(0));
    // After the barrier every replica counts again: a round closes only with all three.
    EXPECT_TRUE(s.ready(0, 0, 2, false, 2.0).empty());
    EXPECT_TRUE(s.ready(0, 1, 2, false, 2.0).empty());
    const std::vector<Group> all = s.ready(0, 2, 2, false, 2.0);
    ASSERT_EQ(all.size(), 1u);
    EXPECT_EQ(all[0].members, std::vector<int>({0, 1, 2}));
    EXPECT_EQ(all[0].check, GroupCheck::kValid);
  }
}

TEST(SdpipeScheduler, RejectsReadyFromUnknownOrFinishedReplicas) {
  GroupScheduler s(fixed(1, 2, 0.0));
  EXPECT_THROW(s.ready(1, 0, 0, false, 0.0), Error);
  EXPECT_THROW(s.ready(0, 2, 0, false, 0.0), Error);
  s.ready(0, 0, 0, true, 0.0);
  EXPECT_THROW(s.ready(0, 0, 1, false, 0.1), Error);
}

}  // namespace
}  // namespace strata::parallel::sdpipe
