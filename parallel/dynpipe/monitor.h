// DynPipe's runtime monitor (papers/dynpipe.md Sec. 2.1 and Sec. 5 item 10): every stage samples
// its own statistics every --monitor-interval-ms of wall time (compute seconds, steps, and the
// CPU counters of colocation.h over the interval), and the latest sample of every rank reaches
// the manager without a message of its own: it rides on the step-metrics all-reduce the trainer
// makes after every step (each rank writes its latest sample into its own slot, the others add
// zeros), so every rank, the manager included, holds every stage's latest sample after each step.
//
// Sampling is checked at step ends: a sample covers the time since the last one and is taken at
// the first step end at least one interval after it, so with steps shorter than the interval
// there is one sample per interval, with longer steps one per step (a sample is never older than
// a step when it reaches the manager; the paper piggy-backs on activations, i.e. within a
// micro-batch).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "parallel/dynpipe/colocation.h"

namespace strata::parallel::dynpipe {

struct MonitorSample {
  int64_t seq = 0;  // this rank's sample count (1, 2, ...); 0: none yet
  int rank = 0, stage = 0, group = 0;
  int64_t step = 0;           // optimizer steps done when it was taken
  double seconds = 0.0;       // the interval it covers (wall)
  double busy_seconds = 0.0;  // the rank's compute instructions in it
  int64_t steps = 0;          // step ends in it
  CpuCounters counters;       // the machine's and this process's (colocation.h)
  // The counters by name (counter_names()), as the slowdown model reads them.
  std::map<std::string, double> counter_map() const;
};

class StageMonitor {
 public:
  // interval_ms > 0. `world`: the ranks of the all-reduce.
  StageMonitor(double interval_ms, int rank, int stage, int group, int world);
  // Values per rank in the all-reduce.
  static constexpr size_t kWidth = 14;  // 8 + counter_names()
  // After step `step` (from 0) with `busy_seconds` of compute: this rank's share of the all-reduce
  // (world x kWidth values, its latest sample in its slot).
  std::vector<double> contribution(int64_t step, double busy_seconds);
  // The sum: every rank's latest sample. Returns the samples that are new since the last call.
  std::vector<MonitorSample> absorb(const std::vector<double>& sum);
  // Every rank's latest sample (seq 0: none yet), by rank.
  const std::vector<MonitorSample>& latest() const { return latest_; }
  size_t width() const { return kWidth * static_cast<size_t>(world_); }

 private:
  double interval_s_;
  int rank_, stage_, group_, world_;
  bool started_ = false;
  CpuSnapshot last_;
  double busy_ = 0.0;
  int64_t steps_ = 0;
  MonitorSample mine_;
  std::vector<MonitorSample> latest_;
};

}  // namespace strata::parallel::dynpipe
