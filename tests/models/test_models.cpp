#include <gtest/gtest.h>

#include "graph/model_spec.h"
#include "graph/param_store.h"
#include "models/registry.h"

namespace strata::models {
namespace {

int64_t count_params(const proto::ModelSpec& spec) {
  auto model = graph::build_model(spec);
  graph::ParamStore store(*model, 0, model->size(), default_cpu_allocator());
  return store.num_params();
}

TEST(Models, CnnParameterCounts) {
  // small: conv 1->32 (288), bn 64, conv 32->64 (18432), bn 128, fc 3136->128 (401536),
  // fc 128->10 (1290).
  EXPECT_EQ(count_params(model_spec("cnn", "small", {1, 28, 28}, 10)),
            288 + 64 + 18432 + 128 + 401536 + 1290);
  // tiny: conv 1->8 (72), bn 16, conv 8->16 (1152), bn 32, fc 784->32 (25120), fc 32->10 (330).
  EXPECT_EQ(count_params(model_spec("cnn", "tiny", {1, 28, 28}, 10)),
            72 + 16 + 1152 + 32 + 25120 + 330);
  // 32x32 RGB input works too (CIFAR-10 shape).
  EXPECT_EQ(graph::build_model(model_spec("cnn", "tiny", {3, 32, 32}, 10))->output_shape(),
            (Shape{10}));
}

TEST(Models, MlpParameterCount) {
  EXPECT_EQ(count_params(model_spec("mlp", "", {1, 28, 28}, 10)), 784 * 256 + 256 + 2570);
}

TEST(Models, UnknownNamesAndSizesListTheValidOnes) {
  try {
    model_spec("alexnet", "", {1, 28, 28}, 10);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid: cnn, mlp"), std::string::npos) << e.what();
  }
  try {
    model_spec("cnn", "huge", {1, 28, 28}, 10);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid: tiny, small"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::models
