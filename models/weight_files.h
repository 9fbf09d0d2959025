// Model weights in safetensors files: a ParamStore written under Strata's or the reference
// implementations' names (models/weight_names.h), and read back into a store, which may hold
// only one pipeline stage's layers.
//
// Reading checks the whole file against the whole model before it loads a value, so that every
// stage of a pipeline fails alike: a tensor the model needs and the file lacks, a tensor the file
// has and the model has no place for, a shape or dtype that does not fit, each named with the file,
// the model and Strata's name. Floating-point tensors of any width (F16, BF16, F32, F64) are
// converted to the store's dtype; integer tensors where weights belong are errors. Then the store
// loads only what its layers hold: its parameters (a tied copy from its owner's tensor) and its
// buffers (batch-norm running statistics). Gradients and optimizer state are left alone.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graph/model.h"
#include "graph/param_store.h"
#include "models/weight_names.h"

namespace strata::models {

// Metadata keys Strata writes (besides "format": "pt", which Hugging Face's loaders require).
inline constexpr char kWeightsNamingKey[] = "strata.naming";         // "hf" or "strata"
inline constexpr char kWeightsModelKey[] = "strata.model";           // the model's name
inline constexpr char kWeightsModelSpecKey[] = "strata.model_spec";  // text ModelSpec (optional)

struct WeightsReadOptions {
  // The names the file uses; nullopt: its strata.naming metadata, else whichever naming matches
  // more of its tensor names (hf on a tie).
  std::optional<WeightNaming> naming;
  // Skip tensors the model has no place for (a BERT checkpoint's pooler and next-sentence head)
  // instead of failing; they are listed in the report.
  bool ignore_extra = false;
};

struct WeightsReadReport {
  WeightNaming naming = WeightNaming::kHuggingFace;
  int64_t tensors_loaded = 0;          // file tensors read into this store
  std::vector<std::string> ignored;    // file tensors not loaded (non-parameters, counters, extra)
  std::vector<std::string> extra;      // of those, the ones ignore_extra let through
  std::vector<std::string> converted;  // "name (BF16)": read from another dtype
};

// The naming `options` asks for, or the one detected from the file (see WeightsReadOptions).
WeightNaming detect_weight_naming(const std::string& path, const graph::Model& model,
                                  const WeightsReadOptions& options = {});

// Checks `path` against `model` and loads the layers `store` holds (see above). Throws
// strata::Error naming the file and the tensor.
WeightsReadReport load_weights(const std::string& path, const graph::Model& model,
                               graph::ParamStore& store, const WeightsReadOptions& options = {});

// Writes every parameter (tied ones once) and buffer of `store`, which must hold all of `model`'s
// layers, under `naming`, with `metadata` plus format, strata.naming and strata.model.
void save_weights(const std::string& path, const graph::Model& model,
                  const graph::ParamStore& store, WeightNaming naming,
                  const std::map<std::string, std::string>& metadata = {});

}  // namespace strata::models
