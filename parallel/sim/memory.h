// Memory of a pipeline stage in a simulated run: what stays for the whole run (parameters,
// gradients, optimizer state, 16-bit working copies, stashed weight versions, delayed
// gradients) and what one micro-batch keeps from its forward to its backward under each layer's
// memory policy. The simulator (simulator.h) places the per-micro-batch amounts on its timeline,
// so the peak follows the schedule (micro-batches in flight), the transfers and the swaps.
//
// Memory policy per layer (vPIPE, papers/vpipe.md Sec. 4.1; the runtime's keep|swap|recompute):
//   keep       the layer's tape stays on the device until its backward.
//   swap       the tape goes to host memory after the forward (copy engine, device to host) and
//              comes back before the backward (host to device, issued ahead: SwapIn); on the device
//              only while it is copied or used.
//   recompute  the tape is dropped after the forward; the backward first re-runs the forward of
//              the layer (time: + its forward), from its input, which stays on the device (the
//              checkpoint of a run of consecutive recomputed layers); during that backward the
//              run's tape is on the device for one micro-batch.
// The tape of a micro-batch is a set of storages (layer_work.h): each layer's own tensors, the
// outputs a layer or its successor keeps, and the stage's input when the first layer keeps it.
// Each storage belongs to the layer that keeps it and follows that layer's policy. On the last
// stage the loss gradient (the size of the logits) waits from the forward to the backward.
//
// Whole-run memory of stage s (f32 masters; P = its parameter bytes, a tied parameter whose
// owner is on the same stage counted once):
//   P parameters + P gradients + slots x P optimizer state
//   + P (16-bit working weights and gradients: bf16/fp16)
//   + k x P weight copies when k > 1 micro-batches are in flight (async-1f1b: k - 1 stashed
//     versions and the current weights set aside during a backward on a stashed version;
//     2bw: 2 x P on every stage, its one stashed version and the weights set aside)
//   + (D + 1) x P delayed gradients (--dp-delay D > 0: the ring of parallel/grouped_dp.h)
// Transient (per instruction, on top of what stays): a forward reaches, at some layer l, the
// tapes of the layers before l, l's input and output and its kernels' temporaries; a backward,
// at some layer l, loses the tapes of the layers after l and holds l's output and input
// gradients and its temporaries (layer_work.h: forward_workspace, backward_workspace).
#pragma once

#include <string>
#include <vector>

#include "parallel/partition/partition.h"
#include "parallel/runtime/memory_plan.h"
#include "parallel/sim/cost_model.h"

namespace strata::parallel::sim {

// The runtime's per-layer policies (parallel/runtime/memory_plan.h), simulated.
using parallel::memory_policy_name;
using parallel::MemoryPolicy;
using parallel::parse_memory_policy;

struct StageStatic {
  double params = 0.0;
  double grads = 0.0;
  double optimizer = 0.0;
  double working = 0.0;  // 16-bit copies (mixed precision)
  double stash = 0.0;    // weight versions (async-1f1b, 2bw)
  double delayed = 0.0;  // --dp-delay gradient ring
  double total() const { return params + grads + optimizer + working + stash + delayed; }
};

struct StaticOptions {
  int optimizer_slots = 2;
  bool mixed_precision = false;
  // Weight copies of async-1f1b's stashing: on a stage with k > 1 micro-batches in flight, k - 1
  // stashed versions plus the copy of the current weights the executor sets aside while a
  // backward runs on a stashed version: k (0 for k = 1, which never stashes); 2bw's: 2.
  int64_t stashed_versions = 0;
  int dp_delay = 0;
  bool data_parallel = false;  // G > 1 (the delay ring exists only then)
};

// Parameter bytes of the stage, a tied parameter whose owner is on the stage counted once.
double stage_param_bytes(const std::vector<LayerModel>& layers, LayerRange range);
StageStatic stage_static(const std::vector<LayerModel>& layers, LayerRange range,
                         const StaticOptions& options);

// One micro-batch of `rows` samples on a stage.
struct MicroBatchMemory {
  double keep = 0.0;            // on the device from the forward to the backward
  double swap = 0.0;            // on the host between them (SwapOut after forward, SwapIn before)
  double recompute = 0.0;       // dropped after the forward, rebuilt during the backward
  double loss_grad = 0.0;       // last stage: the loss gradient, forward to backward
  double recompute_peak = 0.0;  // the largest recomputed run's tape, during a backward
  // The most a forward / backward holds at once above what is resident when it starts (the
  // forward: including the tape it leaves; the backward: net of the tapes it frees).
  double forward_workspace = 0.0;
  double backward_workspace = 0.0;
  double input = 0.0;        // the stage's received activations (and sent gradients)
  double output = 0.0;       // its sent activations (and received gradients)
  double send_output = 0.0;  // the output held for its send beyond the tape (0: the tape keeps it)
  // Time of the recompute: the forward of the recomputed layers.
  double recompute_seconds = 0.0;
};

// `policy`: one per layer of the model (empty: keep everywhere).
MicroBatchMemory micro_batch_memory(const std::vector<LayerModel>& layers, LayerRange range,
                                    const std::vector<MemoryPolicy>& policy, double rows,
                                    bool last_stage);

}  // namespace strata::parallel::sim
