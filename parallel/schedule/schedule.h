// Pipeline schedules as data: for every stage, the list of instructions it executes.
//
// The same lists drive the executor (parallel/runtime/executor.h), the checker below, the tests and
// the simulator. A micro-batch is named by its global index: step * M + i for the synchronous
// schedules (one list per stage and step), and a running count for the asynchronous one (one list
// per stage for a whole run of N micro-batches, no flush).
//
//   gpipe       all forwards, then all backwards, then ReduceGrads and OptimizerStep (GPipe).
//   1f1b        S - s - 1 warm-up forwards on stage s, then one forward / one backward
//               alternately, then the remaining backwards; flush at the end of the step
//               (PipeDream-Flush / DAPPLE).
//   async-1f1b  PipeDream's asynchronous 1F1B: no flush; after each backward the stage updates
//               its weights (ReduceGrads, OptimizerStep), and a micro-batch's backward uses the
//               weights its forward saw (weight stashing). Stage s keeps at most S - s
//               micro-batches in flight.
//   2bw         PipeDream-2BW (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN
//               Training"): async-1f1b's order without flushes, but one update (ReduceGrads,
//               OptimizerStep) after every M-th backward, the gradients of the step's M
//               micro-batches coalesced. Every stage runs the micro-batches of step t on the
//               weights of t - 1 updates (W(t-1); step 0 on W(0)), so the update is delayed by
//               one: W(t+1) = W(t) - lr * g(W(t-1)). A stage holds two weight versions at most:
//               the latest and the one the in-flight step uses. Needs M >= S - 1 (otherwise a
//               forward would need a version not generated yet).
//
// Sends and receives are explicit instructions next to the compute they serve, so the executor
// can post receives ahead and the checker can prove that matching sends and receives cannot
// deadlock when sends are asynchronous and receives block.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::parallel {

enum class OpCode : uint8_t {
  kRecvAct,        // receive the activations of micro_batch from stage s - 1
  kForward,        // forward of micro_batch through the stage's layers (loss on the last stage)
  kSendAct,        // send the outputs of micro_batch to stage s + 1
  kRecvGrad,       // receive the gradients of micro_batch's outputs from stage s + 1
  kBackward,       // backward of micro_batch (parameter gradients accumulate)
  kSendGrad,       // send the gradients of micro_batch's inputs to stage s - 1
  kReduceGrads,    // all-reduce gradients across data-parallel groups (and tied copies)
  kOptimizerStep,  // apply the optimizer to the accumulated gradients, then zero them
  kSwapIn,         // start copying micro_batch's swapped saved tensors back for its Backward
};

const char* opcode_name(OpCode op);  // "RecvAct", "Forward", ...

struct Instruction {
  OpCode op = OpCode::kForward;
  int64_t micro_batch = -1;  // global micro-batch index; -1 for ReduceGrads / OptimizerStep
  bool operator==(const Instruction& o) const { return op == o.op && micro_batch == o.micro_batch; }
};

std::string to_string(const Instruction& instruction);  // "Forward(mb 3)", "OptimizerStep"

using Program = std::vector<Instruction>;

enum class ScheduleKind { kGPipe, k1F1B, kAsync1F1B, k2BW };

// Swap (parallel/runtime/memory_plan.h): puts SwapIn(mb) into stage `stage`'s program ahead of
// every Backward(mb), `lead` forward or backward instructions before it (with the receives that
// precede that instruction, so the copy starts before the stage waits for a peer), and never
// before Forward(mb) and its SendAct. A SwapIn only starts copies: it costs nothing in the
// simulation, and the checker requires it after Forward(mb) and before Backward(mb).
void add_prefetches(Program* program, int lead);

