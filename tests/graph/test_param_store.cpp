#include <gtest/gtest.h>

#include <cmath>

#include "engine/dtype.h"
#include "engine/exec_context.h"
#include "graph/layers.h"
#include "graph/model.h"
#include "graph/optimizer.h"
#include "graph/param_store.h"
#include "ops/matmul.h"
#include "ops/optimizer.h"

namespace strata::graph {
namespace {

std::unique_ptr<Model> small_model() {
  auto m = std::make_unique<Model>("m", Shape{3});
  m->add(std::make_unique<LinearLayer>("fc1", 3, 5, true));
  m->add(std::make_unique<BatchNormLayer>("bn", Shape{5}, 0.1, 1e-5, true));
  m->add(std::make_unique<ReluLayer>("relu"));
  m->add(std::make_unique<LinearLayer>("fc2", 5, 2, false));
  return m;
}

TEST(ParamStore, LaysOutAlignedViewsInLayerOrder) {
  auto m = small_model();
  ParamStore store(*m, 0, m->size(), default_cpu_allocator());
  const auto& e = store.param_entries();
  ASSERT_EQ(e.size(), 5u);  // fc1.weight, fc1.bias, bn.weight, bn.bias, fc2.weight
  EXPECT_EQ(e[0].full_name(), "fc1.weight");
  EXPECT_EQ(e[4].full_name(), "fc2.weight");
  for (const auto& entry : e) EXPECT_EQ(entry.offset % 16, 0);
  EXPECT_EQ(store.num_params(), 15 + 5 + 5 + 5 + 10);
  EXPECT_EQ(store.buffer_entries().size(), 2u);
  EXPECT_TRUE(store.param(0).shares_storage(store.params()));
  EXPECT_EQ(store.param(0).shape(), (Shape{5, 3}));
  EXPECT_FALSE(e[1].weight_decay);  // bias
  EXPECT_TRUE(e[0].weight_decay);
}

TEST(ParamStore, InitializationDependsOnNamesNotOnTheRange) {
  auto whole = small_model();
  auto part = small_model();
  ParamStore a(*whole, 0, whole->size(), default_cpu_allocator());
  ParamStore b(*part, 3, 4, default_cpu_allocator());  // fc2 alone, as a later stage would hold
  a.initialize(11);
  b.initialize(11);
  EXPECT_EQ(a.param(4).to_vector<float>(), b.param(0).to_vector<float>());
  auto other = small_model();
  ParamStore c(*other, 3, 4, default_cpu_allocator());
  c.initialize(12);
  EXPECT_NE(c.param(0).to_vector<float>(), b.param(0).to_vector<float>());
  // PyTorch-style bounds: |w| < 1/sqrt(fan_in); batch norm starts at weight 1, bias 0.
  for (float w : a.param(0).to_vector<float>()) EXPECT_LT(std::abs(w), 1.0f / std::sqrt(3.0f));
  EXPECT_EQ(a.param(2).to_vector<float>(), std::vector<float>(5, 1.0f));
  EXPECT_EQ(a.buffer(1).to_vector<float>(), std::vector<float>(5, 1.0f));
}

TEST(ParamStore, OptimizerStateAndGradients) {
  auto m = small_model();
  ParamStore store(*m, 0, m->size(), default_cpu_allocator());
  store.grads().fill_(3.0);
  store.zero_grads();
  EXPECT_EQ(store.grad(1).to_vector<float>(), std::vector<float>(5, 0.0f));
  store.ensure_state(2);
  EXPECT_EQ(store.state_slots(), 2u);
  EXPECT_EQ(store.state_view(1, 0).shape(), (Shape{5, 3}));
  EXPECT_THROW(store.state(2), Error);
}

TEST(ParamStore, MemoryLimitAppliesToTheFlatBuffers) {
  auto m = std::make_unique<Model>("big", Shape{1000});
  m->add(std::make_unique<LinearLayer>("fc", 1000, 1000, true));
  CpuAllocator alloc;
  alloc.set_limit(4 * 1000 * 1000);  // params fit, params + grads do not
  try {
    ParamStore store(*m, 0, 1, alloc);
    FAIL() << "expected out of memory";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory on cpu"), std::string::npos);
  }
}

// A store that goes takes its memory with it, even while the model lives on: the layers' views
// must not keep its buffers (and so its allocator) alive. `strata bench` once crashed at exit
// freeing a layer's weights into an allocator that was already gone.
TEST(ParamStore, LayersReleaseTheStoresMemoryWhenItGoes) {
  auto m = small_model();
  CpuAllocator alloc;
  {
    ParamStore store(*m, 0, m->size(), alloc);
    store.ensure_state(2);
    EXPECT_GT(alloc.stats().current, 0u);
    EXPECT_TRUE(m->layer(0).bound());
  }
  EXPECT_EQ(alloc.stats().current, 0u);
  for (size_t i = 0; i < m->size(); ++i) EXPECT_FALSE(m->layer(i).bound()) << m->layer(i).name();
  // A later store binds the layers again; the first one's going leaves the second's views alone.
  auto first = std::make_unique<ParamStore>(*m, 0, m->size(), alloc);
  ParamStore second(*m, 0, m->size(), alloc);
  first.reset();
  EXPECT_TRUE(m->layer(0).bound());
  EXPECT_EQ(alloc.stats().current,
            second.params().nbytes() + second.grads().nbytes() + second.buffers().nbytes());
}

}  // namespace
}  // namespace strata::graph

