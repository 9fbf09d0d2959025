// The tensors a stage's micro-batches save for their backward passes, layer by layer, under the
// stage's MemoryPlan (parallel/runtime/memory_plan.h): vPIPE's Virtualized Tensor Manager and
// its swap and recompute mechanisms (../shared/papers/vpipe.md §2.2, §3.1, §3.2).
//
// Records. A micro-batch's forward creates one record per layer of the stage; the layer's
// backward consumes it. A record holds the layer's tape: on the device (keep), away in the host
// pool (swap), or dropped (recompute). Nothing else in the runtime holds saved tensors, so the
// records are the whole of a stage's activation memory; stats() counts them, and the most
// micro-batches that held records at once (1F1B: at most S - s on stage s).
//
// Swap. After a swap layer's forward, each storage its tape refers to (once per micro-batch,
// however many views and layers share it; parameters are never saved on tapes) is copied to the
// host pool by the CopyEngine and the tape lets go of it, so its device memory goes when the copy
// is done. prefetch(mb) (the SwapIn instruction, placed ahead of Backward(mb) by the schedule)
// starts copying the last `prefetch_layers` swap layers back, last layer first; each layer's
// backward then waits for its own tensors only (on CUDA the compute stream waits for an event),
// and starts the next swapped layer's copy, so at most that many layers' tensors are on their way
// in at once. A backward that finds its tensors not prefetched starts the copy itself. A forward
// starts once the earlier micro-batches' swap-outs are done, so at most one micro-batch's swapped
// tensors are on their way out; and device memory that swap-outs still hold is freed under
// pressure: the allocator's pressure handler waits for the copies in flight before it reports
// out of memory.
//
// Recompute. A run of consecutive recompute layers is a segment; its first layer's inputs are
// kept (the segment's checkpoint), its layers' tapes are dropped after their forward, and their
// outputs are not kept by the runtime. When the backward reaches the segment, the forward of the
// whole segment is replayed from the checkpoint with the micro-batch's ForwardOptions (the same
// RNG offsets: the same dropout masks; the weights it saw: under weight stashing the executor
// has put the stashed version back before the backward), its running statistics saved before
// and restored after (batch norm updates them once per forward, not twice); then the segment's
// backward runs on the fresh tapes. Gradients are bitwise those of keep.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "engine/exec_context.h"
#include "engine/tape.h"
#include "graph/model.h"
#include "graph/param_store.h"
#include "parallel/runtime/copy_engine.h"
#include "parallel/runtime/memory_plan.h"

namespace strata::parallel {

class Trace;

struct StageMemoryStats {
  int64_t records_created = 0;     // one per layer per training forward
  int64_t records_released = 0;    // by the layer's backward (or drop())
  int64_t max_micro_batches = 0;   // the most micro-batches holding records at once
  size_t swapped_out_bytes = 0;    // device to host
  size_t swapped_in_bytes = 0;     // host to device
  double recompute_seconds = 0.0;  // replayed forwards
  int64_t recomputed_layers = 0;
  double swap_wait_seconds = 0.0;  // compute waiting for tensors on their way in
  // Per layer of the stage (index: layer - first_layer): host seconds of its training forwards
  // and backwards (a recompute replay counted in its backward; --inject's per-layer sleeps
  // included), the statistics of vPIPE's repartition loop (parallel/vpipe/repartition.h). On a
  // GPU these are the host's times to queue the layer's work, unless the stream is synchronized.
  size_t first_layer = 0;
  std::vector<double> layer_forward_seconds;
  std::vector<double> layer_backward_seconds;
  // Per layer of the stage, per sample of its last training forward: the outputs' bytes and the
  // outputs' plus the tape's saved bytes (DynPipe's layer features, parallel/dynpipe/policy.h).
  std::vector<double> layer_output_bytes;
  std::vector<double> layer_activation_bytes;
};

// Called after each layer's training forward (backward = false) or backward of a micro-batch of
// optimizer step `step` (from 0), which took `seconds`; whatever it spends is counted in the
// layer's time (--inject's slow and grow kinds sleep here).
using LayerObserver =
    std::function<void(size_t layer, bool backward, int64_t step, double seconds)>;

// Adds `part`'s counters (records, swap bytes, recompute, waits; the most micro-batches at once)
// to `total`'s: the statistics of several StageMemory (a run's executors, a stage's moved layers).
void add_memory_counters(const StageMemoryStats& part, StageMemoryStats* total);
// Adds `part`'s per-layer seconds to `whole`'s (each indexed from its first_layer; `whole`'s
// vectors cover `part`'s layers) and takes its per-sample bytes where it measured them.
void add_layer_stats(const StageMemoryStats& part, StageMemoryStats* whole);

class StageMemory {
 public:
  // Layers [begin, end) of `model`, whose parameters and buffers `store` holds. `copies` serves
  // the swap layers (may be null when the plan swaps no layer of the stage). Registers itself as
  // the device allocator's pressure handler while it lives (when a layer swaps).
  StageMemory(ExecContext& ctx, graph::Model& model, graph::ParamStore& store, size_t begin,
              size_t end, MemoryPlan plan, CopyEngine* copies, Trace* trace = nullptr);
  ~StageMemory();
  StageMemory(const StageMemory&) = delete;
  StageMemory& operator=(const StageMemory&) = delete;

