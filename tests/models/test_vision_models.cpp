// VGG and ResNet: parameter counts equal torchvision's, layer names follow torchvision's modules,
// output shapes and the stem for 224 and 32 px inputs, and a short training run of the tiny
// ResNet on real Fashion-MNIST.
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "graph/model_spec.h"
#include "graph/param_store.h"
#include "io/mnist.h"
#include "models/registry.h"
#include "parallel/trainer.h"

namespace strata::models {
namespace {

// Trainable parameters (torchvision's sum of p.numel() over model.parameters()) from the layers'
// specs, without allocating them; a tied parameter counts once, with its owner.
int64_t count_params(const graph::Model& model) {
  int64_t n = 0;
  for (size_t i = 0; i < model.size(); ++i) {
    for (const graph::ParamSpec& p : model.layer(i).param_specs()) {
      if (p.tied_to.empty()) n += shape_numel(p.shape);
    }
  }
  return n;
}

std::unique_ptr<graph::Model> build(const std::string& name, const std::string& size,
                                    const Shape& input, int64_t classes) {
  return graph::build_model(model_spec(name, size, input, classes));
}

const Shape kImageNet{3, 224, 224};
const Shape kCifar{3, 32, 32};

TEST(VisionModels, VggParameterCountsMatchTorchvision) {
  const std::vector<std::pair<std::string, int64_t>> expected{
      {"11", 132863336}, {"11-bn", 132868840}, {"13", 133047848}, {"13-bn", 133053736},
      {"16", 138357544}, {"16-bn", 138365992}, {"19", 143667240}, {"19-bn", 143678248},
  };
  for (const auto& [size, count] : expected) {
    EXPECT_EQ(count_params(*build("vgg", size, kImageNet, 1000)), count) << "vgg" << size;
  }
}

TEST(VisionModels, ResNetParameterCountsMatchTorchvision) {
  const std::vector<std::pair<std::string, int64_t>> expected{
      {"18", 11689512}, {"34", 21797672}, {"50", 25557032}, {"101", 44549160}, {"152", 60192808},
  };
  for (const auto& [size, count] : expected) {
    EXPECT_EQ(count_params(*build("resnet", size, kImageNet, 1000)), count) << "resnet" << size;
  }
}

TEST(VisionModels, ParamStoreCountsTheSame) {
  auto model = build("resnet", "tiny", {1, 28, 28}, 10);
  graph::ParamStore store(*model, 0, model->size(), default_cpu_allocator());
  EXPECT_EQ(store.num_params(), count_params(*model));
  // conv1 3x3 1->8 (72), bn1 (16); layer1.0: 2 x (8->8 3x3 576 + bn 16); layer2.0: 8->16 3x3
  // (1152) + bn (32), 16->16 3x3 (2304) + bn (32), downsample 8->16 1x1 (128) + bn (32); fc 16->10
  // (170).
  EXPECT_EQ(store.num_params(), 72 + 16 + 2 * (576 + 16) + 1152 + 32 + 2304 + 32 + 128 + 32 + 170);
}

TEST(VisionModels, VggLayoutAndShapes) {
  auto vgg16 = build("vgg", "16", kImageNet, 1000);
  // 13 convolutions + 13 ReLUs + 5 pools, then avgpool, flatten and 7 classifier modules.
  ASSERT_EQ(vgg16->size(), 31u + 2 + 7);
  EXPECT_EQ(vgg16->layer(0).name(), "features.0");
  EXPECT_EQ(std::string(vgg16->layer(30).type()), "max_pool2d");
  EXPECT_EQ(vgg16->layer(30).name(), "features.30");
  EXPECT_EQ(vgg16->shape_before(31), (Shape{512, 7, 7}));
  EXPECT_EQ(vgg16->layer(31).name(), "avgpool");
  EXPECT_EQ(vgg16->layer(39).name(), "classifier.6");
  EXPECT_EQ(vgg16->output_shape(), (Shape{1000}));
  // The -bn variants put batch norm at torchvision's indices: features.1 after features.0.
  auto vgg11bn = build("vgg", "11-bn", kImageNet, 1000);
  EXPECT_EQ(std::string(vgg11bn->layer(1).type()), "batch_norm");
  EXPECT_EQ(vgg11bn->layer(1).name(), "features.1");
  EXPECT_EQ(vgg11bn->layer(28).name(), "features.28");  // the last pool of vgg11_bn
  // 32 px: five halvings reach 1 x 1, the adaptive pool still gives 7 x 7 (counts unchanged).
  auto cifar = build("vgg", "16", kCifar, 10);
  EXPECT_EQ(cifar->shape_before(31), (Shape{512, 1, 1}));
  EXPECT_EQ(cifar->shape_before(32), (Shape{512, 7, 7}));
  EXPECT_EQ(cifar->output_shape(), (Shape{10}));
  EXPECT_EQ(count_params(*cifar), 138357544 - 4097000 + 4096 * 10 + 10);
  // Too small for five halvings: an error that says so.
  try {
    build("vgg", "16", {1, 28, 28}, 10);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at least 32 x 32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--size 16-small"), std::string::npos) << e.what();
  }
  // The small variant: 28 px reaches 1 x 1 after four pools and the fifth is left out; a
  // 512-wide classifier after a global average pool.
  auto small = build("vgg", "11-small", {1, 28, 28}, 10);
  EXPECT_EQ(count_params(*small), 9749770);
  EXPECT_EQ(small->output_shape(), (Shape{10}));
  int pools = 0;
  for (size_t i = 0; i < small->size(); ++i) {
    pools += std::string(small->layer(i).type()) == "max_pool2d" ? 1 : 0;
  }
  EXPECT_EQ(pools, 4);
  auto small_cifar = build("vgg", "11-bn-small", kCifar, 10);
  int cifar_pools = 0;
  for (size_t i = 0; i < small_cifar->size(); ++i) {
    cifar_pools += std::string(small_cifar->layer(i).type()) == "max_pool2d" ? 1 : 0;
  }
  EXPECT_EQ(cifar_pools, 5);
  EXPECT_EQ(small_cifar->output_shape(), (Shape{10}));
  for (const std::string size : {"tiny", "tiny-bn"}) {
    EXPECT_EQ(build("vgg", size, {1, 28, 28}, 10)->output_shape(), (Shape{10})) << size;
  }
}

TEST(VisionModels, ResNetStemsAndShapes) {
  auto imagenet = build("resnet", "50", kImageNet, 1000);
  EXPECT_EQ(imagenet->layer(3).name(), "maxpool");
  EXPECT_EQ(imagenet->shape_before(1), (Shape{64, 112, 112}));  // conv1 7x7 stride 2
  EXPECT_EQ(imagenet->shape_before(4), (Shape{64, 56, 56}));
  const size_t layer4 = *imagenet->find("layer4.0");
  EXPECT_EQ(imagenet->shape_before(layer4), (Shape{1024, 14, 14}));
  EXPECT_EQ(imagenet->shape_before(*imagenet->find("avgpool")), (Shape{2048, 7, 7}));
  EXPECT_EQ(imagenet->output_shape(), (Shape{1000}));
  EXPECT_EQ(imagenet->layer(imagenet->size() - 1).name(), "fc");
  // 3 + 4 + 6 + 3 blocks between the stem's 4 layers and the head's 3.
  EXPECT_EQ(imagenet->size(), 4u + 16 + 3);

  auto cifar = build("resnet", "18", kCifar, 10);
  EXPECT_FALSE(cifar->find("maxpool").has_value());
  EXPECT_EQ(cifar->shape_before(1), (Shape{64, 32, 32}));  // conv1 3x3 stride 1
  EXPECT_EQ(cifar->shape_before(*cifar->find("layer4.0")), (Shape{256, 8, 8}));
  EXPECT_EQ(cifar->shape_before(*cifar->find("avgpool")), (Shape{512, 4, 4}));
  EXPECT_EQ(cifar->output_shape(), (Shape{10}));
  // The small stem's conv1 is 3x3 (1728 weights instead of 9408); the rest is the same.
  EXPECT_EQ(count_params(*cifar), 11689512 - 9408 + 1728 - 513000 + 5130);

  // The threshold: 64 px takes the small stem, 65 px the ImageNet one.
  EXPECT_FALSE(build("resnet", "tiny", {3, 64, 64}, 10)->find("maxpool").has_value());
  EXPECT_TRUE(build("resnet", "tiny", {3, 65, 65}, 10)->find("maxpool").has_value());
  auto tiny = build("resnet", "tiny", {1, 28, 28}, 10);
  EXPECT_EQ(tiny->shape_before(*tiny->find("avgpool")), (Shape{16, 14, 14}));
}

TEST(VisionModels, BadRequestsAreClearErrors) {
  EXPECT_THROW(model_spec("resnet", "20", kCifar, 10), Error);
  EXPECT_THROW(model_spec("vgg", "16-ln", kCifar, 10), Error);
  try {
    model_spec("resnet", "18", {32, 32}, 10);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(C, H, W)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model_spec("vgg", "tiny", kCifar, 0), Error);
}

// Records the logged (windowed mean) losses.
class LossLog : public parallel::TrainObserver {
 public:
  void on_log(const parallel::StepRecord& r) override { losses.push_back(r.loss); }
  std::vector<double> losses;
};

TEST(VisionModels, TinyResNetLearnsFashionMnist) {
  if (!std::filesystem::exists(io::kFashionMnistDir)) {
    GTEST_SKIP() << "Fashion-MNIST not installed (" << io::kFashionMnistPackage << ")";
  }
  ExecContext ctx;
  auto train = io::make_subset(io::open_fashion_mnist(io::kFashionMnistDir, "train"), 0, 2048);
  auto test = io::make_subset(io::open_fashion_mnist(io::kFashionMnistDir, "test"), 0, 500);
  parallel::TrainConfig config;
  config.steps = 40;
  config.batch_size = 32;
  config.seed = 1;
  config.log_every = 8;
  // A cosine decay to zero lets the running statistics catch up with the last weights, so the
  // evaluation (running statistics) sees what training (batch statistics) learned.
  config.optimizer.schedule.base_lr = 3e-2;
  config.optimizer.schedule.kind = ops::LrScheduleKind::kCosine;
  config.optimizer.schedule.total_steps = config.steps;
  LossLog log;
  parallel::Trainer trainer(ctx, model_spec("resnet", "tiny", {1, 28, 28}, 10), train, test, config,
                            parallel::PipelineConfig{}, nullptr, &log);
  const parallel::TrainSummary summary = trainer.run();
  ASSERT_EQ(summary.steps, 40);
  ASSERT_EQ(log.losses.size(), 5u);
  // ln(10) = 2.30 at chance. The global average pool leaves the tiny model 16 features, so it
  // learns more slowly than a CNN with a dense head: about 2.2 -> 1.5 and 45% in 40 steps.
  EXPECT_LT(log.losses.back(), 0.8 * log.losses.front())
      << log.losses.front() << " -> " << log.losses.back();
  ASSERT_TRUE(summary.last_eval.has_value());
  EXPECT_EQ(summary.last_eval->samples, 500);
  EXPECT_GT(summary.last_eval->accuracy, 0.3) << summary.last_eval->accuracy;
}

}  // namespace
}  // namespace strata::models
