// The discrete-event simulator: the executor's instruction lists (parallel/schedule) for every
// rank of G groups x S stages, run against a cost model (cost_model.h) on a cluster (cluster.h).
//
// What each instruction does to the simulated clocks (rank r = g * S + s, one clock per rank):
//   Forward(mb)     the stage's layers' forward times for the micro-batch's rows.
//   Backward(mb)    their backward times, plus the forward of the recomputed layers; waits for
//                   the micro-batch's SwapIn when some of its tape was swapped. In the backward
//                   pass that ends an update (the last before ReduceGrads) with G > 1 and overlap
//                   on, each gradient bucket is launched when its last layer's backward ends.
//   SendAct/Grad    posts a message (asynchronous): it leaves when the link is free (messages on
//                   one link direction go one at a time, in order) and arrives latency +
//                   bytes / bandwidth later.
//   RecvAct/Grad    waits for the message's arrival.
//   ReduceGrads     G > 1: launches the buckets not launched yet; with overlap off it first waits
//                   for every stage of its group to reach ReduceGrads (the executor's barrier).
//   OptimizerStep   waits for this stage's all-reduces of the update (D = 0) or of update u - D
//                   (--dp-delay D), then for the tied-parameter all-reduce between the first and
//                   last stage when a tied parameter is split between them, then updates
//                   (cost model: seconds per parameter byte).
//   SwapIn(mb)      (inserted by the simulator before the Backward(mb) of a stage with swapped
//                   layers, `swap_prefetch` compute instructions ahead, as the runtime's opcode
//                   will be) starts the host-to-device copy of the micro-batch's swapped tape on
//                   the stage's copy engine once its SwapOut (device-to-host, started when the
//                   forward ends) is done.
//   end of a step   every rank meets the others (the trainer sums the step's metrics over the
//                   world), then takes the cost model's per-step overhead.
// The data-parallel all-reduce of bucket b of stage s is one collective of the G ranks holding
// stage s (ring or tree, collectives.h): it starts when every one of them has launched it and the
// stage's previous all-reduce is done (one communication thread per stage, in launch order).
//
// Times are exact for the event model: a rank's next instruction starts at the max of its clock
// and the times it waits for, so the order in which ranks are advanced changes no time (as in
// check_schedule's simulation). Groups whose stages are joined by the same link classes behave
// identically, so one group per class of links is simulated and stands for the others
// (SimConfig::dedupe_groups; the collectives still count every group).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/grouped_dp.h"
#include "parallel/partition/partition.h"
#include "parallel/schedule/schedule.h"
#include "parallel/sim/collectives.h"
#include "parallel/sim/cost_model.h"
#include "parallel/sim/memory.h"

namespace strata::parallel::sim {

// The simulator's instructions: the executor's (OpCode) and those the runtime is getting.
enum class SimOp : uint8_t {
  kRecvAct,
  kForward,
  kSendAct,
  kRecvGrad,
  kBackward,
  kSendGrad,
  kReduceGrads,
  kOptimizerStep,
  kSwapIn,   // prefetch of a micro-batch's swapped tape
  kStepEnd,  // the end of a step: every rank meets
};
const char* sim_op_name(SimOp op);
// The executor's opcode as the simulator's (every OpCode has one).
SimOp to_sim_op(OpCode op);

struct SimInstruction {
  SimOp op = SimOp::kForward;
  int64_t micro_batch = -1;
};

struct SimConfig {
  int groups = 1;
  int stages = 1;
  int64_t micro_batches = 1;    // per step and group
  double micro_batch_rows = 1;  // samples per micro-batch
  ScheduleKind schedule = ScheduleKind::k1F1B;
  Partition partition;               // one layer range per stage
  std::vector<MemoryPolicy> policy;  // one per layer; empty: keep
  GradSyncConfig grad_sync;          // overlap, bucket MiB, delay
  AllReduceAlgorithm all_reduce = AllReduceAlgorithm::kRing;
  int optimizer_slots = 2;
  bool mixed_precision = false;
  int swap_prefetch = 1;      // SwapIn(mb) goes this many compute instructions before Backward(mb)
  int receive_lookahead = 4;  // receive buffers are allocated this many instructions ahead
  // The first stage's input micro-batch is in the stage's memory (a device: the upload). False
  // on the CPU, where the data loader's batches come from an allocator of their own.
  bool input_on_device = true;
  // Steps to simulate; 0: 1, or D + 2 with --dp-delay D (the last one is reported, so that
  // all-reduces carried over from earlier steps are in it). async-1f1b, 2bw: one run of M.
  int steps = 0;
  bool dedupe_groups = true;
  bool record_timeline = false;
};

// One span of the simulated timeline (seconds from the start), as parallel/trace.h lays them out.
struct TimelineEvent {
  enum Lane { kCompute = 0, kComm = 1, kTransfer = 2, kGradSync = 3, kSwap = 4 };
  int rank = 0;
  Lane lane = kCompute;
  std::string name;  // "Forward", "SendAct", "all-reduce bucket 0", "SwapIn", ...
  int64_t micro_batch = -1;
  double start = 0.0, end = 0.0;
  int peer = -1;  // transfers: the other stage
};

struct StageResult {
  int stage = 0;
  LayerRange layers;
  double forward_s = 0.0;   // per micro-batch
  double backward_s = 0.0;  // per micro-batch, recompute included
  double optimizer_s = 0.0;
  double busy_s = 0.0;  // compute in the reported step (mean over the stage's ranks)
  double idle_fraction = 0.0;
  StageStatic static_memory;
  MicroBatchMemory micro_batch;
  double peak_bytes = 0.0;  // the most simulated bytes at any time (max over the stage's ranks)
  int64_t max_in_flight = 0;
  double p2p_wait_s = 0.0;      // time blocked in receives, reported step
  double p2p_exposed_s = 0.0;   // of which the message was in transit (not the peer's lateness)
  double dp_seconds = 0.0;      // data-parallel all-reduce time, reported step
  double dp_exposed_s = 0.0;    // the optimizer step waited for it
  double tied_exposed_s = 0.0;  // the optimizer step waited for the tied all-reduce
  double swap_exposed_s = 0.0;  // backwards waited for SwapIn
};

struct SimResult {
  double step_time_s = 0.0;  // the reported step (async-1f1b, 2bw: the run of M micro-batches)
  double makespan_s = 0.0;   // every simulated step
  double bubble = 0.0;       // mean idle fraction of the ranks in the reported step
  std::vector<StageResult> stages;
  double peak_bytes = 0.0;              // over stages
  int simulated_groups = 0;             // groups actually run (dedupe)
  int64_t instructions = 0;             // executed
  std::vector<TimelineEvent> timeline;  // record_timeline: every rank's, every step
  // The instruction order each simulated rank executed (record_timeline), by world rank.
  std::vector<std::vector<SimInstruction>> executed;
  // Per world rank (record_timeline): bytes in use over time beyond the whole-run memory,
  // (time, bytes after the change) in time order.
  std::vector<std::vector<std::pair<double, double>>> memory;
};

// Throws strata::Error for a layout the cluster cannot hold (more ranks than GPUs), a partition
// that is not one range per stage over the cost model's layers, or an invalid schedule.
SimResult simulate(const SimConfig& config, const CostModel& costs, const Cluster& cluster);

// The instruction lists of every stage for the config's steps (SwapIn and step ends included).
std::vector<std::vector<SimInstruction>> stage_programs(const SimConfig& config,
                                                        const CostModel& costs, int steps);

}  // namespace strata::parallel::sim
