#include "models/families.h"

#include "engine/check.h"

namespace strata::models {
namespace {

proto::LayerSpec* add(proto::ModelSpec* spec, const std::string& name, const std::string& type) {
  proto::LayerSpec* l = spec->add_layer();
  l->set_name(name);
  l->set_type(type);
  return l;
}

void set_input(proto::ModelSpec* spec, const Shape& input_shape) {
  for (int64_t d : input_shape) spec->mutable_input()->add_shape(d);
}

}  // namespace

proto::ModelSpec cnn_spec(const ModelRequest& request) {
  const std::string& size = request.size;
  const Shape& input_shape = request.input_shape;
  const int64_t num_classes = request.num_classes;
  STRATA_CHECK_GT(num_classes, 0) << "model cnn needs a classification dataset";
  int64_t c1 = 0, c2 = 0, hidden = 0;
  if (size == "tiny") {
    c1 = 8, c2 = 16, hidden = 32;
  } else if (size == "small") {
    c1 = 32, c2 = 64, hidden = 128;
  } else {
    STRATA_THROW() << "model cnn has no size '" << size << "' (valid: tiny, small)";
  }
  STRATA_CHECK_EQ(input_shape.size(), 3u)
      << "model cnn needs image samples (C, H, W), got " << shape_str(input_shape);
  proto::ModelSpec spec;
  spec.set_name("cnn-" + size);
  spec.set_num_classes(num_classes);
  set_input(&spec, input_shape);
  const int64_t channels[2] = {c1, c2};
  for (int b = 0; b < 2; ++b) {
    const std::string s = std::to_string(b + 1);
    proto::LayerSpec* conv = add(&spec, "conv" + s, "conv2d");
    conv->mutable_conv2d()->set_out_channels(channels[b]);
    conv->mutable_conv2d()->set_kernel_size(3);
    conv->mutable_conv2d()->set_padding(1);
    conv->mutable_conv2d()->set_bias(false);  // the batch norm's shift replaces it
    add(&spec, "bn" + s, "batch_norm");
    add(&spec, "relu" + s, "relu");
    add(&spec, "pool" + s, "max_pool2d")->mutable_pool()->set_kernel_size(2);
  }
  add(&spec, "flatten", "flatten");
  add(&spec, "fc1", "linear")->mutable_linear()->set_out_features(hidden);
  add(&spec, "relu3", "relu");
  add(&spec, "fc2", "linear")->mutable_linear()->set_out_features(num_classes);
  return spec;
}

proto::ModelSpec mlp_spec(const ModelRequest& request) {
  const std::string& size = request.size;
  const Shape& input_shape = request.input_shape;
  const int64_t num_classes = request.num_classes;
  STRATA_CHECK_GT(num_classes, 0) << "model mlp needs a classification dataset";
  int64_t hidden = 0;
  if (size == "tiny") {
    hidden = 32;
  } else if (size == "small") {
    hidden = 256;
  } else {
    STRATA_THROW() << "model mlp has no size '" << size << "' (valid: tiny, small)";
  }
  proto::ModelSpec spec;
  spec.set_name("mlp-" + size);
  spec.set_num_classes(num_classes);
  set_input(&spec, input_shape);
  add(&spec, "flatten", "flatten");
  add(&spec, "fc1", "linear")->mutable_linear()->set_out_features(hidden);
  add(&spec, "relu1", "relu");
  add(&spec, "fc2", "linear")->mutable_linear()->set_out_features(num_classes);
  return spec;
}

}  // namespace strata::models
