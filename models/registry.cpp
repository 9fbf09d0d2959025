#include "models/registry.h"

#include "engine/check.h"
#include "models/families.h"

namespace strata::models {

const std::vector<ModelInfo>& model_catalog() {
  static const std::vector<ModelInfo> kCatalog{
      {"cnn", {"tiny", "small"}, "small", "two conv-BN-ReLU-pool blocks and two linear layers"},
      {"mlp", {"tiny", "small"}, "small", "a two-layer perceptron"},
      {"vgg",
       {"11",          "13",          "16",          "19",         "11-bn",
        "13-bn",       "16-bn",       "19-bn",       "tiny",       "tiny-bn",
        "11-small",    "13-small",    "16-small",    "19-small",   "11-bn-small",
        "13-bn-small", "16-bn-small", "19-bn-small", "tiny-small", "tiny-bn-small"},
       "16",
       "VGG (Simonyan & Zisserman 2015), torchvision's layout; -small: 28-32 px images"},
      {"resnet",
       {"18", "34", "50", "101", "152", "tiny"},
       "18",
       "ResNet (He et al. 2016); the small-image stem below 64 px"},
      {"bert", {"base", "large", "tiny"}, "base", "BERT encoder with a masked-language-model head"},
      {"gpt2",
       {"124M", "355M", "774M", "1558M", "tiny"},
       "124M",
       "GPT-2 decoder with the output projection tied to the token embedding"},
  };
  return kCatalog;
}

std::string model_names() {
  std::string s;
  for (const ModelInfo& m : model_catalog()) s += (s.empty() ? "" : ", ") + m.name;
  return s;
}

const ModelInfo& model_info(const std::string& name) {
  for (const ModelInfo& m : model_catalog()) {
    if (m.name == name) return m;
  }
  STRATA_THROW() << "unknown model '" << name << "' (valid: " << model_names()
                 << "; or --model-spec FILE.prototxt)";
}

proto::ModelSpec model_spec(const ModelRequest& request) {
  const ModelInfo& info = model_info(request.name);
  ModelRequest r = request;
  if (r.size.empty()) r.size = info.default_size;
  bool known = false;
  for (const std::string& s : info.sizes) known = known || s == r.size;
  if (!known) {
    std::string sizes;
    for (const std::string& s : info.sizes) sizes += (sizes.empty() ? "" : ", ") + s;
    STRATA_THROW() << "model " << r.name << " has no size '" << r.size << "' (valid: " << sizes
                   << ")";
  }
  if (r.name == "cnn") return cnn_spec(r);
  if (r.name == "mlp") return mlp_spec(r);
  if (r.name == "vgg") return vgg_spec(r);
  if (r.name == "resnet") return resnet_spec(r);
  if (r.name == "bert") return bert_spec(r);
  return gpt2_spec(r);
}

proto::ModelSpec model_spec(const std::string& name, const std::string& size,
                            const Shape& input_shape, int64_t num_classes) {
  ModelRequest r;
  r.name = name;
  r.size = size;
  r.input_shape = input_shape;
  r.num_classes = num_classes;
  return model_spec(r);
}

}  // namespace strata::models