// Parses gpipe|1f1b|async-1f1b|2bw; throws strata::Error listing them otherwise.
ScheduleKind parse_schedule(const std::string& name);
const char* schedule_name(ScheduleKind kind);
// True for the schedules that flush (and update once) at the end of every step.
bool is_synchronous(ScheduleKind kind);
// Optimizer updates per step of M micro-batches: M for async-1f1b (one per micro-batch), 1 for
// the others (2bw coalesces the step's gradients like the synchronous ones).
int64_t updates_per_step(ScheduleKind kind, int64_t micro_batches);
// Older weight versions stage `stage` keeps besides the latest at most: async-1f1b
// min(S - s, M) - 1 (one per micro-batch in flight but the newest), 2bw 1 (the version its
// current step computes on), 0 for the synchronous schedules. The executor also sets the latest
// aside (a copy) while an instruction runs on an older one.
int64_t stashed_weight_versions(ScheduleKind kind, int stages, int stage, int64_t micro_batches);
// 2bw's weight version of a micro-batch of step `step` in a run that began at step
// `first_step`: the number of updates the run applied before it, max(step - first_step - 1, 0).
int64_t two_bw_version(int64_t step, int64_t first_step);

struct Schedule {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int stages = 1;
  int64_t micro_batches = 1;  // per step (synchronous) or in the whole run (asynchronous)
  int64_t first_micro_batch = 0;
  // 2bw: micro-batches per update (the step's M); the run's micro_batches is a multiple of it.
  int64_t update_every = 1;
  std::vector<Program> programs;  // programs[s]: stage s
};

// The instruction lists of one step (synchronous kinds: micro-batches
// [step * M, step * M + M)) or of a run of M micro-batches (async-1f1b and 2bw, first = 0 for
// the default step 0; a later `step` numbers later runs, e.g. epochs that each drain at their
// end). 2bw updates after every `update_every` micro-batches (0: once, at the end of the run).
// Throws strata::Error for S < 1, M < 1 or step < 0, and for 2bw when M is not a multiple of
// update_every or update_every < S - 1.
Schedule make_schedule(ScheduleKind kind, int stages, int64_t micro_batches, int64_t step = 0,
                       int64_t update_every = 0);

struct ScheduleCheck {
  bool ok = false;
  std::string error;                   // the first violation found, empty when ok
  std::vector<int64_t> max_in_flight;  // per stage: most micro-batches forwarded, not yet backward
  double makespan = 0.0;               // simulated, forward = 1, backward = 2, messages free
  double bubble_fraction = 0.0;        // simulated idle time / (stages * makespan)
};

// Proves the schedule valid: every micro-batch forwarded and backwarded once per stage, backward
// after forward; sends and receives match one to one between neighbouring stages; the programs
// cannot deadlock (simulation with asynchronous sends and blocking receives); ReduceGrads and
// OptimizerStep where the kind needs them (2bw: after every update_every-th backward); in-flight
// micro-batches within the kind's bound (gpipe: M; 1f1b, async-1f1b and 2bw: S - s); a
// SwapIn(mb), where there is one, between Forward(mb) and Backward(mb).
ScheduleCheck check_schedule(const Schedule& schedule);

// A simulation of a valid schedule with per-stage costs (time of one micro-batch's forward and
// backward on stage s, in any unit; messages free, sends asynchronous, receives blocking): the
// same event model as check_schedule, for predicting step times from profiled stage costs.
struct Simulation {
  double makespan = 0.0;         // when the last stage finishes
  std::vector<double> busy;      // per stage: time spent in Forward and Backward
  double bubble_fraction = 0.0;  // idle time / (stages * makespan)
};

// Throws strata::Error when check_schedule rejects the schedule, or for costs that are negative
// or not one per stage.
Simulation simulate_schedule(const Schedule& schedule, const std::vector<double>& forward_cost,
                             const std::vector<double>& backward_cost);

// The idle fraction of an ideal pipeline (equal stage times, free messages, backward = 2 x
// forward): (S - 1) / (M + S - 1) for gpipe and 1f1b; the warm-up and drain of a run of M
// micro-batches for async-1f1b, which is the same (S - 1) / (M + S - 1): it runs 1f1b's
// forward/backward order, its updates cost nothing here.
double theoretical_bubble_fraction(ScheduleKind kind, int stages, int64_t micro_batches);

}  // namespace strata::parallel
