#include "models/flops.h"

#include <cstring>

#include "engine/check.h"

namespace strata::models {
namespace {

bool is_embedding(const graph::Layer& layer) {
  return std::strcmp(layer.type(), "token_embedding") == 0 ||
         std::strcmp(layer.type(), "bert_embedding") == 0;
}

}  // namespace

ParamCounts count_params(const graph::Model& model) {
  ParamCounts c;
  for (size_t i = 0; i < model.size(); ++i) {
    const graph::Layer& layer = model.layer(i);
    for (const graph::ParamSpec& p : layer.param_specs()) {
      if (!p.tied_to.empty()) continue;  // counted with its owner
      c.total += graph::valid_numel(p);  // a padded vocabulary's padding is no parameter
      if (is_embedding(layer)) c.embedding += graph::valid_numel(p);
    }
  }
  return c;
}

double forward_flops_per_sample(const graph::Model& model) {
  return model.forward_flops(0, model.size());
}

TrainingFlops training_flops(const graph::Model& model) {
  TrainingFlops f;
  f.params = count_params(model);
  for (size_t i = 0; i < model.size(); ++i) {
    if (std::strcmp(model.layer(i).type(), "transformer_block") != 0) continue;
    const Shape& in = model.shape_before(i);  // (T, C)
    STRATA_CHECK_EQ(in.size(), 2u) << "transformer_block " << model.layer(i).name()
                                   << ": expected (T, C) samples, got " << shape_str(in);
    if (f.layers == 0) {
      f.seq_len = in[0];
      f.width = in[1];
    }
    ++f.layers;
  }
  if (f.layers > 0) {
    f.transformer = true;
    const double n = static_cast<double>(f.params.total);
    f.per_token = 6.0 * n + 12.0 * static_cast<double>(f.layers) * static_cast<double>(f.width) *
                                static_cast<double>(f.seq_len);
    f.per_sample = f.per_token * static_cast<double>(f.seq_len);
    f.formula =
        "6 N + 12 L C T per token (PaLM/llm.c; N = all parameters incl. the tied embedding, "
        "attention over the full T x T)";
  } else {
    f.per_sample = 3.0 * forward_flops_per_sample(model);
    f.formula = "3 x forward FLOPs of the conv and linear layers (2 x MACs)";
  }
  return f;
}

}  // namespace strata::models
