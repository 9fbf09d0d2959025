// vPIPE's memory and time models of a pipeline stage under a per-layer keep/swap/recompute plan
// (../shared/papers/vpipe.md §2.1, Eq. 1-3), extended with what a real run also holds, so that
// the predicted peak can be checked against the allocator's measured one.
//
// Notation: stage k of p (0-indexed, §6.1 of the note), layers l_k..r_k, per layer i at the
// micro-batch size: forward f_i and backward b_i seconds, a_i the bytes its tape keeps (each
// storage once), m_i its parameter bytes; P the host-device bandwidth.
//
// Memory (Eq. 1 and its extension). The copies a stage holds of its dependent memory are the
// micro-batches in flight: min(p - k, M) under 1f1b and async-1f1b (stage k runs p - k - 1 warm-up
// forwards, then holds p - k), M under gpipe. Constant: parameters, gradients and optimizer state
// (slots x m_i; plus the 16-bit working copies of parameters and gradients under mixed precision);
// under async-1f1b also the stashed weight versions, up to copies - 1 of them (ASP: m_i is
// dependent, §2.1), and the copy of the current weights that a backward on a stashed version
// keeps while it runs. Dependent, per micro-batch:
//   keep       a_i (a storage the previous layer also keeps, shared_i, counts once: resident if
//              either layer keeps it);
//   swap       0 (Eq. 1: swapped tensors count zero);
//   recompute  0, plus each recompute segment's checkpoint: the inputs of its first layer (less
//              what the layer before keeps of them).
// The extension beyond Eq. 1 (what the paper leaves out, §6.4): the first stage's input batch
// (all M micro-batches, as the loader puts it on the device), the last stage's loss gradients
// (its output's bytes per micro-batch held), and the worst moment of the micro-batch that runs,
// above the copies - 1 others held whole: during the forward of layer j, what the layers before
// j keep of it; during the backward of layer j, what layers up to j keep (the later ones have
// released theirs) and the gradient of j's output; beside, the receive buffers the schedule's
// program holds at a forward or at a backward (activations and output gradients received or
// posted ahead and not used yet, counted from the program and the executor's lookahead), and
// j's own temporaries above the level it starts at (measured by the profiler), with the
// swap-outs of the micro-batch's earlier layers still in flight during a forward (and, under 1f1b
// and async-1f1b, all of the previous forward's during a backward), a replayed recompute
// segment's tapes while its backward runs, and the swapped layers on their way back during a
// backward (the prefetch depth). The peak is constant + copies x dependent + boundary +
// transient, the transient being that worst moment less one micro-batch's dependent memory.
//
// Time (Eq. 2). t_fwd = sum f_i; t_bwd = sum (b_i + R_i f_i) + max(0, 2 sum S_i a_i / P - window)
// with window = t_fwd + sum (b_i + R_i f_i): the equation's t_bwd on the right is taken without
// the swap term (§6.2: the non-self-referential reading). A stage's step costs M (t_fwd + t_bwd)
// of compute; Eq. 3 minimizes the slowest stage's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/partition/partition.h"
#include "parallel/runtime/memory_plan.h"
#include "parallel/schedule/schedule.h"

namespace strata::parallel {

// One layer's costs at the micro-batch size (seconds and bytes).
struct LayerMemoryCost {
  std::string name;
  double forward_s = 0.0;
  double backward_s = 0.0;
  double saved_bytes = 0.0;   // a_i
  double shared_bytes = 0.0;  // of a_i, also kept by the previous layer
  double input_bytes = 0.0;
  double output_bytes = 0.0;
  double forward_peak_bytes = 0.0;
  double backward_peak_bytes = 0.0;
  double param_bytes = 0.0;  // m_i (f32)
};

// Per-sample profile costs (parallel/partition/partition.h) at `rows` samples per micro-batch.
std::vector<LayerMemoryCost> layer_memory_costs(const std::vector<LayerCost>& costs, int64_t rows);

struct StageSetting {
  int stage = 0;   // k
  int stages = 1;  // p
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int64_t micro_batches = 1;  // M
  int optimizer_slots = 2;    // AdamW 2, SGD with momentum 1
  bool mixed = false;         // 16-bit working copies of parameters and gradients
  double bandwidth = 10e9;    // P, bytes per second between device and host
  int prefetch_layers = 2;    // swapped layers on their way back at once
  int lookahead = 4;          // instructions ahead whose receives are posted (the executor's)
  // --weight-cache on: the stashed versions live on the host; the device holds one of them (the
  // cache) instead of all of them and the latest set aside.
  bool weight_cache = false;
  // Eq. (1) exactly as the paper writes it: recomputed layers leave no checkpoint, and there is
  // no boundary or transient term (for tests of Algorithm 2 against the paper's model).
  bool paper_model = false;
};

// Micro-batches whose dependent memory a stage holds at once (the in-flight bound).
int64_t dependent_copies(const StageSetting& setting);

// The most receive buffers a stage holds while a forward and while a backward runs, under its
// schedule's program: activations and output gradients received (or posted `lookahead`
// instructions ahead) and not used yet, the running instruction's own included.
struct ReceiveBuffers {
  struct Held {
    int64_t activations = 0;
    int64_t gradients = 0;
  };
  Held forward;
  Held backward;
};
ReceiveBuffers receive_buffers(const StageSetting& setting);

struct StageMemoryEstimate {
  double constant_bytes = 0.0;   // parameters, gradients, optimizer state, stashed versions
  double dependent_bytes = 0.0;  // per micro-batch, Eq. 1's sum over D_i plus checkpoints
  int64_t copies = 0;
  double boundary_bytes = 0.0;   // first stage's input batch, last stage's loss gradients
  double transient_bytes = 0.0;  // the running micro-batch's worst moment, above one dependent
  double peak_bytes = 0.0;       // constant + copies x dependent + boundary + transient
  // Eq. 1 alone: constant + copies x dependent (what the paper bounds by M).
  double eq1_bytes() const {
    return constant_bytes + static_cast<double>(copies) * dependent_bytes;
  }
};

struct StageTimeEstimate {
  double forward_s = 0.0;    // t_fwd per micro-batch
  double backward_s = 0.0;   // t_bwd per micro-batch, Eq. 2 (recompute and exposed swap included)
  double recompute_s = 0.0;  // of backward_s: replayed forwards
  double exposed_swap_s = 0.0;  // of backward_s: swap traffic beyond the window
  double swap_bytes = 0.0;      // per micro-batch, out and in (2 sum S_i a_i)
  double step_s(int64_t micro_batches) const {
    return static_cast<double>(micro_batches) * (forward_s + backward_s);
  }
};

// `layers`: the stage's layers only (layers[0] is layer `first` of `plan`).
StageMemoryEstimate estimate_stage_memory(const std::vector<LayerMemoryCost>& layers, size_t first,
                                          const MemoryPlan& plan, const StageSetting& setting);
StageTimeEstimate estimate_stage_time(const std::vector<LayerMemoryCost>& layers, size_t first,
                                      const MemoryPlan& plan, const StageSetting& setting);

}  // namespace strata::parallel
