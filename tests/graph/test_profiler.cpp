#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "graph/layers.h"
#include "graph/param_store.h"
#include "graph/profiler.h"
#include "graph/train_step.h"
#include "testing/testing.h"

namespace strata::graph {
namespace {

TEST(Profiler, RecordsTimeAndBytesPerLayer) {
  Model m("m", {1, 8, 8});
  m.add(std::make_unique<Conv2dLayer>("conv", Shape{1, 8, 8}, 4, 3, 3, ops::Conv2dParams{}, true));
  m.add(std::make_unique<ReluLayer>("relu"));
  m.add(std::make_unique<FlattenLayer>("flat"));
  m.add(std::make_unique<LinearLayer>("fc", 144, 3, true));
  ParamStore store(m, 0, m.size(), default_cpu_allocator());
  store.initialize(1);
  LayerProfiler profiler(m);
  ExecContext ctx;
  const Tensor x = testing::random_tensor({5, 1, 8, 8}, 1, -1, 1, DType::kF32);
  const Tensor y = Tensor::from_vector<int64_t>({0, 1, 2, 0, 1}, {5});
  for (int i = 0; i < 3; ++i) train_forward_backward(ctx, m, x, y, {}, {}, &profiler);
  const auto& layers = profiler.layers();
  ASSERT_EQ(layers.size(), 4u);
  EXPECT_EQ(layers[0].forward_calls, 3);
  EXPECT_EQ(layers[0].backward_calls, 3);
  EXPECT_EQ(layers[0].samples, 15);
  EXPECT_EQ(layers[0].output_bytes, 5u * 4 * 6 * 6 * 4);  // (5, 4, 6, 6) f32
  EXPECT_EQ(layers[0].saved_bytes, 5u * 64 * 4);          // the input
  EXPECT_EQ(layers[0].param_bytes, (4u * 9 + 4) * 4);
  EXPECT_GT(layers[0].forward_seconds, 0.0);
  const auto json = nlohmann::json::parse(profiler.to_json());
  EXPECT_EQ(json["layers"].size(), 4u);
  EXPECT_EQ(json["layers"][3]["name"], "fc");
  EXPECT_NE(profiler.table().find("total"), std::string::npos);
  profiler.reset();
  EXPECT_EQ(profiler.layers()[0].forward_calls, 0);
}

}  // namespace
}  // namespace strata::graph
