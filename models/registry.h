// The built-in models, selected by name and size (`--model cnn --size small`). Each is returned
// as a ModelSpec, the same data a .prototxt file holds, and built by graph::build_model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/tensor.h"
#include "io/proto/strata.pb.h"

namespace strata::models {

struct ModelInfo {
  std::string name;
  std::vector<std::string> sizes;
  std::string default_size;
  std::string description;
};

// Every built-in model, in the order `--help` lists them.
const std::vector<ModelInfo>& model_catalog();
// "cnn, mlp"
std::string model_names();

// The spec of model `name` at `size` ("" = its default size) for samples of `input_shape` and
// `num_classes` outputs. Unknown names or sizes are errors listing the valid ones.
proto::ModelSpec model_spec(const std::string& name, const std::string& size,
                            const Shape& input_shape, int64_t num_classes);

}  // namespace strata::models
