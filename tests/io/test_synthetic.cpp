// Synthetic images: shapes, determinism, the split of patterns and samples, the noise's
// statistics, that the classes can be told apart (by the nearest pattern, and by a trained model),
// and a DataLoader with workers.
#include "io/synthetic.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/exec_context.h"
#include "graph/model_spec.h"
#include "graph/param_store.h"
#include "io/data_loader.h"
#include "models/registry.h"
#include "parallel/trainer.h"

namespace strata::io {
namespace {

SyntheticImageOptions small(int64_t c, int64_t h, int64_t w, int64_t classes, uint64_t seed = 1) {
  SyntheticImageOptions o;
  o.samples = 300;
  o.channels = c;
  o.height = h;
  o.width = w;
  o.num_classes = classes;
  o.seed = seed;
  return o;
}

std::vector<float> sample(const Dataset& d, int64_t index, int64_t* label) {
  std::vector<float> x(static_cast<size_t>(shape_numel(d.input_spec().shape)));
  d.get(index, x.data(), label);
  return x;
}

TEST(SyntheticImages, AnyShapeAndClassCount) {
  const SyntheticImageDataset d(Split::kTrain, small(2, 5, 7, 13));
  EXPECT_EQ(d.name(), "synthetic-images/train");
  EXPECT_EQ(d.size(), 300);
  EXPECT_EQ(d.input_spec().shape, (Shape{2, 5, 7}));
  EXPECT_EQ(d.input_spec().dtype, DType::kF32);
  EXPECT_EQ(d.target_spec().shape, Shape{});
  EXPECT_EQ(d.target_spec().dtype, DType::kI64);
  EXPECT_EQ(d.num_classes(), 13);
  std::vector<int> counts(13, 0);
  for (int64_t i = 0; i < d.size(); ++i) {
    int64_t label = -1;
    const std::vector<float> x = sample(d, i, &label);
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 13);
    EXPECT_EQ(d.label(i), label);
    ++counts[static_cast<size_t>(label)];
    for (float v : x) ASSERT_TRUE(std::isfinite(v));
  }
  for (int k = 0; k < 13; ++k) EXPECT_GT(counts[static_cast<size_t>(k)], 8) << "class " << k;
  const SyntheticImageDataset one(Split::kTest, small(1, 1, 1, 1));
  int64_t label = -1;
  EXPECT_EQ(sample(one, 0, &label).size(), 1u);
  EXPECT_EQ(label, 0);
}

TEST(SyntheticImages, DeterministicFromSeedAndSplit) {
  const SyntheticImageDataset a(Split::kTrain, small(3, 6, 6, 5, 7));
  const SyntheticImageDataset b(Split::kTrain, small(3, 6, 6, 5, 7));
  const SyntheticImageDataset other_seed(Split::kTrain, small(3, 6, 6, 5, 8));
  const SyntheticImageDataset test(Split::kTest, small(3, 6, 6, 5, 7));
  int64_t la = -1, lb = -1, lc = -1, ld = -1;
  for (int64_t i = 0; i < 20; ++i) {
    const std::vector<float> x = sample(a, i, &la);
    EXPECT_EQ(x, sample(b, i, &lb));
    EXPECT_EQ(la, lb);
    EXPECT_NE(x, sample(other_seed, i, &lc));
    EXPECT_NE(x, sample(test, i, &ld));  // other samples...
  }
  std::vector<float> pa(3 * 36), pt(3 * 36), po(3 * 36);
  for (int64_t k = 0; k < 5; ++k) {
    a.pattern(k, pa.data());
    test.pattern(k, pt.data());
    other_seed.pattern(k, po.data());
    EXPECT_EQ(pa, pt);  // ...of the same task
    EXPECT_NE(pa, po);
  }
}

TEST(SyntheticImages, PatternsArePlaidsAndNoiseHasTheRequestedSpread) {
  SyntheticImageOptions o = small(3, 16, 12, 4);
  o.noise = 0.8f;
  const SyntheticImageDataset d(Split::kTrain, o);
  std::vector<float> p(3 * 16 * 12);
  d.pattern(2, p.data());
  // Rank one per channel: p[y][x] p[y'][x'] == p[y][x'] p[y'][x], and values in [-1, 1].
  for (int c = 0; c < 3; ++c) {
    const float* q = p.data() + c * 192;
    for (int y = 0; y < 16; y += 5) {
      for (int x = 0; x < 12; x += 5) {
        EXPECT_NEAR(q[y * 12 + x] * q[3 * 12 + 7], q[y * 12 + 7] * q[3 * 12 + x], 1e-6);
        EXPECT_LE(std::fabs(q[y * 12 + x]), 1.0f);
      }
    }
  }
  double sum = 0.0, sum_sq = 0.0;
  int64_t n = 0;
  std::vector<float> pattern(p.size());
  for (int64_t i = 0; i < d.size(); ++i) {
    int64_t label = -1;
    const std::vector<float> x = sample(d, i, &label);
    d.pattern(label, pattern.data());
    for (size_t j = 0; j < x.size(); ++j) {
      const double e = x[j] - pattern[j];
      ASSERT_LE(std::fabs(e), 0.8 * std::sqrt(3.0) + 1e-5);  // uniform on [-a, a], a = sqrt(3) sd
      sum += e;
      sum_sq += e * e;
      ++n;
    }
  }
  const double mean = sum / static_cast<double>(n);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(n) - mean * mean), 0.8, 0.01);
}

