// The ResNet block layer against float64 finite differences, through a Model and its tapes:
// gradients of the input and of every parameter, for basic and bottleneck blocks with identity and
// projection shortcuts, in training and evaluation modes; parameter gradients accumulate; the
// running statistics move in training only; parameter names follow torchvision.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/layers.h"
#include "graph/model.h"
#include "graph/param_store.h"
#include "graph/resnet_block.h"
#include "testing/testing.h"

namespace strata::graph {
namespace {

using testing::gradients_match;
using testing::random_tensor;

proto::ResNetBlockSpec block_spec(int64_t planes, int64_t stride, bool bottleneck,
                                  int64_t expansion = 4) {
  proto::ResNetBlockSpec spec;
  spec.set_planes(planes);
  spec.set_stride(stride);
  spec.set_bottleneck(bottleneck);
  spec.set_expansion(expansion);
  return spec;
}

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<ParamStore> store;
};

// An identity layer in front, so that the block's input gradient is computed (needs_input_grad)
// unless `first` puts the block first.
Fixture make(const Shape& sample, const proto::ResNetBlockSpec& spec, bool first = false) {
  Fixture f;
  f.model = std::make_unique<Model>("test", sample);
  if (!first) f.model->add(std::make_unique<DropoutLayer>("input", 0.0));
  f.model->add(make_resnet_block("layer1.0", sample, spec));
  f.store = std::make_unique<ParamStore>(*f.model, 0, f.model->size(), default_cpu_allocator(),
                                         DType::kF64);
  f.store->initialize(7);
  // Non-trivial parameters and running statistics (means around 0, variances in [0.5, 2)).
  const std::vector<ParamStore::Entry>& buffers = f.store->buffer_entries();
  for (size_t i = 0; i < buffers.size(); ++i) {
    const bool var = buffers[i].name.find("running_var") != std::string::npos;
    const Tensor b = f.store->buffer(i);
    b.copy_from(random_tensor(b.shape(), 21 + i, var ? 0.5 : -0.5, var ? 2.0 : 0.5));
  }
  f.store->params().copy_from(random_tensor(f.store->params().shape(), 23, -0.8, 0.8));
  return f;
}

::testing::AssertionResult check(Fixture& f, const Tensor& x, bool training) {
  ExecContext ctx;
  ForwardOptions options;
  options.training = training;
  Tape tape;
  const Tensor y = f.model->forward(ctx, 0, f.model->size(), {x}, tape, options)[0];
  const Tensor dy = random_tensor(y.shape(), 99);
  f.store->zero_grads();
  const Tensor dx = f.model->backward(ctx, 0, f.model->size(), {dy}, tape)[0];
  if (!dx.defined()) return ::testing::AssertionFailure() << "no input gradient";
  const Tensor dparams = f.store->grads().clone();
  auto forward = [&](const TensorList& xs) {
    f.store->params().copy_from(xs[1]);
    Tape t;
    return f.model->forward(ctx, 0, f.model->size(), {xs[0]}, t, options)[0];
  };
  testing::GradCheckOptions tol;
  tol.atol = 1e-6;
  tol.rtol = 1e-4;
  return gradients_match(forward, {x, f.store->params().clone()}, dy, {dx, dparams}, tol);
}

struct Case {
  const char* what;
  Shape sample;
  proto::ResNetBlockSpec spec;
};

std::vector<Case> cases() {
  return {
      {"basic, identity shortcut", {4, 5, 5}, block_spec(4, 1, false)},
      {"basic, projection (stride 2 and width)", {3, 5, 5}, block_spec(4, 2, false)},
      {"basic, projection (width only)", {3, 4, 4}, block_spec(5, 1, false)},
      {"bottleneck, identity shortcut", {8, 4, 4}, block_spec(2, 1, true)},
      {"bottleneck, projection (stride 2)", {3, 5, 5}, block_spec(2, 2, true, 2)},
  };
}

TEST(ResNetBlockGradients, TrainingMode) {
  for (const Case& c : cases()) {
    Fixture f = make(c.sample, c.spec);
    Shape batch{3};
    batch.insert(batch.end(), c.sample.begin(), c.sample.end());
    EXPECT_TRUE(check(f, random_tensor(batch, 1), true)) << c.what;
  }
}

TEST(ResNetBlockGradients, EvaluationMode) {
  for (const Case& c : cases()) {
    Fixture f = make(c.sample, c.spec);
    Shape batch{2};
    batch.insert(batch.end(), c.sample.begin(), c.sample.end());
    EXPECT_TRUE(check(f, random_tensor(batch, 2), false)) << c.what;
  }
}

TEST(ResNetBlock, ParameterGradientsAccumulate) {
  for (bool training : {true, false}) {
    Fixture f = make({3, 4, 4}, block_spec(2, 2, true, 2));
    ExecContext ctx;
    ForwardOptions options;
    options.training = training;
    const Tensor x = random_tensor({2, 3, 4, 4}, 1);
    auto run = [&] {
      Tape tape;
      const Tensor y = f.model->forward(ctx, 0, f.model->size(), {x}, tape, options)[0];
      f.model->backward(ctx, 0, f.model->size(), {random_tensor(y.shape(), 2)}, tape);
    };
    f.store->zero_grads();
    run();
    const std::vector<double> once = f.store->grads().to_vector<double>();
    run();
    const std::vector<double> twice = f.store->grads().to_vector<double>();
    double norm = 0.0;
    for (size_t i = 0; i < once.size(); ++i) {
      // Training updates the running statistics, which the batch-statistics output ignores.
      EXPECT_NEAR(twice[i], 2 * once[i], 1e-12 * (1 + std::fabs(once[i])));
      norm += once[i] * once[i];
    }
    EXPECT_GT(norm, 0.0);
  }
}

TEST(ResNetBlock, FirstLayerSkipsTheInputGradientOnly) {
  Fixture first = make({3, 4, 4}, block_spec(4, 2, false), /*first=*/true);
  Fixture inner = make({3, 4, 4}, block_spec(4, 2, false));
  ExecContext ctx;
  const Tensor x = random_tensor({2, 3, 4, 4}, 1);
  Tensor grads[2];
  Fixture* fixtures[2] = {&first, &inner};
  for (int i = 0; i < 2; ++i) {
    Fixture& f = *fixtures[i];
    Tape tape;
    const Tensor y = f.model->forward(ctx, 0, f.model->size(), {x}, tape, {})[0];
    f.store->zero_grads();
    const Tensor dx =
        f.model->backward(ctx, 0, f.model->size(), {random_tensor(y.shape(), 2)}, tape)[0];
    EXPECT_EQ(dx.defined(), i == 1);
    grads[i] = f.store->grads().clone();
  }
  EXPECT_TRUE(testing::all_close(grads[0], grads[1], 0, 0));
}

TEST(ResNetBlock, RunningStatisticsMoveInTrainingOnly) {
  Fixture f = make({4, 3, 3}, block_spec(4, 1, false));
  ExecContext ctx;
  f.store->buffers().zero_();
  const std::vector<ParamStore::Entry>& entries = f.store->buffer_entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].name.find("running_var") != std::string::npos) f.store->buffer(i).fill_(1.0);
  }
  const std::vector<double> initial = f.store->buffers().to_vector<double>();
  const Tensor x = random_tensor({4, 4, 3, 3}, 5, 1.0, 3.0);  // mean 2, variance 1/3
  Tape tape;
  ForwardOptions eval;
  eval.training = false;
  f.model->forward(ctx, 0, f.model->size(), {x}, tape, eval);
  EXPECT_EQ(f.store->buffers().to_vector<double>(), initial);
  f.model->forward(ctx, 0, f.model->size(), {x}, tape, {});
  // bn1 sees conv1(x); check its running mean against the batch mean of conv1's output.
  ParamStore& s = *f.store;
  ASSERT_EQ(entries[0].full_name(), "layer1.0.bn1.running_mean");
  ops::Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  const Tensor z = ops::conv2d_forward(ctx, x, s.param(0), Tensor(), p);  // (B, 4, 3, 3)
  const std::vector<double> zv = z.to_vector<double>();
  const std::vector<double> rm = s.buffer(0).to_vector<double>();
  const std::vector<double> rv = s.buffer(1).to_vector<double>();
  for (int64_t c = 0; c < 4; ++c) {
    double sum = 0, sq = 0;
    int64_t n = 0;
    for (int64_t b = 0; b < 4; ++b) {
      for (int64_t k = 0; k < 9; ++k) {
        const double v = zv[static_cast<size_t>((b * 4 + c) * 9 + k)];
        sum += v, sq += v * v, ++n;
      }
    }
    const double mean = sum / n;
    const double unbiased = (sq - n * mean * mean) / (n - 1);
    EXPECT_NEAR(rm[c], 0.1 * mean, 1e-12);
    EXPECT_NEAR(rv[c], 0.9 + 0.1 * unbiased, 1e-12);
  }
}

