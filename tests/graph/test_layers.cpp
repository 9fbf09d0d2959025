// Every layer's backward against float64 finite differences, through the Model and its tapes:
// gradients of the input and of every parameter (flat), in training and evaluation modes.
#include <gtest/gtest.h>

#include "graph/layers.h"
#include "graph/model.h"
#include "graph/param_store.h"
#include "testing/testing.h"

namespace strata::graph {
namespace {

using testing::gradients_match;
using testing::random_tensor;

// An identity first layer, so that the layer under test is not the model's first and its input
// gradient is computed.
std::unique_ptr<Layer> identity() { return std::make_unique<DropoutLayer>("input", 0.0); }

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<ParamStore> store;
};

Fixture make(const Shape& sample, std::unique_ptr<Layer> layer) {
  Fixture f;
  f.model = std::make_unique<Model>("test", sample);
  f.model->add(identity());
  f.model->add(std::move(layer));
  f.store = std::make_unique<ParamStore>(*f.model, 0, f.model->size(), default_cpu_allocator(),
                                         DType::kF64);
  f.store->initialize(7);
  // Non-trivial normalization parameters and statistics.
  if (f.store->buffers().numel() > 0) {
    f.store->buffer(0).copy_from(random_tensor(f.store->buffer(0).shape(), 21, -0.5, 0.5));
    f.store->buffer(1).copy_from(random_tensor(f.store->buffer(1).shape(), 22, 0.5, 2.0));
  }
  Tensor p = f.store->params();
  if (p.numel() > 0) p.copy_from(random_tensor(p.shape(), 23, -0.8, 0.8));
  return f;
}

::testing::AssertionResult check(Fixture& f, const Tensor& x, bool training) {
  ExecContext ctx;
  ForwardOptions options;
  options.training = training;
  options.seed = 3;
  options.step = 5;
  Tape tape;
  const Tensor y = f.model->forward(ctx, 0, f.model->size(), {x}, tape, options)[0];
  const Tensor dy = random_tensor(y.shape(), 99);
  f.store->zero_grads();
  const Tensor dx = f.model->backward(ctx, 0, f.model->size(), {dy}, tape)[0];
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

TEST(LayerGradients, Conv2d) {
  ops::Conv2dParams p;
  p.stride_h = 2;
  p.pad_h = p.pad_w = 1;
  Fixture f =
      make({2, 5, 4}, std::make_unique<Conv2dLayer>("conv", Shape{2, 5, 4}, 3, 3, 2, p, true));
  EXPECT_TRUE(check(f, random_tensor({2, 2, 5, 4}, 1), true));
}

TEST(LayerGradients, Linear) {
  Fixture f = make({3, 4}, std::make_unique<LinearLayer>("fc", 4, 5, true));
  EXPECT_TRUE(check(f, random_tensor({2, 3, 4}, 1), true));
}

TEST(LayerGradients, ReluAndGelu) {
  Fixture r = make({7}, std::make_unique<ReluLayer>("relu"));
  EXPECT_TRUE(check(r, random_tensor({3, 7}, 1), true));
  Fixture g = make({7}, std::make_unique<GeluLayer>("gelu"));
  EXPECT_TRUE(check(g, random_tensor({3, 7}, 2), true));
}

TEST(LayerGradients, Pooling) {
  ops::Pool2dParams p;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  Fixture m = make({2, 5, 5}, std::make_unique<MaxPool2dLayer>("max", Shape{2, 5, 5}, p));
  EXPECT_TRUE(check(m, random_tensor({2, 2, 5, 5}, 1), true));
  Fixture a = make({2, 5, 5}, std::make_unique<AvgPool2dLayer>("avg", Shape{2, 5, 5}, p));
  EXPECT_TRUE(check(a, random_tensor({2, 2, 5, 5}, 2), true));
  Fixture ad =
      make({2, 5, 5}, std::make_unique<AdaptiveAvgPool2dLayer>("adaptive", Shape{2, 5, 5}, 2, 3));
  EXPECT_TRUE(check(ad, random_tensor({2, 2, 5, 5}, 3), true));
}

TEST(LayerGradients, BatchNormTrainingAndEvaluation) {
  Fixture t =
      make({3, 2, 2}, std::make_unique<BatchNormLayer>("bn", Shape{3, 2, 2}, 0.1, 1e-5, true));
  EXPECT_TRUE(check(t, random_tensor({4, 3, 2, 2}, 1), true));
  Fixture e =
      make({3, 2, 2}, std::make_unique<BatchNormLayer>("bn", Shape{3, 2, 2}, 0.1, 1e-5, true));
  EXPECT_TRUE(check(e, random_tensor({4, 3, 2, 2}, 2), false));
}

TEST(LayerGradients, LayerNorm) {
  Fixture f = make({2, 6}, std::make_unique<LayerNormLayer>("ln", 6, 1e-5, true));
  EXPECT_TRUE(check(f, random_tensor({3, 2, 6}, 1), true));
}

TEST(LayerGradients, DropoutWithAFixedMask) {
  Fixture f = make({10}, std::make_unique<DropoutLayer>("drop", 0.3));
  EXPECT_TRUE(check(f, random_tensor({4, 10}, 1), true));
}

TEST(LayerGradients, Flatten) {
  Fixture f = make({2, 3}, std::make_unique<FlattenLayer>("flat"));
  EXPECT_TRUE(check(f, random_tensor({2, 2, 3}, 1), true));
}

TEST(Layers, ParameterGradientsAccumulate) {
  Fixture f = make({2, 4, 4}, std::make_unique<Conv2dLayer>("conv", Shape{2, 4, 4}, 3, 3, 3,
                                                            ops::Conv2dParams{}, true));
  ExecContext ctx;
  const Tensor x = random_tensor({2, 2, 4, 4}, 1);
  auto run = [&] {
    Tape tape;
    const Tensor y = f.model->forward(ctx, 0, f.model->size(), {x}, tape, {})[0];
    f.model->backward(ctx, 0, f.model->size(), {random_tensor(y.shape(), 2)}, tape);
  };
  f.store->zero_grads();
  run();
  const std::vector<double> once = f.store->grads().to_vector<double>();
  run();
  const std::vector<double> twice = f.store->grads().to_vector<double>();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_DOUBLE_EQ(twice[i], 2 * once[i]);
}

TEST(Layers, BatchNormUpdatesRunningStatisticsOnlyInTraining) {
  Fixture f = make({2}, std::make_unique<BatchNormLayer>("bn", Shape{2}, 0.5, 1e-5, true));
  ExecContext ctx;
  f.store->buffer(0).zero_();
  f.store->buffer(1).fill_(1.0);
  const Tensor x = Tensor::from_vector<double>({1, 10, 3, 20}, {2, 2});
  Tape tape;
  ForwardOptions eval;
  eval.training = false;
  f.model->forward(ctx, 0, 2, {x}, tape, eval);
  EXPECT_EQ(f.store->buffer(0).to_vector<double>(), (std::vector<double>{0, 0}));
  f.model->forward(ctx, 0, 2, {x}, tape, {});
  // running = 0.5 running + 0.5 batch: means (2, 15), unbiased variances (2, 50).
  EXPECT_EQ(f.store->buffer(0).to_vector<double>(), (std::vector<double>{1.0, 7.5}));
  EXPECT_EQ(f.store->buffer(1).to_vector<double>(), (std::vector<double>{1.5, 25.5}));
}

TEST(Layers, ShapeErrorsNameTheLayer) {
  EXPECT_THROW(Conv2dLayer("c", Shape{3, 4}, 2, 3, 3, {}, true), Error);
  Model m("m", {1, 4, 4});
  try {
    m.add(std::make_unique<LinearLayer>("fc", 5, 2, true));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear layer fc"), std::string::npos) << e.what();
  }
  m.add(std::make_unique<FlattenLayer>("flat"));
  EXPECT_THROW(m.add(std::make_unique<FlattenLayer>("flat")), Error);  // duplicate name
}

}  // namespace
}  // namespace strata::graph