  // Training forward of micro-batch `mb` through the stage's layers: one record per layer.
  TensorList forward(int64_t mb, const TensorList& inputs, const graph::ForwardOptions& options);
  // Starts bringing `mb`'s swapped tensors back (SwapIn): no-op when it has none.
  void prefetch(int64_t mb);
  // Backward of `mb` from the gradients of the stage's outputs, consuming its records; returns
  // the gradients of the stage's inputs. `after_layer(i)` runs once layer i's backward is done.
  TensorList backward(int64_t mb, const TensorList& grad_outputs,
                      const std::function<void(size_t)>& after_layer = nullptr);
  // Forgets `mb`'s records (a forward with no backward to come).
  void drop(int64_t mb);

  bool holds(int64_t mb) const { return micro_batches_.count(mb) > 0; }
  int64_t live_micro_batches() const { return static_cast<int64_t>(micro_batches_.size()); }
  int64_t live_records() const;
  // Lets go of the device memory of finished swap-outs (the executor calls it between
  // instructions).
  void poll();
  // Waits for the swap-outs in flight, so their device memory goes; whether any was pending.
  bool relieve_pressure();

  const MemoryPlan& plan() const { return plan_; }
  bool swaps() const { return swaps_; }
  int prefetch_layers() const { return prefetch_layers_; }
  void set_prefetch_layers(int layers);
  // Whether SwapIn first waits for the swap-outs still on their way to the host. Under gpipe the
  // first SwapIn of a step follows the last forward, and without the wait its copies in and that
  // forward's copies out hold device memory together or not, as the copy threads' timing falls
  // (measured: a middle stage's peak 4.58-5.23 MB from run to run); with it the peak is the
  // model's. Under 1f1b a SwapIn comes a forward ahead of its backward, which the memory model
  // counts beside the copies out (parallel/vpipe/memory_model.h).
  void set_drain_before_swap_in(bool drain) { drain_before_swap_in_ = drain; }
  StageMemoryStats stats() const { return stats_; }
  void set_layer_observer(LayerObserver observer) { layer_observer_ = std::move(observer); }

 private:
  struct SavedView;
  struct SwapStorage;
  struct LayerRecord;
  struct MicroBatch;

  MicroBatch& micro_batch(int64_t mb);
  void record_layer_bytes(size_t layer, const TensorList& outputs, const LayerTape& tape);
  void swap_out(MicroBatch& m, LayerRecord& record);
  // Starts copying layer `layer`'s storages in (if not yet).
  void start_copy_in(MicroBatch& m, size_t layer);
  // The next swap layers below `below` (exclusive, in backward order) within the prefetch depth.
  void prefetch_below(MicroBatch& m, size_t below);
  void bring_back(MicroBatch& m, LayerRecord& record);
  void replay(MicroBatch& m, size_t segment_begin, size_t segment_end);
  void release(MicroBatch& m, size_t layer);

  ExecContext& ctx_;
  graph::Model& model_;
  graph::ParamStore& store_;
  size_t begin_, end_;
  MemoryPlan plan_;
  CopyEngine* copies_;
  Trace* trace_;
  bool swaps_ = false;
  int prefetch_layers_ = 2;
  bool drain_before_swap_in_ = false;
  std::map<int64_t, std::unique_ptr<MicroBatch>> micro_batches_;
  StageMemoryStats stats_;
  LayerObserver layer_observer_;
};

}  // namespace strata::parallel
