// Model FLOPs of a training step (models/flops.h) against published figures: torchvision's GFLOPS
// column (MACs of one 224 px image: ResNet-50 4.09, VGG-16 15.47) and GPT-2 124M's parameter
// count (Hugging Face's GPT2LMHeadModel, tied embedding once).
#include <gtest/gtest.h>

#include <memory>

#include "graph/model_spec.h"
#include "models/flops.h"
#include "models/registry.h"

namespace strata {
namespace {

std::unique_ptr<graph::Model> imagenet_model(const std::string& name, const std::string& size) {
  return graph::build_model(models::model_spec(name, size, {3, 224, 224}, 1000));
}

TEST(Flops, ResNet50ForwardIs409GMacAt224) {
  const auto m = imagenet_model("resnet", "50");
  EXPECT_NEAR(models::forward_flops_per_sample(*m) / 2e9, 4.09, 0.02 * 4.09);
}

TEST(Flops, Vgg16ForwardIs1547GMacAt224) {
  const auto m = imagenet_model("vgg", "16");
  EXPECT_NEAR(models::forward_flops_per_sample(*m) / 2e9, 15.47, 0.02 * 15.47);
}

TEST(Flops, CnnTrainingStepIsThreeForwards) {
  const auto m = imagenet_model("resnet", "50");
  const models::TrainingFlops f = models::training_flops(*m);
  EXPECT_FALSE(f.transformer);
  EXPECT_DOUBLE_EQ(f.per_sample, 3.0 * models::forward_flops_per_sample(*m));
  EXPECT_EQ(f.params.total, 25557032);  // torchvision resnet50
  EXPECT_EQ(f.params.embedding, 0);
}

TEST(Flops, Gpt2124MParametersAndPerTokenFlops) {
  const auto m = graph::build_model(models::model_spec("gpt2", "124M", {1024}, 50257));
  const models::TrainingFlops f = models::training_flops(*m);
  EXPECT_TRUE(f.transformer);
  EXPECT_EQ(f.params.total, 124439808);                     // GPT2LMHeadModel
  EXPECT_EQ(f.params.embedding, 50257 * 768 + 1024 * 768);  // wte + wpe
  EXPECT_EQ(f.layers, 12);
  EXPECT_EQ(f.width, 768);
  EXPECT_EQ(f.seq_len, 1024);
  // 6 N + 12 L C T = 746,638,848 + 113,246,208 FLOPs per token.
  EXPECT_DOUBLE_EQ(f.per_token, 6.0 * 124439808 + 12.0 * 12 * 768 * 1024);
  EXPECT_DOUBLE_EQ(f.per_token, 859885056.0);
  EXPECT_DOUBLE_EQ(f.per_sample, f.per_token * 1024);
}

TEST(Flops, AttentionTermFollowsTheSequenceLength) {
  const auto m = graph::build_model(models::model_spec("gpt2", "tiny", {16}, 256));
  const models::TrainingFlops f = models::training_flops(*m);
  EXPECT_EQ(f.seq_len, 16);
  EXPECT_EQ(f.layers, 2);
  EXPECT_EQ(f.width, 64);
  EXPECT_DOUBLE_EQ(f.per_token, 6.0 * f.params.total + 12.0 * 2 * 64 * 16);
}

TEST(Flops, BertCountsItsTiedDecoderOnce) {
  const auto m = graph::build_model(models::model_spec("bert", "base", {3, 128}, 30522));
  const models::TrainingFlops f = models::training_flops(*m);
  EXPECT_TRUE(f.transformer);
  EXPECT_EQ(f.params.total, 109514298);  // BertForMaskedLM without the pooler
  EXPECT_EQ(f.layers, 12);
  EXPECT_EQ(f.seq_len, 128);
}

}  // namespace
}  // namespace strata
