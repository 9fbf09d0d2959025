#include <gtest/gtest.h>

#include <cmath>

#include "graph/layers.h"
#include "graph/model.h"
#include "graph/param_store.h"

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
  ParamStore c(*small_model(), 3, 4, default_cpu_allocator());
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

}  // namespace
}  // namespace strata::graph