TEST(SyntheticImages, TheNearestPatternTellsTheClassesApart) {
  const SyntheticImageDataset d(Split::kTest, small(3, 16, 16, 10));
  std::vector<std::vector<float>> patterns(10, std::vector<float>(3 * 256));
  for (int64_t k = 0; k < 10; ++k) d.pattern(k, patterns[static_cast<size_t>(k)].data());
  int correct = 0;
  for (int64_t i = 0; i < d.size(); ++i) {
    int64_t label = -1;
    const std::vector<float> x = sample(d, i, &label);
    int64_t best = -1;
    double best_distance = 1e30;
    for (int64_t k = 0; k < 10; ++k) {
      double distance = 0.0;
      for (size_t j = 0; j < x.size(); ++j) {
        const double e = x[j] - patterns[static_cast<size_t>(k)][j];
        distance += e * e;
      }
      if (distance < best_distance) best_distance = distance, best = k;
    }
    correct += best == label;
  }
  EXPECT_GE(correct, 297) << "of 300";
}

TEST(SyntheticImages, ATinyModelLearnsThem) {
  ExecContext ctx;
  SyntheticImageOptions o = small(3, 8, 8, 4, 2);
  o.samples = 2048;
  auto train = open_synthetic_images(Split::kTrain, o);
  o.samples = 256;
  auto test = open_synthetic_images(Split::kTest, o);
  parallel::TrainConfig config;
  config.steps = 60;
  config.batch_size = 32;
  config.seed = 2;
  config.num_workers = 0;
  config.optimizer.schedule.base_lr = 3e-3;
  config.optimizer.schedule.kind = ops::LrScheduleKind::kConstant;
  parallel::Trainer trainer(ctx, models::model_spec("mlp", "tiny", {3, 8, 8}, 4), train, test,
                            config, parallel::PipelineConfig{}, nullptr, nullptr);
  const parallel::TrainSummary summary = trainer.run();
  ASSERT_TRUE(summary.last_eval.has_value());
  EXPECT_GT(summary.last_eval->accuracy, 0.9) << "chance is 0.25";
}

TEST(SyntheticImages, DataLoaderWithWorkersGivesTheSameBatchesAsWithout) {
  auto data = open_synthetic_images(Split::kTrain, small(3, 10, 10, 6));
  std::vector<std::vector<float>> inputs[2];
  std::vector<std::vector<int64_t>> targets[2];
  for (int w = 0; w < 2; ++w) {
    DataLoaderOptions o;
    o.batch_size = 32;
    o.shuffle = true;
    o.seed = 9;
    o.num_workers = 2 * w;
    DataLoader loader(data, o);
    loader.start_epoch(1);
    Batch b;
    while (loader.next(&b)) {
      inputs[w].push_back(b.input.to_vector<float>());
      targets[w].push_back(b.target.to_vector<int64_t>());
    }
  }
  ASSERT_EQ(inputs[0].size(), 10u);
  EXPECT_EQ(inputs[0], inputs[1]);
  EXPECT_EQ(targets[0], targets[1]);
}

TEST(SyntheticImages, InvalidOptionsNameTheOption) {
  SyntheticImageOptions o = small(0, 4, 4, 3);
  try {
    SyntheticImageDataset d(Split::kTrain, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shape (0, 4, 4)"), std::string::npos) << e.what();
  }
  o = small(1, 4, 4, 0);
  EXPECT_THROW(SyntheticImageDataset(Split::kTrain, o), Error);
  o = small(1, 4, 4, 3);
  o.noise = -1.0f;
  EXPECT_THROW(SyntheticImageDataset(Split::kTrain, o), Error);
}

}  // namespace
}  // namespace strata::io
