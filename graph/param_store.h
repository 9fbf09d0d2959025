// ParamStore: one flat buffer each for the parameters, gradients, buffers (running statistics)
// and optimizer state of a range of layers (a pipeline stage), carved into per-layer views.
//
// Flat buffers make all-reduce, clipping, checkpointing and migration single operations on
// contiguous ranges (llm.c's malloc_and_point_parameters). Every parameter starts at a multiple
// of 16 elements (64 bytes for f32).
//
// Mixed precision (`compute` bf16 or f16, --precision): the flat buffers above stay f32 (the
// master weights, gradients, statistics and optimizer state the optimizer, all-reduces and
// checkpoints see), and the layers are bound to 16-bit working copies of the parameters and
// gradients instead; the running statistics have no 16-bit copy (the normalization ops keep
// statistics in f32, as the frameworks do), the layers update the f32 buffers in place.
// The training loop refreshes the working weights from the masters before computing
// (load_working) and moves what a backward pass wrote into the 16-bit gradients over to the f32
// ones (flush_grads, flush_layer_grads: the 16-bit ones are zero again after).
//
// Tied parameters (ParamSpec::tied_to): when the owner is in the same store, the tied entry is an
// alias, a second view of the owner's storage, so both layers read one weight and add into one
// gradient, and the optimizer updates it once. When the owner is in another store (another
// pipeline stage), the entry is a copy initialized from the owner's name, so it starts equal; the
// pipeline keeps the copies equal by all-reducing their gradients.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/exec_context.h"
#include "engine/tensor.h"
#include "graph/layer.h"

namespace strata::graph {

class Model;

class ParamStore {
 public:
  struct Entry {
    size_t layer_index = 0;  // in the model
    std::string layer;       // the layer's name
    std::string name;        // "weight"
    Shape shape;
    int64_t offset = 0;  // elements into the flat buffer
    int64_t numel = 0;
    ParamInit init;
    bool weight_decay = true;
    std::string tied_to;     // the owner's full name, when tied
    bool alias = false;      // a view of an owner in this store (not optimized on its own)
    int64_t valid_rows = 0;  // ParamSpec::valid_rows (0: every row holds values)
    // Elements that hold values: numel less the padding rows.
    int64_t valid_numel() const {
      return valid_rows > 0 && !shape.empty() ? numel / shape[0] * valid_rows : numel;
    }
    std::string full_name() const { return layer + "." + name; }
    // The name the values are keyed by: the owner's for a tied parameter.
    std::string init_key() const { return tied_to.empty() ? full_name() : tied_to; }
  };

  // Lays out layers [begin, end) of `model` and binds the views to the layers. Parameters are
  // uninitialized until initialize(); gradients start at zero.
  // `compute`: the dtype the layers compute in; kF32 (or `dtype`) binds them to the masters.
  ParamStore(Model& model, size_t begin, size_t end, Allocator& allocator,
             DType dtype = DType::kF32, DType compute = DType::kF32);
  // Unbinds the layers still bound to this store, so they keep none of its memory (the model
  // must outlive its stores).
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // Fills parameters and buffers from their ParamInit with Philox streams keyed by
  // (seed, "layer.name"): identical whichever range of layers a store holds.
  void initialize(uint64_t seed);
  // Binds the layers to this store's views again (the constructor does it first): several stores
  // over the same layers (ArrayPipe's per-job states, parallel/arraypipe/binder.h) take turns
  // by switching the layers' views, without copying a value. The latest binding wins.
  void bind_layers();
  void zero_grads();
  // The same, ordered on the context's stream without waiting for the device (CUDA).
  void zero_grads(ExecContext& ctx);

  const Tensor& params() const { return params_; }    // (num_params,)
  const Tensor& grads() const { return grads_; }      // (num_params,)
  const Tensor& buffers() const { return buffers_; }  // (num_buffer_elements,)
  const std::vector<Entry>& param_entries() const { return param_entries_; }
  const std::vector<Entry>& buffer_entries() const { return buffer_entries_; }
  Tensor param(size_t i) const;
  Tensor grad(size_t i) const;
  Tensor buffer(size_t i) const;
  // Parameters (trainable elements, without alignment padding or padding rows; an alias counts
  // once).
  int64_t num_params() const;
  // Entries that are copies of a tied owner held by another store.
  std::vector<size_t> tied_copies() const;
  size_t begin() const { return begin_; }
  size_t end() const { return end_; }

  // Mixed precision (see the top of this file). Without it these do nothing.
  DType compute_dtype() const { return compute_; }
  bool mixed() const { return compute_ != dtype_; }
  const Tensor& working_params() const;   // (num_params,) in compute_dtype()
  const Tensor& working_grads() const;    // (num_params,) in compute_dtype()
  const Tensor& working_buffers() const;  // buffers(): statistics are f32 in every precision
  // The buffers (running statistics) that the store's layers of [first_layer, end_layer) are
  // bound to, as one slice of the flat buffer; undefined when those layers have none. A
  // recomputed forward saves and restores them, so that replaying a forward does not update
  // running statistics twice.
  Tensor bound_buffers(size_t first_layer, size_t end_layer) const;
  // Working weights = the masters, rounded.
  void load_working(ExecContext& ctx);
  void load_working_params(ExecContext& ctx);
  // Master gradients += the working ones (of every layer, or of the store's layer `layer_index`
  // of the model, aliases excluded: an alias's gradient moves with its owner's), which become 0.
  void flush_grads(ExecContext& ctx);
  void flush_layer_grads(ExecContext& ctx, size_t layer_index);

  // Optimizer state: `slots` flat buffers laid out like params(), zero-filled when first made.
  void ensure_state(size_t slots);
  size_t state_slots() const { return state_.size(); }
  const Tensor& state(size_t slot) const;
  Tensor state_view(size_t slot, size_t i) const;

  // The flat buffers themselves, for code that moves a store's state between memories by putting
  // a tensor of the same shape and dtype, in another storage, in a buffer's place (ArrayPipe's
  // slots: parallel/arraypipe/state_slots.cpp). The layers see the new storage after
  // bind_layers(). working_params and working_grads are null without mixed precision.
  struct FlatBuffers {
    Tensor* params = nullptr;
    Tensor* grads = nullptr;
    Tensor* buffers = nullptr;
    std::vector<Tensor*> state;
    Tensor* working_params = nullptr;
    Tensor* working_grads = nullptr;
  };
  FlatBuffers flat_buffers();

 private:
  Tensor view_of(const Tensor& flat, const Entry& e) const;

  Model* model_;
  size_t begin_, end_;
  Allocator* allocator_;
  DType dtype_;
  DType compute_;
  std::vector<Entry> param_entries_, buffer_entries_;
  Tensor params_, grads_, buffers_;
  Tensor work_params_, work_grads_;  // mixed precision only
  std::vector<Tensor> state_;
};

}  // namespace strata::graph
