// ArrayPipe's Job-Array Pipeline Scheduling Problem (JAPSP, papers/arraypipe.md §2.3): the
// instance, the schedule as data, the validator of the paper's constraints and the makespan.
//
// A job-array of J sibling jobs shares one pipeline of S stages (one device per stage). Each job
// trains one whole mini-batch per iteration: a forward block on stages 0..S-1, then a backward
// block on stages S-1..0, so every job is a route of 2S operations that visits every device twice
// (a re-entrant job shop). Operation k of a job is its forward on stage k for k < S and its
// backward on stage 2S-1-k for k >= S.
//
// Times of the block of job j on stage s (Table I of the paper):
//   forward r_f, backward r_b, recompute re (before the backward, from the stage input), update u
//   (the just-in-time optimizer step after the backward), switch w (preparing the next block's
//   context, charged after every block on the device, the last one included, as in Eq. 3 and 8),
//   send_forward eta_f (activations s -> s+1) and send_backward eta_b (gradients s -> s-1).
// The device is busy for r_f + w after a forward and re + r_b + u + w after a backward (Eq. 8, 9,
// generalised to any next block on the device). A message leaves when the block's compute ends,
// before u and w: the next stage may start r_f + eta_f after the forward starts (Eq. 5), the
// previous one re + r_b + eta_b after the backward starts (Eq. 6). On the last stage the backward
// follows the job's own forward once r_f is done (Eq. 7 with the note's correction: the printed
// form lacks r_f; the switch w is the device constraint's).
// The makespan is Eq. 3: T = max_j (e_b(j, stage 0) + re + r_b + u + w), the end of the last
// first-stage backward block with its trailing update and switch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::parallel::arraypipe {

// Times of one (job, stage) block, in any time unit (seconds for measured profiles).
struct BlockTimes {
  double forward = 0;        // r_f
  double backward = 0;       // r_b
  double recompute = 0;      // re: recomputation of the stage's activations before the backward
  double update = 0;         // u: optimizer step after the backward block
  double switch_cost = 0;    // w: preparing the next block on the device
  double send_forward = 0;   // eta_f: activations to stage s + 1 (unused on the last stage)
  double send_backward = 0;  // eta_b: gradients to stage s - 1 (unused on the first stage)
};

// A JAPSP instance: J jobs x S stages of block times.
class Instance {
 public:
  Instance() = default;
  // Every job's block on every stage; checked by validate_instance().
  Instance(int jobs, int stages, std::vector<BlockTimes> times);

  int jobs() const { return jobs_; }
  int stages() const { return stages_; }
  int operations_per_job() const { return 2 * stages_; }
  const BlockTimes& at(int job, int stage) const;
  BlockTimes& at(int job, int stage);

  // Operation k of a job (0 <= k < 2S): its stage and direction.
  int stage_of(int op) const { return op < stages_ ? op : 2 * stages_ - 1 - op; }
  bool is_forward(int op) const { return op < stages_; }
  // The device is busy this long from the operation's start (Eq. 8, 9).
  double occupancy(int job, int op) const;
  // From the operation's start until the job's next operation may start (Eq. 5, 6, 7); for the
  // last operation (the backward on stage 0), until it ends for Eq. 3 (re + r_b + u + w).
  double lag(int job, int op) const;

 private:
  int jobs_ = 0;
  int stages_ = 0;
  std::vector<BlockTimes> times_;  // (J, S)
};

// Builds an instance from per-job per-stage compute times; every overhead starts at zero.
//   forward[j][s], backward[j][s]: r_f and r_b of job j on stage s (all jobs the same stage count).
Instance make_instance(const std::vector<std::vector<double>>& forward,
                       const std::vector<std::vector<double>>& backward);

// Eq. 1: eta = a / b_inter between stages on different servers, a / b_intra on the same server.
// activation_bytes[j][s] is the size of job j's activations (and of their gradients) between
// stage s and s + 1 (S - 1 entries per job); server_of_stage[s] places stage s. Sets send_forward
// of stage s and send_backward of stage s + 1.
void set_communication_times(Instance* instance,
                             const std::vector<std::vector<double>>& activation_bytes,
                             const std::vector<int>& server_of_stage, double bandwidth_inter,
                             double bandwidth_intra);

// Eq. 2, the zero-stall prefetch condition, in the conservative reading of the note's §6.2: on
// every server h, swapping in the block states of all of h's stages at once over the shared
// host link (the largest over the jobs of sum_{s in S_h} m_s^j / bandwidth_host) takes no longer
// than the shortest forward block on h less its send (min over jobs and s in S_h of
// r_f - eta_f). state_bytes[j][s] is m_s^j. Returns true when it holds; otherwise false with
// `why` (if given) naming the server, the swap time and the shortest block.
bool zero_stall_prefetch(const Instance& instance,
                         const std::vector<std::vector<double>>& state_bytes,
                         const std::vector<int>& server_of_stage, double bandwidth_host,
                         std::string* why = nullptr);

// Throws strata::Error naming the job, the stage and the time when a time is negative or not
// finite, when a forward or backward time is not positive, or the shape is wrong.
void validate_instance(const Instance& instance);

// One block of the task graph: a job's forward or backward on the device's stage.
struct Block {
  int job = 0;
  bool forward = true;
  bool operator==(const Block& other) const { return job == other.job && forward == other.forward; }
};

// The scheduler's output: the order in which every device (stage) runs its 2J blocks.
struct TaskGraph {
  std::vector<std::vector<Block>> device_order;  // [stage] -> blocks in execution order
};

// A task graph with a start time for every operation.
struct TimedSchedule {
  TaskGraph graph;
  std::vector<double> start;  // [job * 2S + op]
  double start_of(const Instance& instance, int job, int op) const {
    return start[static_cast<size_t>(job) * instance.operations_per_job() + op];
  }
};

std::string block_name(const Instance& instance, int job, int op);  // "job 1 backward on stage 2"

// Checks a timed schedule against the paper's constraints and throws strata::Error with the first
// violation: every device lists each of its 2J blocks exactly once; start times are finite and
// not negative; (5) forward stage order, (6) backward stage order, (7) the last stage's backward
// after the job's forward, (8)/(9) a device's next block (forward or backward) after the previous
// one's occupancy. Messages name the constraint, the blocks and the times.
void validate_schedule(const Instance& instance, const TimedSchedule& schedule);

// Eq. 3 on the schedule's start times (not validated: call validate_schedule()).
double makespan(const Instance& instance, const TimedSchedule& schedule);

// The semi-active schedule of a task graph: every block starts as soon as its job's previous
// operation (Eq. 5-7) and the device's previous block (Eq. 8, 9) allow. Throws strata::Error when
// the device orders are incomplete or wait on each other in a cycle (naming the stuck blocks).
TimedSchedule evaluate(const Instance& instance, const TaskGraph& graph);

// Operation-based encoding (papers/arraypipe.md §2.6): a sequence of 2S * J job indices in which
// the k-th occurrence of job j stands for j's operation k. Decoding appends each operation to its
// device at the earliest time its job and its device allow (semi-active). Every sequence with each
// job exactly 2S times decodes to a feasible schedule; anything else throws strata::Error.
TimedSchedule decode(const Instance& instance, const std::vector<int>& sequence);
// Only the makespan of decode(), without building the schedule (the GA's fitness).
double decode_makespan(const Instance& instance, const std::vector<int>& sequence);

// The instance without the given job (a job that ended early, for rescheduling); jobs after it
// move down by one.
Instance without_job(const Instance& instance, int job);

}  // namespace strata::parallel::arraypipe
