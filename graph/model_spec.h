// ModelSpec (io/proto/strata.proto): a model as data, in code or in a .prototxt file.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/model.h"
#include "io/proto/strata.pb.h"

namespace strata::graph {

// Parses text-format ModelSpec. Errors name `source` (a file name), the line and column.
proto::ModelSpec parse_model_spec(const std::string& text, const std::string& source);
// Reads and parses a .prototxt file; a missing or unreadable file names the path.
proto::ModelSpec load_model_spec(const std::string& path);
std::string model_spec_to_text(const proto::ModelSpec& spec);

// The layer types a ModelSpec may use.
const std::vector<std::string>& spec_layer_types();

// Builds the model, checking every layer against the shape flowing into it. Layers without a
// name are called "<type><index>". Errors name the layer (index and name) and the problem.
std::unique_ptr<Model> build_model(const proto::ModelSpec& spec);

}  // namespace strata::graph
