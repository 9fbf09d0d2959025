// Per-layer profile: forward and backward time, activation bytes, parameter bytes.
//
// Model::forward/backward feed it when given one. The profile is what the pipeline partitioner
// balances stages with: time per sample and the bytes a stage boundary after each layer would
// send.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
  size_t saved_bytes = 0;         // last forward: bytes kept on the tape for backward
  int64_t last_batch = 0;         // batch of the last forward
  size_t param_bytes = 0;         // parameters of the layer (f32)

  double forward_ms_per_sample() const;
  double backward_ms_per_sample() const;
  // Activation bytes per sample of the last forward (outputs + saved tensors).
  double activation_bytes_per_sample() const;
};

class LayerProfiler {
 public:
  explicit LayerProfiler(const Model& model);

  void record_forward(size_t layer, double seconds, int64_t batch, size_t output_bytes,
                      size_t saved_bytes);
  void record_backward(size_t layer, double seconds);
  // Forgets the timings (e.g. after warm-up steps), keeps names and parameter sizes.
  void reset();

  const std::vector<LayerProfile>& layers() const { return layers_; }
  // A fixed-width table, one row per layer, with totals.
  std::string table() const;
  // The profile as a JSON document (one object per layer).
  std::string to_json() const;

 private:
  std::vector<LayerProfile> layers_;
};

}  // namespace strata::graph
