// ResNet (He et al. 2016) in torchvision's layout, so that layer names and parameter counts match
// torchvision.models.resnet*:
//
//   stem     conv1 7x7 stride 2 pad 3, bn1, relu, maxpool 3x3 stride 2 pad 1 (inputs larger than
//            64 px: ImageNet); conv1 3x3 stride 1 pad 1, bn1, relu, no pooling (64 px or less:
//            CIFAR, Fashion-MNIST, where the ImageNet stem would shrink 32 px to 8 before the
//            first block)
//   stages   layer1..layer4 of resnet_block layers "layerS.i", widths 64, 128, 256, 512, the
//            first block of stages 2-4 with stride 2 (a projection shortcut where the stride or
//            the width changes: graph/resnet_block.cpp)
//   head     avgpool (adaptive 1 x 1), flatten, fc
//
// 18 and 34 use basic blocks, 50, 101 and 152 bottleneck blocks (expansion 4). The tiny size is
// two stages of one basic block each, widths 8 and 16, for tests.
#include <algorithm>
#include <string>
#include <vector>

#include "engine/check.h"
#include "models/families.h"

namespace strata::models {
namespace {

constexpr int64_t kSmallImageMaxSide = 64;

struct ResNetConfig {
  std::vector<int64_t> blocks;  // per stage
  std::vector<int64_t> widths;  // planes per stage
  bool bottleneck;
};

ResNetConfig resnet_config(const std::string& size) {
  const std::vector<int64_t> widths{64, 128, 256, 512};
  if (size == "18") return {{2, 2, 2, 2}, widths, false};
  if (size == "34") return {{3, 4, 6, 3}, widths, false};
  if (size == "50") return {{3, 4, 6, 3}, widths, true};
  if (size == "101") return {{3, 4, 23, 3}, widths, true};
  if (size == "152") return {{3, 8, 36, 3}, widths, true};
  if (size == "tiny") return {{1, 1}, {8, 16}, false};
  STRATA_THROW() << "model resnet has no size '" << size << "' (valid: 18, 34, 50, 101, 152, tiny)";
}

proto::LayerSpec* add(proto::ModelSpec* spec, const std::string& name, const std::string& type) {
  proto::LayerSpec* l = spec->add_layer();
  l->set_name(name);
  l->set_type(type);
  return l;
}

}  // namespace

proto::ModelSpec resnet_spec(const ModelRequest& request) {
  const std::string& size = request.size;
  const ResNetConfig config = resnet_config(size);
  STRATA_CHECK_GT(request.num_classes, 0) << "model resnet needs a classification dataset";
  const Shape& in = request.input_shape;
  STRATA_CHECK(in.size() == 3u && in[0] > 0 && in[1] > 0 && in[2] > 0)
      << "model resnet needs image samples (C, H, W), got " << shape_str(in);
  const bool imagenet_stem = std::max(in[1], in[2]) > kSmallImageMaxSide;

  proto::ModelSpec spec;
  spec.set_name("resnet-" + size);
  spec.set_num_classes(request.num_classes);
  for (int64_t d : in) spec.mutable_input()->add_shape(d);
  proto::Conv2dSpec* conv1 = add(&spec, "conv1", "conv2d")->mutable_conv2d();
  conv1->set_out_channels(config.widths.front());
  conv1->set_kernel_size(imagenet_stem ? 7 : 3);
  conv1->set_stride(imagenet_stem ? 2 : 1);
  conv1->set_padding(imagenet_stem ? 3 : 1);
  conv1->set_bias(false);
  add(&spec, "bn1", "batch_norm");
  add(&spec, "relu", "relu");
  if (imagenet_stem) {
    proto::PoolSpec* pool = add(&spec, "maxpool", "max_pool2d")->mutable_pool();
    pool->set_kernel_size(3);
    pool->set_stride(2);
    pool->set_padding(1);
  }
  for (size_t s = 0; s < config.blocks.size(); ++s) {
    for (int64_t b = 0; b < config.blocks[s]; ++b) {
      const std::string name = "layer" + std::to_string(s + 1) + "." + std::to_string(b);
      proto::ResNetBlockSpec* block = add(&spec, name, "resnet_block")->mutable_resnet_block();
      block->set_planes(config.widths[s]);
      block->set_stride(s > 0 && b == 0 ? 2 : 1);
      block->set_bottleneck(config.bottleneck);
    }
  }
  proto::AdaptivePoolSpec* avgpool =
      add(&spec, "avgpool", "adaptive_avg_pool2d")->mutable_adaptive_pool();
  avgpool->set_output_h(1);
  avgpool->set_output_w(1);
  add(&spec, "flatten", "flatten");
  add(&spec, "fc", "linear")->mutable_linear()->set_out_features(request.num_classes);
  return spec;
}

}  // namespace strata::models
