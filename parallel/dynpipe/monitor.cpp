#include "parallel/dynpipe/monitor.h"

#include <chrono>
#include <cmath>

#include "engine/check.h"

namespace strata::parallel::dynpipe {

std::map<std::string, double> MonitorSample::counter_map() const {
  std::map<std::string, double> out;
  const std::vector<std::string> names = counter_names();
  const std::vector<double> values = counter_values(counters);
  for (size_t i = 0; i < names.size(); ++i) out[names[i]] = values[i];
  return out;
}

StageMonitor::StageMonitor(double interval_ms, int rank, int stage, int group, int world)
    : interval_s_(interval_ms / 1000.0),
      rank_(rank),
      stage_(stage),
      group_(group),
      world_(world),
      latest_(static_cast<size_t>(world)) {
  STRATA_CHECK(interval_ms > 0) << "--monitor-interval-ms must be positive, got " << interval_ms;
  STRATA_CHECK(world >= 1 && rank >= 0 && rank < world)
      << "monitor: rank " << rank << " of " << world;
}

std::vector<double> StageMonitor::contribution(int64_t step, double busy_seconds) {
  if (!started_) {
    // The first step end starts the first interval (the run's first step is left out).
    started_ = true;
    last_ = read_cpu_snapshot();
  } else {
    busy_ += busy_seconds;
    ++steps_;
    // /proc is read only when an interval is over (the clock is read_cpu_snapshot's).
    const double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    if (t - last_.seconds >= interval_s_) {
      const CpuSnapshot now = read_cpu_snapshot();
      MonitorSample s;
      s.seq = mine_.seq + 1;
      s.rank = rank_;
      s.stage = stage_;
      s.group = group_;
      s.step = step + 1;
      s.seconds = now.seconds - last_.seconds;
      s.busy_seconds = busy_;
      s.steps = steps_;
      // The run queue: the mean of its two readings (the interval's ends).
      s.counters = counters_between(
          last_, now, 0.5 * static_cast<double>(last_.procs_running + now.procs_running));
      mine_ = s;
      last_ = now;
      busy_ = 0.0;
      steps_ = 0;
    }
  }
  std::vector<double> out(width(), 0.0);
  double* v = out.data() + kWidth * static_cast<size_t>(rank_);
  const std::vector<double> c = counter_values(mine_.counters);
  const double head[] = {static_cast<double>(mine_.seq),
                         static_cast<double>(mine_.stage),
                         static_cast<double>(mine_.group),
                         static_cast<double>(mine_.step),
                         mine_.seconds,
                         mine_.busy_seconds,
                         static_cast<double>(mine_.steps),
                         1.0};
  size_t k = 0;
  for (double h : head) v[k++] = h;
  for (double x : c) v[k++] = x;
  STRATA_CHECK_EQ(k, kWidth) << "monitor sample width";
  return out;
}

std::vector<MonitorSample> StageMonitor::absorb(const std::vector<double>& sum) {
  STRATA_CHECK_EQ(sum.size(), width()) << "monitor samples";
  std::vector<MonitorSample> fresh;
  for (int r = 0; r < world_; ++r) {
    const double* v = sum.data() + kWidth * static_cast<size_t>(r);
    MonitorSample s;
    s.seq = static_cast<int64_t>(std::llround(v[0]));
    s.rank = r;
    s.stage = static_cast<int>(std::llround(v[1]));
    s.group = static_cast<int>(std::llround(v[2]));
    s.step = static_cast<int64_t>(std::llround(v[3]));
    s.seconds = v[4];
    s.busy_seconds = v[5];
    s.steps = static_cast<int64_t>(std::llround(v[6]));
    STRATA_CHECK(std::llround(v[7]) == 1)
        << "monitor: rank " << r << "'s slot was written " << v[7] << " times";
    s.counters = counters_from_values(std::vector<double>(v + 8, v + kWidth));
    MonitorSample& held = latest_[static_cast<size_t>(r)];
    if (s.seq > held.seq) fresh.push_back(s);
    held = s;
  }
  return fresh;
}

}  // namespace strata::parallel::dynpipe
