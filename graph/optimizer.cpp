#include "graph/optimizer.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/check.h"

namespace strata::graph {

OptimizerKind parse_optimizer(const std::string& name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adamw") return OptimizerKind::kAdamW;
  if (name == "adamw-vr") return OptimizerKind::kAdamWVr;
  STRATA_THROW() << "unknown optimizer '" << name << "' (valid: sgd, adamw, adamw-vr)";
}

const char* optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdamW:
      return "adamw";
    case OptimizerKind::kAdamWVr:
      return "adamw-vr";
  }
  return "?";
}

std::vector<std::string> optimizer_slot_names(const OptimizerConfig& config) {
  if (config.kind == OptimizerKind::kAdamW) return {"exp_avg", "exp_avg_sq"};
  if (config.kind == OptimizerKind::kAdamWVr) return {"exp_avg", "exp_avg_sq", "exp_avg_vr"};
  if (config.momentum > 0) return {"momentum"};
  return {};
}

Optimizer::Optimizer(ParamStore& store, const OptimizerConfig& config)
    : store_(store), config_(config) {
  STRATA_CHECK(config.weight_decay >= 0) << "--weight-decay must be >= 0";
  STRATA_CHECK(config.clip_grad_norm >= 0) << "--clip-grad-norm must be >= 0";
  config_.schedule.lr_at(0);  // validates the schedule's fields up front
  if (config.kind == OptimizerKind::kSgd) {
    STRATA_CHECK(config.momentum >= 0 && config.momentum < 1) << "--momentum must be in [0, 1)";
    STRATA_CHECK(!config.nesterov || config.momentum > 0) << "--nesterov needs --momentum > 0";
  }
  STRATA_CHECK(config.variance_scale > 0 && config.variance_scale <= 1)
      << "optimizer: the variance scale of adamw-vr must be in (0, 1], got "
      << config.variance_scale;
  store_.ensure_state(optimizer_slot_names(config).size());
}

OptimizerStepInfo Optimizer::step(ExecContext& ctx, int64_t step, const GlobalSum& global_sum,
                                  double grad_scale) {
  STRATA_CHECK(grad_scale > 0 && std::isfinite(grad_scale))
      << "optimizer: gradient scale " << grad_scale;
  OptimizerStepInfo info;
  info.lr = config_.schedule.lr_at(step);
  const auto& entries = store_.param_entries();
  // The first parameter whose gradient's sum of squares is not finite ("" when none).
  auto first_non_finite = [&](const std::vector<double>& sq) {
    for (size_t i = 0; i < entries.size(); ++i) {
      if (!std::isfinite(sq[i])) return entries[i].full_name();
    }
    return std::string();
  };
  // The norm is needed before the update to clip by it, to leave a non-finite step unapplied, or
  // to unscale a scaled loss's gradients: then it is its own pass over the gradients. Otherwise
  // each update sums the squares of its gradient in the pass that reads it (adamw_step_sq).
  const bool norm_first =
      config_.clip_grad_norm > 0 || config_.skip_non_finite || grad_scale != 1.0;
  double factor = 1.0 / grad_scale;
  if (norm_first) {
    double local = ops::sum_of_squares(ctx, store_.grads());
    for (size_t i : store_.tied_copies()) local -= ops::sum_of_squares(ctx, store_.grad(i));
    const double total = global_sum ? global_sum(local) : local;
    info.grad_norm = std::sqrt(std::max(total, 0.0)) / grad_scale;
    if (!std::isfinite(total)) {
      info.non_finite = true;
      std::vector<double> sq(entries.size(), 0.0);
      for (size_t i = 0; i < entries.size(); ++i) {
        if (!entries[i].alias) sq[i] = ops::sum_of_squares(ctx, store_.grad(i));
      }
      info.first_non_finite = first_non_finite(sq);
      if (config_.skip_non_finite) {
        info.skipped = true;
        return info;
      }
    }
    if (config_.clip_grad_norm > 0) {
      factor *= ops::clip_coefficient(info.grad_norm, config_.clip_grad_norm);
    }
  }
  std::vector<double> sq(entries.size(), 0.0);  // per parameter, when the updates sum them
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].alias) continue;  // updated through its owner
    const double wd = entries[i].weight_decay ? config_.weight_decay : 0.0;
    if (config_.kind == OptimizerKind::kSgd) {
      ops::SgdOptions o;
      o.lr = info.lr;
      o.momentum = config_.momentum;
      o.nesterov = config_.nesterov;
      o.weight_decay = wd;
      o.grad_scale = factor;
      const Tensor buf = config_.momentum > 0 ? store_.state_view(0, i) : Tensor();
      if (norm_first) {
        ops::sgd_step(ctx, store_.param(i), store_.grad(i), buf, o, step + 1);
      } else {
        sq[i] = ops::sgd_step_sq(ctx, store_.param(i), store_.grad(i), buf, o, step + 1);
      }
    } else if (config_.kind == OptimizerKind::kAdamWVr) {
      ops::AdamWVrOptions o;
      o.adam.lr = info.lr;
      o.adam.beta1 = config_.beta1;
      o.adam.beta2 = config_.beta2;
      o.adam.eps = config_.eps;
      o.adam.weight_decay = wd;
      o.variance_scale = config_.variance_scale;
      // adamw_vr_step has no fused sum of squares nor gradient scale: both are passes of their own.
      if (!norm_first) sq[i] = ops::sum_of_squares(ctx, store_.grad(i));
      if (factor != 1.0) ops::scale_gradients(ctx, {store_.grad(i)}, factor);
      ops::adamw_vr_step(ctx, store_.param(i), store_.grad(i), store_.state_view(0, i),
                         store_.state_view(1, i), store_.state_view(2, i), o, step + 1);
    } else {
      ops::AdamWOptions o;
      o.lr = info.lr;
      o.beta1 = config_.beta1;
      o.beta2 = config_.beta2;
      o.eps = config_.eps;
      o.weight_decay = wd;
      o.grad_scale = factor;
      if (norm_first) {
        ops::adamw_step(ctx, store_.param(i), store_.grad(i), store_.state_view(0, i),
                        store_.state_view(1, i), o, step + 1);
      } else {
        sq[i] = ops::adamw_step_sq(ctx, store_.param(i), store_.grad(i), store_.state_view(0, i),
                                   store_.state_view(1, i), o, step + 1);
      }
    }
  }
  if (!norm_first) {
    double local = 0.0;  // copies of tied parameters owned elsewhere are counted by their owner
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].tied_to.empty()) local += sq[i];
    }
    const double total = global_sum ? global_sum(local) : local;
    info.grad_norm = std::sqrt(std::max(total, 0.0));
    if (!std::isfinite(total)) {
      info.non_finite = true;
      info.first_non_finite = first_non_finite(sq);
    }
  }
  return info;
}

}  // namespace strata::graph
