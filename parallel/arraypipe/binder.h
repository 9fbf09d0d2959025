// ArrayPipe's Binder (papers/arraypipe.md §2.1): one public layer structure per stage (the
// layers of one model instance) and, per job of the array, a block state: a ParamStore over the
// stage's layers holding the job's parameters, gradients, buffers (batch-norm statistics) and
// optimizer state. A job's block binds the layers to its store's views (ParamStore::bind_layers):
// a switch is a swap of the layers' tensor views, never a copy of a value, so the states stay
// where they are and a job sees exactly the state it left. The job's RNG and data order are
// keyed by its own seed and step (the executor and its data loader), not held by the layers.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/allocator.h"
#include "graph/model.h"
#include "graph/param_store.h"

namespace strata::parallel::arraypipe {

class Binder {
 public:
  // Layers [begin, end) of `model` (the public structure, which must outlive the binder); no job
  // yet.
  Binder(graph::Model& model, size_t begin, size_t end, Allocator& allocator,
         DType compute = DType::kF32);

  // Adds a job's block state, initialized from `seed` as a solo run's store would be, with
  // `slots` optimizer state slots (zero). Returns the job's index in the binder.
  int add_job(uint64_t seed, size_t slots);

  // Binds the layers to `job`'s state (nothing to do when it is bound already). Every block of a
  // job calls it before touching the layers.
  void bind(int job);
  int bound() const { return bound_; }
  // The layers let go of the bound job's views (the memory manager, before that job's state
  // moves away); the next bind binds again.
  void unbind();
  // Switches made so far (binds that changed the job).
  int64_t switches() const { return switches_; }

  int jobs() const { return static_cast<int>(stores_.size()); }
  graph::ParamStore& store(int job);
  graph::Model& model() { return model_; }
  Allocator& allocator() { return allocator_; }

 private:
  graph::Model& model_;
  size_t begin_, end_;
  Allocator& allocator_;
  DType compute_;
  std::vector<std::unique_ptr<graph::ParamStore>> stores_;
  int bound_ = -1;
  int64_t switches_ = 0;
};

}  // namespace strata::parallel::arraypipe
