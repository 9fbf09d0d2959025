// Per-layer profile: forward and backward time, activation bytes, parameter bytes.
//
// Model::forward/backward feed it when given one. The profile is what the pipeline partitioner
// balances stages with: time per sample and the bytes a stage boundary after each layer would
// send.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/tape.h"

namespace strata::graph {

class Model;

struct LayerProfile {
  std::string name;
  std::string type;
  int64_t forward_calls = 0;
  int64_t backward_calls = 0;
  double forward_seconds = 0.0;   // total over calls
  double backward_seconds = 0.0;  // total over calls
  int64_t samples = 0;            // total samples over forward calls
  size_t output_bytes = 0;        // last forward: bytes of the outputs (what a stage sends)
  // Last forward: the storages its tape keeps for backward, each counted once (what swap moves
  // and recompute drops), and of those the bytes the previous layer's tape also keeps (a ReLU's
  // output that the next layer saves as its input: resident while either layer keeps it).
  size_t saved_bytes = 0;
  size_t shared_bytes = 0;
  size_t input_bytes = 0;  // last forward: bytes of the inputs (a recomputed segment keeps them)
  // The most bytes allocated above the level a forward (backward) of the layer started at, at
  // its worst moment over the calls since reset(): its temporaries, outputs and saved tensors.
  size_t forward_peak_bytes = 0;
  size_t backward_peak_bytes = 0;
  int64_t last_batch = 0;  // batch of the last forward
  size_t param_bytes = 0;  // parameters of the layer (f32)

  double forward_ms_per_sample() const;
  double backward_ms_per_sample() const;
  // Activation bytes per sample of the last forward (outputs + saved tensors).
  double activation_bytes_per_sample() const;
};

class LayerProfiler {
 public:
  explicit LayerProfiler(const Model& model);

  // What Model::forward_layer measured of one forward.
  struct ForwardSample {
    double seconds = 0.0;
    int64_t batch = 0;
    size_t output_bytes = 0;
    size_t peak_extra_bytes = 0;
  };
  void record_forward(size_t layer, const TensorList& inputs, const TensorList& outputs,
                      const LayerTape& tape, const ForwardSample& sample);
  void record_backward(size_t layer, double seconds, size_t peak_extra_bytes = 0);
  // Forgets the timings (e.g. after warm-up steps), keeps names and parameter sizes.
  void reset();

  const std::vector<LayerProfile>& layers() const { return layers_; }
  // A fixed-width table, one row per layer, with totals.
  std::string table() const;
  // The profile as a JSON document (one object per layer).
  std::string to_json() const;

 private:
  std::vector<LayerProfile> layers_;
  // The storages the last recorded forward's tape kept, and its layer (for shared_bytes).
  size_t last_layer_ = static_cast<size_t>(-1);
  std::vector<std::weak_ptr<Storage>> last_saved_;
};

}  // namespace strata::graph
