// The cost model a simulation runs on: per layer, the time of its forward and backward pass for
// a micro-batch of `rows` samples, and its sizes; per stage, the time of an optimizer step.
//
// Two sources of times:
//   profile       `strata profile --output` JSON (per-layer forward/backward ms per sample,
//                 measured on the CPU or a GPU). One profile scales a layer's time with the
//                 rows (t = rows x per-sample time). Profiles at two or more batch sizes
//                 (FILE@BATCH) are fitted per layer to t = fixed + rows x per sample (least
//                 squares; a negative fixed part is clamped to 0 and the slope refitted through
//                 the origin), which captures a device's fixed cost per call (kernel launches).
//   device model  the layer's work (layer_work.h) against a device (cluster.h):
//                   forward  = matmul / (peak x eff_matmul) + attention / (peak x eff_attention)
//                              + memory bytes / (bandwidth x eff_memory)
//                              + kernels x launch time
//                   backward = 2 x matmul part + 2.5 x attention part (the fused kernel
//                              recomputes the scores) + 2 x memory part + 2 x launches,
//                 per sample except the launches (a fixed cost per micro-batch). A causal
//                 attention computes half of the (query, key) pairs. The peak is the one of
//                 the run's precision (bf16/fp16, tf32 or plain fp32).
// Sizes (activation and parameter bytes) always come from the model's shapes (layer_work.h);
// a profile's byte counts are not used because they count a tensor that two layers keep twice.
//
// Optimizer step: memory-bound, over the stage's f32 parameters:
//   t = param_bytes x (2 + 1 + 2 x slots) / bandwidth / eff_memory   (read p, g, state; write p,
//   state) on a device; on a profile's CPU, measured seconds per parameter byte may be given.
#pragma once

#include <string>
#include <vector>

#include "parallel/sim/cluster.h"
#include "parallel/sim/layer_work.h"

namespace strata::parallel::sim {

// Per layer, what the simulator reads.
struct LayerModel {
  LayerWork work;    // sizes and tape memory (per sample)
  Linear forward_s;  // seconds for a micro-batch of `rows`: fixed + per_sample x rows
  Linear backward_s;
  double flops_per_sample = 0.0;  // forward FLOPs (work.matmul + work.attention)
};

struct Efficiency {
  double matmul = 0.7;
  double attention = 0.5;
  double memory = 0.8;
};
// "matmul=0.6,attention=0.4,memory=0.7" (any subset); throws naming the bad entry.
Efficiency parse_efficiency(const std::string& text, Efficiency base = {});

struct CostModel {
  std::vector<LayerModel> layers;
  std::string source;  // where the times come from, for reports
  // Optimizer step: seconds per byte of the stage's f32 parameters.
  double optimizer_s_per_param_byte = 0.0;
  // Per step and rank: what the training loop does besides the instructions (data, metrics).
  double step_overhead_s = 0.0;
};

struct DeviceCostOptions {
  Efficiency efficiency;
  double peak_flops = 0.0;       // the rate of the run's precision (DeviceSpec: bf16, tf32, fp32)
  bool causal_attention = true;  // half the (query, key) pairs are computed
  int optimizer_slots = 2;
};

CostModel device_cost_model(const std::vector<LayerWork>& work, const DeviceSpec& device,
                            const DeviceCostOptions& options);

// One profile: per-layer forward and backward ms per sample, measured at `batch` samples per
// call (0: unknown).
struct MeasuredProfile {
  std::string source;
  int64_t batch = 0;
  std::vector<double> forward_ms, backward_ms;  // per sample, one per layer
  std::vector<std::string> names;
};
// Reads `strata profile --output` JSON; `spec` is FILE or FILE@BATCH. Errors name the file.
MeasuredProfile read_profile(const std::string& spec);

// Times from the profiles (checked to name the layers of `work`, in order), sizes from `work`.
// Two or more profiles need distinct known batch sizes.
CostModel profile_cost_model(const std::vector<LayerWork>& work,
                             const std::vector<MeasuredProfile>& profiles);

}  // namespace strata::parallel::sim