namespace strata::graph {
namespace {

// A linear layer whose weight is another layer's (a test stand-in for GPT-2's tied head).
class TiedLinear final : public Layer {
 public:
  TiedLinear(std::string name, int64_t features, std::string owner)
      : Layer(std::move(name)), features_(features), owner_(std::move(owner)) {}
  const char* type() const override { return "tied_linear"; }
  std::vector<ParamSpec> param_specs() const override {
    return {{"weight", {features_, features_}, ParamInit::uniform(0.5), true, owner_}};
  }
  Shape output_shape(const Shape& in) const override { return in; }
  TensorList forward(ExecContext& ctx, const TensorList& in, LayerTape& tape) override {
    tape.save(in[0]);
    return {ops::linear_forward(ctx, in[0], param(0), Tensor())};
  }
  TensorList backward(ExecContext& ctx, const TensorList& g, LayerTape& tape) override {
    return {ops::linear_backward(ctx, g[0], tape.at(0), param(0), grad(0), Tensor(), true)};
  }

 private:
  int64_t features_;
  std::string owner_;
};

double global_norm_of(const Tensor& t) {
  ExecContext ctx;
  return ops::global_grad_norm(ctx, {t});
}

std::unique_ptr<Model> tied_model() {
  auto m = std::make_unique<Model>("tied", Shape{4});
  m->add(std::make_unique<LinearLayer>("fc1", 4, 4, false));
  m->add(std::make_unique<ReluLayer>("relu"));
  m->add(std::make_unique<TiedLinear>("head", 4, "fc1.weight"));
  return m;
}

TEST(ParamStore, TiedParameterInOneStoreIsOneWeight) {
  auto m = tied_model();
  ParamStore store(*m, 0, m->size(), default_cpu_allocator());
  store.initialize(3);
  ASSERT_EQ(store.param_entries().size(), 2u);
  EXPECT_TRUE(store.param_entries()[1].alias);
  EXPECT_EQ(store.num_params(), 16);
  EXPECT_EQ(store.param(0).raw_data(), store.param(1).raw_data());
  EXPECT_EQ(store.grad(0).raw_data(), store.grad(1).raw_data());
  EXPECT_NE(m->summary().find("total parameters: 16"), std::string::npos) << m->summary();
  // Both uses add into the one gradient: it equals the sum of the two layers' contributions.
  ExecContext ctx;
  Tensor x = Tensor::from_vector<float>({0.5f, -1.0f, 2.0f, 0.25f}, {1, 4});
  Tape tape;
  const Tensor y = m->forward(ctx, 0, 3, {x}, tape, {})[0];
  m->backward(ctx, 0, 3, {Tensor::full(y.shape(), 1.0)}, tape);
  EXPECT_GT(global_norm_of(store.grad(0)), 0.0);
  OptimizerConfig config;
  config.kind = OptimizerKind::kSgd;
  config.momentum = 0.0;
  config.schedule.base_lr = 0.1;
  const std::vector<float> before = store.param(0).to_vector<float>();
  const std::vector<float> g = store.grad(0).to_vector<float>();
  Optimizer(store, config).step(ctx, 0);
  const std::vector<float> after = store.param(0).to_vector<float>();
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_FLOAT_EQ(after[i], before[i] - 0.1f * g[i]);  // one update, not two
  }
}

TEST(ParamStore, TiedParameterAcrossStoresIsAnEqualCopy) {
  auto a = tied_model();
  auto b = tied_model();
  ParamStore first(*a, 0, 2, default_cpu_allocator());  // fc1, relu
  ParamStore last(*b, 2, 3, default_cpu_allocator());   // head alone
  first.initialize(9);
  last.initialize(9);
  EXPECT_FALSE(last.param_entries()[0].alias);
  EXPECT_EQ(last.tied_copies(), std::vector<size_t>{0});
  EXPECT_TRUE(first.tied_copies().empty());
  EXPECT_EQ(first.param(0).to_vector<float>(), last.param(0).to_vector<float>());
}

// Mixed precision: the layers see 16-bit working copies, the masters stay f32.
TEST(ParamStore, MixedPrecisionBindsLayersToWorkingCopies) {
  auto m = small_model();
  ParamStore store(*m, 0, m->size(), default_cpu_allocator(), DType::kF32, DType::kBF16);
  store.initialize(5);
  ASSERT_TRUE(store.mixed());
  EXPECT_EQ(store.params().dtype(), DType::kF32);
  EXPECT_EQ(store.grads().dtype(), DType::kF32);
  EXPECT_EQ(store.buffers().dtype(), DType::kF32);
  EXPECT_EQ(store.working_params().dtype(), DType::kBF16);
  // Running statistics stay f32: the layers are bound to the master buffers themselves.
  EXPECT_TRUE(store.working_buffers().shares_storage(store.buffers()));
  const std::vector<float> stats_before = store.buffers().to_vector<float>();
  ExecContext ctx;
  store.load_working(ctx);
  const std::vector<float> master = store.params().to_vector<float>();
  const std::vector<float> work = store.working_params().to_vector<float>();
  for (size_t i = 0; i < master.size(); ++i) {
    ASSERT_EQ(work[i], bf16_to_float(float_to_bf16(master[i]))) << i;
  }
  // A training forward and backward: the layers write 16-bit gradients only (and f32 statistics).
  const Tensor x = Tensor::from_vector<float>({0.5f, -1.0f, 2.0f, 1.5f, 0.25f, -0.5f}, {2, 3});
  Tape tape;
  ForwardOptions options;
  options.training = true;
  const Tensor y = m->forward(ctx, 0, m->size(), {x.to(DType::kBF16)}, tape, options)[0];
  EXPECT_EQ(y.dtype(), DType::kBF16);
  m->backward(ctx, 0, m->size(), {Tensor::full(y.shape(), 1.0, DType::kBF16)}, tape);
  EXPECT_EQ(global_norm_of(store.grads()), 0.0);
  const std::vector<float> work_grads = store.working_grads().to_vector<float>();
  EXPECT_GT(global_norm_of(store.working_grads().to(DType::kF32)), 0.0);
  // Layer by layer into the masters (fc2 first, as a backward pass finishes them), then clear.
  store.flush_layer_grads(ctx, 3);
  const std::vector<float> after_fc2 = store.grads().to_vector<float>();
  const ParamStore::Entry& fc2 = store.param_entries()[4];
  for (int64_t i = 0; i < static_cast<int64_t>(after_fc2.size()); ++i) {
    const bool in_fc2 = i >= fc2.offset && i < fc2.offset + fc2.numel;
    ASSERT_EQ(after_fc2[i], in_fc2 ? work_grads[i] : 0.0f) << i;
  }
  store.flush_grads(ctx);
  EXPECT_EQ(store.grads().to_vector<float>(), work_grads);
  EXPECT_EQ(global_norm_of(store.working_grads().to(DType::kF32)), 0.0);
  // Running statistics: the forward updated the f32 masters in place, in f32 (not all of them
  // on the bf16 grid).
  const std::vector<float> stats = store.buffers().to_vector<float>();
  EXPECT_NE(stats, stats_before);
  bool off_grid = false;
  for (float v : stats) off_grid = off_grid || v != bf16_to_float(float_to_bf16(v));
  EXPECT_TRUE(off_grid) << "the running statistics were rounded to bf16";
  // Without mixed precision every call is a no-op on the masters the layers use directly.
  auto plain_model = small_model();  // outlives its store
  ParamStore plain(*plain_model, 0, 4, default_cpu_allocator());
  EXPECT_FALSE(plain.mixed());
  EXPECT_TRUE(plain.working_params().shares_storage(plain.params()));
  EXPECT_THROW(ParamStore(*small_model(), 0, 4, default_cpu_allocator(), DType::kF32, DType::kI32),
               Error);
}

TEST(ParamStore, MixedPrecisionTiedAliasMovesWithItsOwner) {
  auto m = tied_model();
  ParamStore store(*m, 0, m->size(), default_cpu_allocator(), DType::kF32, DType::kF16);
  store.initialize(3);
  ExecContext ctx;
  store.load_working(ctx);
  Tape tape;
  const Tensor x = Tensor::from_vector<float>({0.5f, -1.0f, 2.0f, 0.25f}, {1, 4});
  const Tensor y = m->forward(ctx, 0, 3, {x.to(DType::kF16)}, tape, {})[0];
  m->backward(ctx, 0, 3, {Tensor::full(y.shape(), 1.0, DType::kF16)}, tape);
  const std::vector<float> both = store.working_grads().to_vector<float>();
  store.flush_layer_grads(ctx, 2);  // the head: an alias, nothing of its own to move
  EXPECT_EQ(global_norm_of(store.grads()), 0.0);
  store.flush_layer_grads(ctx, 0);  // the owner moves the sum of both uses
  EXPECT_EQ(store.grads().to_vector<float>(), both);
}

TEST(Optimizer, SkipsAStepWithANonFiniteGradientAndNamesTheFirstParameter) {
  auto m = small_model();
  ParamStore store(*m, 0, m->size(), default_cpu_allocator());
  store.initialize(1);
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdamW;
  Optimizer opt(store, config);
  ExecContext ctx;
  store.grads().fill_(0.5);
  opt.step(ctx, 0);  // a finite step: state becomes non-zero
  const std::vector<float> params = store.params().to_vector<float>();
  const std::vector<float> m1 = store.state(0).to_vector<float>();
  store.grad(2).data<float>()[1] = std::nanf("");  // bn.weight
  store.grad(4).data<float>()[0] = INFINITY;       // fc2.weight
  const OptimizerStepInfo info = opt.step(ctx, 1);
  EXPECT_TRUE(info.skipped);
  EXPECT_EQ(info.first_non_finite, "bn.weight");
  EXPECT_EQ(store.params().to_vector<float>(), params);
  EXPECT_EQ(store.state(0).to_vector<float>(), m1);
  // Without skipping, the update (which sums the squares as it reads the gradients) spreads the
  // NaN and reports it.
  config.skip_non_finite = false;
  Optimizer unguarded(store, config);
  const OptimizerStepInfo late = unguarded.step(ctx, 1);
  EXPECT_FALSE(late.skipped);
  EXPECT_TRUE(late.non_finite);
  EXPECT_EQ(late.first_non_finite, "bn.weight");
  EXPECT_TRUE(std::isnan(store.param(2).to_vector<float>()[1]));
}

}  // namespace
}  // namespace strata::graph
