// What the executor asks of a stage's side of a layer migration inside an async-1f1b run: which
// layers each micro-batch runs here (StageLayout), the moved layers' forwards, backwards and
// updates around the core's, and their stores at the end. Two protocols implement it: vPIPE's
// hand-off (parallel/runtime/live_stage.h, --migration live) and DynPipe's paused updates with
// the state trickled behind training (parallel/runtime/live_pause.h, --migration dynpipe).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/tensor.h"
#include "graph/model.h"
#include "graph/param_store.h"
#include "parallel/runtime/micro_batch_source.h"
#include "parallel/runtime/stage_layout.h"
#include "parallel/runtime/stage_memory.h"

namespace strata::parallel {

struct LiveStageStats;

class MovingLayers {
 public:
  virtual ~MovingLayers() = default;

  // The per-micro-batch layer ranges (the executor's transfers shape their messages by it).
  virtual const StageLayout& layout() const = 0;
  // A training forward of `mb` through the stage's parts from `inputs`; `core` runs the core.
  using CoreForward = std::function<TensorList(const TensorList&)>;
  virtual TensorList forward(int64_t mb, const TensorList& inputs,
                             const graph::ForwardOptions& options, const CoreForward& core,
                             MicroBatchSource& source) = 0;
  // Its backward from the gradients of the stage's outputs; `core` runs the core's. `options`:
  // those of the micro-batch's forward (a replay of moved layers runs with them).
  using CoreBackward = std::function<TensorList(const TensorList&)>;
  virtual TensorList backward(int64_t mb, const TensorList& grads,
                              const graph::ForwardOptions& options, const CoreBackward& core,
                              MicroBatchSource& source) = 0;
  // After the core's update of the last backward (`step`: the optimizer step index). Returns the
  // moved layers' share of the squared gradient norm.
  virtual double update(int64_t step) = 0;
  // Puts the latest weights back into the moved layers' stores (between programs).
  virtual void restore_latest() = 0;
  // A migration decided while the run goes: to `next`, its first backward on the new stages
  // micro-batch `first_backward` (LiveStage's open runs; the others refuse it, naming `what`).
  virtual void add_migration(const Partition& next, int64_t first_backward,
                             const std::string& what) = 0;
  // Checks that nothing is left (every record consumed, every transfer through).
  virtual void finish() = 0;
  virtual LiveStageStats stats() const = 0;
  // Adds the moved layers' per-layer times and bytes to `whole` (its vectors over every layer of
  // the model): those of the layers this stage runs now, and of those it ran and handed off.
  virtual void add_layer_stats(StageMemoryStats* whole) const = 0;
  virtual int64_t live_records() const = 0;
  // The stores of the moved layers this stage holds now (the latest weights between programs).
  virtual std::vector<const graph::ParamStore*> stores() const = 0;
};

}  // namespace strata::parallel
