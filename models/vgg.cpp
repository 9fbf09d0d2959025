// VGG (Simonyan & Zisserman 2015) in torchvision's layout, so that layer names and parameter
// counts match torchvision.models.vgg*:
//
//   features.i    conv 3x3 pad 1 (bias) [+ batch_norm] + relu per width in the configuration,
//                 max_pool 2x2 per "M"; indices count every module as torchvision's Sequential
//   avgpool       adaptive average pool to 7 x 7 (also for small inputs: 32 px images reach it as
//                 1 x 1 and are replicated, as in torchvision)
//   flatten
//   classifier.i  linear(512 7 7, 4096) relu dropout(0.5) linear(4096, 4096) relu dropout
//                 linear(4096, classes)
//
// The tiny sizes keep that layout with widths (8, M, 16, 16, M) and a classifier of 64 hidden
// units, for tests. Initialization is Strata's default (PyTorch's uniform +-1/sqrt(fan_in) for
// convolutions and linear layers), not torchvision's kaiming-normal / normal(0, 0.01) re-init.
#include <string>
#include <vector>

#include "engine/check.h"
#include "models/families.h"

namespace strata::models {
namespace {

constexpr int64_t kPool = 0;  // "M" in torchvision's configurations

struct VggConfig {
  std::vector<int64_t> features;  // widths of the 3x3 convolutions, kPool for a 2x2 max pool
  int64_t hidden;                 // width of the classifier's hidden layers
};

VggConfig vgg_config(const std::string& depth) {
  const int64_t M = kPool;
  if (depth == "11") return {{64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M}, 4096};
  if (depth == "13") {
    return {{64, 64, M, 128, 128, M, 256, 256, M, 512, 512, M, 512, 512, M}, 4096};
  }
  if (depth == "16") {
    return {{64, 64, M, 128, 128, M, 256, 256, 256, M, 512, 512, 512, M, 512, 512, 512, M}, 4096};
  }
  if (depth == "19") {
    return {{64,  64,  M,   128, 128, M,   256, 256, 256, 256, M,
             512, 512, 512, 512, M,   512, 512, 512, 512, M},
            4096};
  }
  if (depth == "tiny") return {{8, M, 16, 16, M}, 64};
  STRATA_THROW() << "model vgg has no size '" << depth
                 << "' (valid: 11, 13, 16, 19, 11-bn, 13-bn, 16-bn, 19-bn, tiny, tiny-bn)";
}

proto::LayerSpec* add(proto::ModelSpec* spec, const std::string& name, const std::string& type) {
  proto::LayerSpec* l = spec->add_layer();
  l->set_name(name);
  l->set_type(type);
  return l;
}

}  // namespace

proto::ModelSpec vgg_spec(const ModelRequest& request) {
  const std::string& size = request.size;
  const std::string suffix = "-bn";
  const bool batch_norm = size.size() > suffix.size() &&
                          size.compare(size.size() - suffix.size(), suffix.size(), suffix) == 0;
  const VggConfig config =
      vgg_config(batch_norm ? size.substr(0, size.size() - suffix.size()) : size);
  STRATA_CHECK_GT(request.num_classes, 0) << "model vgg needs a classification dataset";
  const Shape& in = request.input_shape;
  STRATA_CHECK(in.size() == 3u && in[0] > 0)
      << "model vgg needs image samples (C, H, W), got " << shape_str(in);
  int64_t pools = 0;
  for (int64_t w : config.features) pools += w == kPool ? 1 : 0;
  const int64_t min_side = int64_t{1} << pools;
  STRATA_CHECK(in[1] >= min_side && in[2] >= min_side)
      << "model vgg-" << size << " halves the image " << pools << " times and needs at least "
      << min_side << " x " << min_side << " px, got " << shape_str(in);

  proto::ModelSpec spec;
  spec.set_name("vgg-" + size);
  spec.set_num_classes(request.num_classes);
  for (int64_t d : in) spec.mutable_input()->add_shape(d);
  int index = 0;
  auto feature = [&](const std::string& type) {
    return add(&spec, "features." + std::to_string(index++), type);
  };
  for (int64_t width : config.features) {
    if (width == kPool) {
      proto::PoolSpec* pool = feature("max_pool2d")->mutable_pool();
      pool->set_kernel_size(2);
      pool->set_stride(2);
      continue;
    }
    proto::Conv2dSpec* conv = feature("conv2d")->mutable_conv2d();
    conv->set_out_channels(width);
    conv->set_kernel_size(3);
    conv->set_padding(1);
    conv->set_bias(true);  // torchvision keeps the bias even before batch norm
    if (batch_norm) feature("batch_norm");
    feature("relu");
  }
  proto::AdaptivePoolSpec* pool =
      add(&spec, "avgpool", "adaptive_avg_pool2d")->mutable_adaptive_pool();
  pool->set_output_h(7);
  pool->set_output_w(7);
  add(&spec, "flatten", "flatten");
  add(&spec, "classifier.0", "linear")->mutable_linear()->set_out_features(config.hidden);
  add(&spec, "classifier.1", "relu");
  add(&spec, "classifier.2", "dropout")->mutable_dropout()->set_p(0.5);
  add(&spec, "classifier.3", "linear")->mutable_linear()->set_out_features(config.hidden);
  add(&spec, "classifier.4", "relu");
  add(&spec, "classifier.5", "dropout")->mutable_dropout()->set_p(0.5);
  add(&spec, "classifier.6", "linear")->mutable_linear()->set_out_features(request.num_classes);
  return spec;
}

}  // namespace strata::models
