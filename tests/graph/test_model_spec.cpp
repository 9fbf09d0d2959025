#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "graph/model_spec.h"

namespace strata::graph {
namespace {

const char* kLenet = R"(
name: "lenet"
input { shape: [1, 28, 28] }
layer { name: "conv1" type: "conv2d" conv2d { out_channels: 6 kernel_size: 5 padding: 2 } }
layer { name: "relu1" type: "relu" }
layer { name: "pool1" type: "max_pool2d" pool { kernel_size: 2 } }
layer { name: "conv2" type: "conv2d" conv2d { out_channels: 16 kernel_size: 5 } }
layer { name: "relu2" type: "relu" }
layer { name: "pool2" type: "avg_pool2d" pool { kernel_size: 2 } }
layer { name: "flatten" type: "flatten" }
layer { name: "fc1" type: "linear" linear { out_features: 120 } }
layer { type: "relu" }
layer { name: "fc2" type: "linear" linear { out_features: 10 } }
)";

TEST(ModelSpec, BuildsLeNetWithShapesAndNames) {
  auto model = build_model(parse_model_spec(kLenet, "lenet.prototxt"));
  EXPECT_EQ(model->name(), "lenet");
  EXPECT_EQ(model->size(), 10u);
  EXPECT_EQ(model->shape_before(3), (Shape{6, 14, 14}));
  EXPECT_EQ(model->shape_before(7), (Shape{400}));
  EXPECT_EQ(model->output_shape(), (Shape{10}));
  EXPECT_TRUE(model->find("relu8").has_value());  // an unnamed layer gets type + index
  // LeNet-5's parameter count with these sizes: 156 + 2416 + 48120 + 1210.
  EXPECT_NE(model->summary().find("total parameters: 51902"), std::string::npos)
      << model->summary();
}

TEST(ModelSpec, TextRoundTrip) {
  const proto::ModelSpec spec = parse_model_spec(kLenet, "lenet.prototxt");
  const proto::ModelSpec again = parse_model_spec(model_spec_to_text(spec), "again");
  EXPECT_EQ(again.SerializeAsString(), spec.SerializeAsString());
}

TEST(ModelSpec, SyntaxErrorsNameFileAndLine) {
  try {
    parse_model_spec("name: \"x\"\nlayer { name: \"a\" type: }\n", "broken.prototxt");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("broken.prototxt:2:"), std::string::npos) << e.what();
  }
}

TEST(ModelSpec, UnknownTypeListsTheValidOnes) {
  try {
    build_model(parse_model_spec("input { shape: [4] } layer { name: \"x\" type: \"lstm\" }", "s"));
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unknown layer type 'lstm'"), std::string::npos) << m;
    EXPECT_NE(m.find("conv2d, linear"), std::string::npos) << m;
  }
}

TEST(ModelSpec, ShapeMismatchNamesTheLayer) {
  try {
    build_model(parse_model_spec(
        "input { shape: [1, 4, 4] } layer { name: \"big\" type: \"conv2d\" conv2d { "
        "out_channels: 2 kernel_size: 7 } }",
        "s"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0 ('big'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(build_model(parse_model_spec("layer { type: \"relu\" }", "s")), Error);  // no input
  EXPECT_THROW(load_model_spec("/nonexistent/model.prototxt"), Error);
}

TEST(ModelSpec, LoadsFromAFile) {
  const std::string path = ::testing::TempDir() + "/lenet.prototxt";
  std::ofstream(path) << kLenet;
  EXPECT_EQ(build_model(load_model_spec(path))->size(), 10u);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace strata::graph
