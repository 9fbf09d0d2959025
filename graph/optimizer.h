// Optimizer: the update rule, learning-rate schedule and gradient clipping for one ParamStore.
//
// Weight decay applies to parameters whose spec asks for it (weights of convolutions and linear
// layers), not to biases and normalization parameters, as the GPT-2 and BERT recipes do.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/exec_context.h"
#include "graph/param_store.h"
#include "ops/lr_schedule.h"
#include "ops/optimizer.h"

namespace strata::graph {

// adamw-vr: AdamW with the variance reduction of SDPipe for averaged replicas (ops::adamw_vr_step,
// scale OptimizerConfig::variance_scale).
enum class OptimizerKind { kSgd, kAdamW, kAdamWVr };
// Parses sgd|adamw|adamw-vr; throws strata::Error listing them otherwise.
OptimizerKind parse_optimizer(const std::string& name);
const char* optimizer_name(OptimizerKind kind);

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  ops::LrSchedule schedule;  // base_lr is the learning rate
  double weight_decay = 0.0;
  double momentum = 0.9;        // sgd
  bool nesterov = false;        // sgd
  double beta1 = 0.9;           // adamw
  double beta2 = 0.999;         // adamw
  double eps = 1e-8;            // adamw
  double variance_scale = 1.0;  // adamw-vr: 1/N for N replicas that average their weights
  double clip_grad_norm = 0.0;  // 0: no clipping
  // A step whose global gradient norm is not finite (NaN or inf anywhere) leaves the parameters
  // and the optimizer state as they are, and says so in OptimizerStepInfo. This needs the norm
  // before the update, a pass over the gradients of its own; without it (and without clipping or
  // a loss scale) the update computes the norm as it reads the gradients, and a non-finite one
  // is reported (OptimizerStepInfo::non_finite) after the update spread it.
  bool skip_non_finite = true;
};

// Names of the optimizer state slots the config keeps in the ParamStore, in slot order:
// sgd with momentum {"momentum"}, sgd without {}, adamw {"exp_avg", "exp_avg_sq"}, adamw-vr
// {"exp_avg", "exp_avg_sq", "exp_avg_vr"} (its extra first moment, with beta2).
std::vector<std::string> optimizer_slot_names(const OptimizerConfig& config);

struct OptimizerStepInfo {
  double lr = 0.0;
  double grad_norm = 0.0;   // global norm before clipping
  bool non_finite = false;  // the global gradient norm is not finite
  bool skipped = false;     // non-finite gradient, update skipped (skip_non_finite)
  // When non_finite: the first parameter of this store ("layer.name") with a non-finite
  // gradient, empty when this store's gradients are finite (the non-finite value is on another
  // stage).
  std::string first_non_finite;
};

class Optimizer {
 public:
  Optimizer(ParamStore& store, const OptimizerConfig& config);
  // Maps this store's gradient sum of squares to that of the whole model (a pipeline sums it over
  // its stages); the identity when the store holds the whole model.
  using GlobalSum = std::function<double(double)>;

  // Applies optimizer step `step` (counting from 0) to the store's parameters from its
  // accumulated gradients: clip by the global norm (when configured), then update with the
  // schedule's rate. Gradients are left as they are (zero them before the next accumulation).
  // Copies of tied parameters owned by another store are left out of the norm (their owner
  // counts them once). `grad_scale`: the gradients are that many times the true ones (loss
  // scaling, a power of two): the norm is reported unscaled and the gradients are divided by it
  // together with the clipping factor, before the update (bit for bit an unscaled step in fp32).
  OptimizerStepInfo step(ExecContext& ctx, int64_t step, const GlobalSum& global_sum = nullptr,
                         double grad_scale = 1.0);
  const OptimizerConfig& config() const { return config_; }

 private:
  ParamStore& store_;
  OptimizerConfig config_;
};

}  // namespace strata::graph
