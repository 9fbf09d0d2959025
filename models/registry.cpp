#include "models/registry.h"

#include "engine/check.h"
#include "models/cnn.h"

namespace strata::models {

const std::vector<ModelInfo>& model_catalog() {
  static const std::vector<ModelInfo> kCatalog{
      {"cnn", {"tiny", "small"}, "small", "two conv-BN-ReLU-pool blocks and two linear layers"},
      {"mlp", {"tiny", "small"}, "small", "a two-layer perceptron"},
  };
  return kCatalog;
}

std::string model_names() {
  std::string s;
  for (const ModelInfo& m : model_catalog()) s += (s.empty() ? "" : ", ") + m.name;
  return s;
}

proto::ModelSpec model_spec(const std::string& name, const std::string& size,
                            const Shape& input_shape, int64_t num_classes) {
  STRATA_CHECK_GT(num_classes, 0) << "model " << name << " needs a classification dataset";
  for (const ModelInfo& m : model_catalog()) {
    if (m.name != name) continue;
    const std::string s = size.empty() ? m.default_size : size;
    if (name == "cnn") return cnn_spec(s, input_shape, num_classes);
    if (name == "mlp") return mlp_spec(s, input_shape, num_classes);
  }
  STRATA_THROW() << "unknown model '" << name << "' (valid: " << model_names()
                 << "; or --model-spec FILE.prototxt)";
}

}  // namespace strata::models
