// The grouped all-reduce's events of a run on local threads (parallel/grouped_dp.h: every rank in
// this process), turned into how much of the all-reduce the ranks did not wait for.
//
//   hidden       per rank (group, stage), the all-reduce time (the union of the spans its
//                all-reduces ran, on the communication thread and the buffers' channel) during
//                which the rank's executor was not blocked waiting for all-reduces, over all
//                all-reduce time: the part that overlapped compute (this step's backward, or
//                with --dp-delay the next steps).
//   in backward  the part of each update's all-reduce time before that update's last Backward in
//                the group ended (the paper's overlap: all-reduces of the last partitions during
//                the backward of the first ones; all-reduce time of a delayed update that runs
//                during the next step counts as not in backward).
//   waited       the time a rank's executor was blocked for all-reduces, ms per update.
// Updates before `first_update` (warm-up) are left out.
#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "parallel/grouped_dp.h"

namespace strata::bench {

class GradSyncRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  void record(const parallel::GradSyncEvent& e) {
    using Event = parallel::GradSyncEvent;
    std::lock_guard<std::mutex> lock(mutex_);
    const Key key{e.group, e.stage, e.update, e.bucket};
    switch (e.kind) {
      case Event::kBackwardEnd: {
        // Backward ends carry the next update's number: the update whose gradient they produce.
        auto& t = backward_end_[{e.update, e.group}];
        t = std::max(t, e.time);
        break;
      }
      case Event::kStart:
        open_[key] = e.time;
        break;
      case Event::kEnd:
        if (open_.count(key)) spans_.push_back({key, open_[key], e.time});
        break;
      case Event::kWaitBegin:
        waiting_[key] = e.time;
        break;
      case Event::kWaitEnd:
        if (waiting_.count(key)) waits_.push_back({key, waiting_[key], e.time});
        break;
      case Event::kLaunch:
        break;
    }
  }

  struct Overlap {
    double hidden = 0.0;        // fraction of all-reduce time not waited for
    double in_backward = 0.0;   // fraction of all-reduce time before the update's backward end
    double waited_ms = 0.0;     // per rank and update: time blocked for all-reduces
    double allreduce_ms = 0.0;  // per rank and update: all-reduce time (union of spans)
  };

  Overlap overlap(int64_t first_update) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::map<std::pair<int, int>, Intervals> busy, blocked;  // per (group, stage)
    double total_in_backward = 0.0, total_spans = 0.0;
    int64_t last_update = first_update;
    for (const Span& sp : spans_) {
      const auto [group, stage, update, bucket] = sp.key;
      if (update < first_update) continue;
      last_update = std::max(last_update, update);
      busy[{group, stage}].push_back({sp.start, sp.end});
      total_spans += seconds(sp.end - sp.start);
      const auto be = backward_end_.find({update, group});
      if (be != backward_end_.end() && be->second > sp.start) {
        total_in_backward += seconds(std::min(sp.end, be->second) - sp.start);
      }
    }
    for (const Span& w : waits_) {
      const auto [group, stage, update, bucket] = w.key;
      if (update >= first_update) blocked[{group, stage}].push_back({w.start, w.end});
    }
    double all = 0.0, exposed = 0.0, waited = 0.0;
    for (auto& [rank, intervals] : busy) {
      const Intervals b = merged(intervals);
      const Intervals w = merged(blocked[rank]);
      all += length(b);
      waited += length(w);
      exposed += intersection(b, w);
    }
    Overlap o;
    const double ranks_updates =
        static_cast<double>(std::max<size_t>(1, busy.size())) *
        static_cast<double>(std::max<int64_t>(1, last_update - first_update + 1));
    o.hidden = all > 0 ? 1.0 - exposed / all : 0.0;
    o.in_backward = total_spans > 0 ? total_in_backward / total_spans : 0.0;
    o.waited_ms = 1e3 * waited / ranks_updates;
    o.allreduce_ms = 1e3 * all / ranks_updates;
    return o;
  }

 private:
  using Key = std::tuple<int, int, int64_t, int>;  // (group, stage, update, bucket)
  using Intervals = std::vector<std::pair<Clock::time_point, Clock::time_point>>;
  struct Span {
    Key key;
    Clock::time_point start, end;
  };
  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  static Intervals merged(Intervals v) {
    std::sort(v.begin(), v.end());
    Intervals out;
    for (const auto& i : v) {
      if (!out.empty() && i.first <= out.back().second) {
        out.back().second = std::max(out.back().second, i.second);
      } else {
        out.push_back(i);
      }
    }
    return out;
  }
  static double length(const Intervals& v) {
    double s = 0.0;
    for (const auto& i : v) s += seconds(i.second - i.first);
    return s;
  }
  // Measure of the intersection of two merged lists.
  static double intersection(const Intervals& a, const Intervals& b) {
    double s = 0.0;
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
      const auto lo = std::max(a[i].first, b[j].first);
      const auto hi = std::min(a[i].second, b[j].second);
      if (lo < hi) s += seconds(hi - lo);
      (a[i].second < b[j].second ? i : j)++;
    }
    return s;
  }

  mutable std::mutex mutex_;
  std::map<std::pair<int64_t, int>, Clock::time_point> backward_end_;  // (update, group)
  std::map<Key, Clock::time_point> open_, waiting_;
  std::vector<Span> spans_, waits_;
};

}  // namespace strata::bench
