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
// The "-small" sizes (11-small, 11-bn-small, ...) are for 28-32 px images (Fashion-MNIST, CIFAR):
// the same features, except that a max pool is left out where the image is already 1 px wide
// (28 px reaches 1 x 1 after four), then a global average pool and a classifier of 512 hidden
// units (linear(512, 512) relu dropout linear(512, 512) relu dropout linear(512, classes)), as
// the CIFAR VGGs do, instead of replicating 1 x 1 to 7 x 7 into 4096-wide layers (9.2M
// parameters for VGG-11-small against 128.8M for VGG-11 on 10 classes).
//
// The tiny sizes keep that layout with widths (8, M, 16, 16, M) and a classifier of 64 hidden
// units, for tests. Initialization is Strata's default (PyTorch's uniform +-1/sqrt(fan_in) for
// convolutions and linear layers), not torchvision's kaiming-normal / normal(0, 0.01) re-init.
#include <algorithm>
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
                 << "' (valid: 11, 13, 16, 19, tiny, each with -bn and/or -small)";
}

proto::LayerSpec* add(proto::ModelSpec* spec, const std::string& name, const std::string& type) {
  proto::LayerSpec* l = spec->add_layer();
  l->set_name(name);
  l->set_type(type);
  return l;
}

// Removes `suffix` from the end of *s if it is there.
bool strip_suffix(std::string* s, const std::string& suffix) {
  if (s->size() <= suffix.size() ||
      s->compare(s->size() - suffix.size(), suffix.size(), suffix) != 0) {
    return false;
  }
  s->resize(s->size() - suffix.size());
  return true;
}

}  // namespace

proto::ModelSpec vgg_spec(const ModelRequest& request) {
  const std::string& size = request.size;
  std::string depth = size;
  const bool small = strip_suffix(&depth, "-small");
  const bool batch_norm = strip_suffix(&depth, "-bn");
  const VggConfig config = vgg_config(depth);
  STRATA_CHECK_GT(request.num_classes, 0) << "model vgg needs a classification dataset";
  const Shape& in = request.input_shape;
  STRATA_CHECK(in.size() == 3u && in[0] > 0)
      << "model vgg needs image samples (C, H, W), got " << shape_str(in);
  int64_t pools = 0;
  for (int64_t w : config.features) pools += w == kPool ? 1 : 0;
  // The small variant leaves out the pools that would halve a 1 px image, so it only needs
  // every pool it keeps to see at least 2 px.
  const int64_t min_side = small ? 1 : int64_t{1} << pools;
  STRATA_CHECK(in[1] >= min_side && in[2] >= min_side)
      << "model vgg-" << size << " halves the image " << pools << " times and needs at least "
      << min_side << " x " << min_side << " px, got " << shape_str(in)
      << (small ? ""
                : " (for 28-32 px images use --size " + depth + (batch_norm ? "-bn" : "") +
                      "-small)");

  proto::ModelSpec spec;
  spec.set_name("vgg-" + size);
  spec.set_num_classes(request.num_classes);
  for (int64_t d : in) spec.mutable_input()->add_shape(d);
  int index = 0;
  auto feature = [&](const std::string& type) {
    return add(&spec, "features." + std::to_string(index++), type);
  };
  int64_t side_h = in[1], side_w = in[2];
  for (int64_t width : config.features) {
    if (width == kPool) {
      if (small && (side_h < 2 || side_w < 2)) continue;
      side_h /= 2;
      side_w /= 2;
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
  pool->set_output_h(small ? 1 : 7);
  pool->set_output_w(small ? 1 : 7);
  const int64_t hidden = small ? std::min<int64_t>(config.hidden, 512) : config.hidden;
  add(&spec, "flatten", "flatten");
  add(&spec, "classifier.0", "linear")->mutable_linear()->set_out_features(hidden);
  add(&spec, "classifier.1", "relu");
  add(&spec, "classifier.2", "dropout")->mutable_dropout()->set_p(0.5);
  add(&spec, "classifier.3", "linear")->mutable_linear()->set_out_features(hidden);
  add(&spec, "classifier.4", "relu");
  add(&spec, "classifier.5", "dropout")->mutable_dropout()->set_p(0.5);
  add(&spec, "classifier.6", "linear")->mutable_linear()->set_out_features(request.num_classes);
  return spec;
}

}  // namespace strata::models
