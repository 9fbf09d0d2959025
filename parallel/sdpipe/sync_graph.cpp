// The sync graph: union-find with union by rank and path halving; the trace as JSON Lines.
#include "parallel/sdpipe/sync_graph.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/check.h"

namespace strata::parallel::sdpipe {

DisjointSets::DisjointSets(int n)
    : parent_(static_cast<size_t>(n)), rank_(static_cast<size_t>(n), 0), components_(n) {
  for (int i = 0; i < n; ++i) parent_[i] = i;
}

int DisjointSets::find(int x) {
  while (parent_[x] != x) {
    parent_[x] = parent_[parent_[x]];
    x = parent_[x];
  }
  return x;
}

void DisjointSets::unite(int a, int b) {
  a = find(a);
  b = find(b);
  if (a == b) return;
  if (rank_[a] < rank_[b]) std::swap(a, b);
  parent_[b] = a;
  if (rank_[a] == rank_[b]) ++rank_[a];
  --components_;
}

namespace {

template <typename Groups>
bool connects(int n, const Groups& groups) {
  DisjointSets sets(n);
  for (const std::vector<int>& g : groups) {
    for (size_t i = 1; i < g.size(); ++i)
      sets.unite(g[0], g[i]);  // a complete graph's spanning tree
  }
  return sets.components() == 1;
}

}  // namespace

bool connects_all(int n, const std::deque<std::vector<int>>& groups) { return connects(n, groups); }
bool connects_all(int n, const std::vector<std::vector<int>>& groups) {
  return connects(n, groups);
}

std::vector<double> mixing_matrix(int n, const std::vector<int>& members) {
  std::vector<double> w(static_cast<size_t>(n) * n, 0.0);
  std::vector<bool> in(static_cast<size_t>(n), false);
  for (int m : members) in[m] = true;
  const double share = 1.0 / static_cast<double>(members.size());
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) {
      if (in[u] && in[v]) {
        w[u * n + v] = share;
      } else if (u == v) {
        w[u * n + v] = 1.0;
      }
    }
  }
  return w;
}

std::string trace_event_json(const TraceEvent& e) {
  nlohmann::json j;
  j["event"] = e.event;
  j["stage"] = e.stage;
  if (e.event == "ready") {
    j["replica"] = e.replica;
    j["iteration"] = e.iteration;
    j["last"] = e.last;
    if (e.pause) j["pause"] = true;
  } else if (e.event == "hold") {
    j["members"] = e.members;
  } else {
    j["clock"] = e.clock;
    j["members"] = e.members;
    j["iterations"] = e.iterations;
    j["check"] = e.check;
    // JSON has no infinity: a window of every replica is written as null.
    if (std::isfinite(e.window)) {
      j["window"] = e.window;
    } else {
      j["window"] = nullptr;
    }
  }
  j["t"] = e.t;
  return j.dump();
}

TraceEvent parse_trace_event(const std::string& line) {
  TraceEvent e;
  try {
    const nlohmann::json j = nlohmann::json::parse(line);
    e.event = j.at("event").get<std::string>();
    e.stage = j.at("stage").get<int>();
    e.t = j.at("t").get<double>();
    if (e.event == "ready") {
      e.replica = j.at("replica").get<int>();
      e.iteration = j.at("iteration").get<int64_t>();
      e.last = j.value("last", false);
      e.pause = j.value("pause", false);
    } else if (e.event == "hold") {
      e.members = j.at("members").get<std::vector<int>>();
    } else if (e.event == "group") {
      e.clock = j.at("clock").get<int64_t>();
      e.members = j.at("members").get<std::vector<int>>();
      e.iterations = j.value("iterations", std::vector<int64_t>{});
      e.check = j.at("check").get<std::string>();
      e.window = j.at("window").is_null() ? std::numeric_limits<double>::infinity()
                                          : j.at("window").get<double>();
    } else {
      STRATA_THROW() << "unknown event " << e.event;
    }
  } catch (const nlohmann::json::exception& x) {
    STRATA_THROW() << "sync trace line \"" << line << "\": " << x.what();
  }
  return e;
}

std::vector<TraceEvent> read_sync_trace(const std::string& path) {
  std::ifstream in(path);
  STRATA_CHECK(in.good()) << "sync trace " << path << ": cannot open it";
  std::vector<TraceEvent> events;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    try {
      events.push_back(parse_trace_event(line));
    } catch (const Error& e) {
      STRATA_THROW() << "sync trace " << path << " line " << number << ": " << e.message();
    }
  }
  return events;
}

TraceCheck check_sync_trace(const std::vector<TraceEvent>& events, int replicas, int history) {
  TraceCheck c;
  auto violation = [&c](const std::string& s) {
    if (c.violations.size() < 20) c.violations.push_back(s);
  };
  // Per stage: the replicas waiting for a group (ready, not yet grouped), and the groups so far.
  std::map<int, std::set<int>> waiting;
  std::map<int, std::vector<std::vector<int>>> groups;
  int64_t members = 0;
  for (const TraceEvent& e : events) {
    if (e.event == "ready") {
      ++c.readies;
      if (e.replica < 0 || e.replica >= replicas) {
        violation("stage " + std::to_string(e.stage) + ": READY from replica " +
                  std::to_string(e.replica) + " outside the " + std::to_string(replicas));
        continue;
      }
      if (!waiting[e.stage].insert(e.replica).second) {
        violation("stage " + std::to_string(e.stage) + ": replica " + std::to_string(e.replica) +
                  " was ready twice before being grouped (iteration " +
                  std::to_string(e.iteration) + ")");
      }
      continue;
    }
    if (e.event == "hold") {
      ++c.holds;
      continue;
    }
    ++c.groups;
    members += static_cast<int64_t>(e.members.size());
    const std::string where =
        "stage " + std::to_string(e.stage) + " group " + std::to_string(e.clock);
    for (int m : e.members) {
      if (waiting[e.stage].erase(m) == 0) {
        violation(where + ": replica " + std::to_string(m) + " was not ready");
      }
    }
    std::vector<std::vector<int>>& past = groups[e.stage];
    const bool validated = e.check == "valid" || e.check == "enforced";
    if (validated) ++c.validated;
    if (e.check == "skipped-token" || e.check == "skipped-finished" ||
        e.check == "skipped-paused") {
      ++c.skipped;
    }
    if (validated && history > 0) {
      const size_t from = past.size() >= static_cast<size_t>(history - 1)
                              ? past.size() - static_cast<size_t>(history - 1)
                              : 0;
      std::vector<std::vector<int>> window(past.begin() + static_cast<std::ptrdiff_t>(from),
                                           past.end());
      window.push_back(e.members);
      if (!connects_all(replicas, window)) {
        violation(where + " was accepted as " + e.check + " but does not connect the " +
                  std::to_string(replicas) + " replicas with the groups before it");
      }
    }
    past.push_back(e.members);
  }
  for (const auto& [stage, left] : waiting) {
    for (int r : left) {
      violation("stage " + std::to_string(stage) + ": replica " + std::to_string(r) +
                " was ready but never grouped");
    }
  }
  c.mean_group = c.groups > 0 ? static_cast<double>(members) / static_cast<double>(c.groups) : 0;
  return c;
}

}  // namespace strata::parallel::sdpipe