TEST(ResNetBlock, TorchvisionNamesAndShapes) {
  Model m("m", Shape{64, 8, 8});
  m.add(make_resnet_block("layer2.0", {64, 8, 8}, block_spec(32, 2, true)));
  EXPECT_EQ(m.output_shape(), (Shape{128, 4, 4}));
  std::vector<std::string> names;
  for (const ParamSpec& p : m.layer(0).param_specs()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "conv1.weight", "bn1.weight", "bn1.bias", "conv2.weight", "bn2.weight",
                       "bn2.bias", "conv3.weight", "bn3.weight", "bn3.bias", "downsample.0.weight",
                       "downsample.1.weight", "downsample.1.bias"}));
  const std::vector<ParamSpec> specs = m.layer(0).param_specs();
  EXPECT_EQ(specs[0].shape, (Shape{32, 64, 1, 1}));
  EXPECT_EQ(specs[3].shape, (Shape{32, 32, 3, 3}));
  EXPECT_EQ(specs[6].shape, (Shape{128, 32, 1, 1}));
  EXPECT_EQ(specs[9].shape, (Shape{128, 64, 1, 1}));
  // kaiming normal, fan_out: std sqrt(2 / (32 * 3 * 3)) for conv2.
  EXPECT_EQ(specs[3].init.kind, ParamInit::Kind::kNormal);
  EXPECT_DOUBLE_EQ(specs[3].init.scale, std::sqrt(2.0 / (32 * 9)));
  std::vector<std::string> buffers;
  for (const ParamSpec& p : m.layer(0).buffer_specs()) buffers.push_back(p.name);
  EXPECT_EQ(buffers.size(), 8u);
  EXPECT_EQ(buffers[6], "downsample.1.running_mean");
  // A basic block keeping stride and width has no projection.
  Model basic("b", Shape{16, 4, 4});
  basic.add(make_resnet_block("layer1.0", {16, 4, 4}, block_spec(16, 1, false)));
  EXPECT_EQ(basic.layer(0).param_specs().size(), 6u);
  EXPECT_EQ(basic.output_shape(), (Shape{16, 4, 4}));
}

TEST(ResNetBlock, BadSpecsNameTheLayer) {
  try {
    make_resnet_block("layer3.1", {8, 4, 4}, proto::ResNetBlockSpec());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer3.1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("planes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_resnet_block("b", {8, 4}, block_spec(4, 1, false)), Error);
  EXPECT_THROW(make_resnet_block("b", {8, 4, 4}, block_spec(4, 0, false)), Error);
  Model m("m", Shape{4, 4, 4});
  EXPECT_THROW(m.add(make_resnet_block("b", {4, 5, 5}, block_spec(4, 1, false))), Error);
}

}  // namespace
}  // namespace strata::graph
