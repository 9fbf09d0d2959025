// Timeline of every instruction on every rank, written as a Chrome trace (JSON "traceEvents",
// viewable in Perfetto or chrome://tracing): one process per rank, a "compute" thread for
// Forward/Backward/ReduceGrads/OptimizerStep, a "comm" thread for the send and receive
// instructions (posting a send; waiting for a receive), and a "transfers" thread with one span
// per message from its posting to its completion (category "transfer", args: micro_batch, stage,
// peer), a "dp all-reduce" thread and a "swap" thread (copies of saved tensors to the host pool
// and back), each event named by its instruction and carrying the micro-batch id. A transfer span
// that overlaps a compute event shows communication hidden behind compute.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/schedule/schedule.h"

namespace strata::parallel {

class Trace {
 public:
  Trace(int rank, int group, int stage);
  void record(const Instruction& instruction, std::chrono::steady_clock::time_point start,
              std::chrono::steady_clock::time_point end);
  // A message of a send or receive instruction in flight, from posting to completion; `peer` is
  // the other stage.
  void record_transfer(const Instruction& instruction, int peer,
                       std::chrono::steady_clock::time_point posted,
                       std::chrono::steady_clock::time_point completed);
  static constexpr int kTransferLane = 2;  // the "transfers" thread of the trace
  static constexpr int kGradSyncLane = 3;  // the "dp all-reduce" thread of the trace
  static constexpr int kSwapLane = 4;      // the "swap" thread: copies to and from host memory
  // A named span that is not an instruction (an evaluation, a data wait, an all-reduce), on
  // lane 0 (compute), 1 (comm), kGradSyncLane or kSwapLane. Thread-safe.
  void record_span(const std::string& name, std::chrono::steady_clock::time_point start,
                   std::chrono::steady_clock::time_point end, int lane = 0);
  size_t size() const;
  // This rank's events as JSON objects joined by commas (no brackets), for merging.
  std::string events_json() const;

  // Writes a complete trace file from the events_json() of every rank (errors name the path).
  static void write_file(const std::string& path, const std::vector<std::string>& rank_events);

 private:
  struct Event {
    std::string name;
    int64_t micro_batch;
    int lane;  // 0 compute, 1 communication instructions, 2 transfers, 3 grouped dp all-reduce,
               // 4 swap
    double start_us, duration_us;
    int peer = -1;  // transfers: the other stage
  };
  double micros(std::chrono::steady_clock::time_point t) const;

  int rank_, group_, stage_;
  std::chrono::steady_clock::time_point origin_;
  int64_t origin_system_us_;  // wall-clock microseconds at origin_, to align ranks
  mutable std::mutex mutex_;
  std::vector<Event> events_;
};

}  // namespace strata::parallel
