#include "io/mnist.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "io/idx.h"

namespace strata::io {
namespace {

// Small synthetic MNIST-format files in a fresh directory.
class MnistFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "strata_mnist_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // n images of 4x3 with pixel (i, y, x) = 20*i + 3*y + x, and labels i % 10.
  void write_split(const std::string& prefix, int64_t n, bool gzip) const {
    std::vector<uint8_t> pixels;
    std::vector<uint8_t> labels;
    for (int64_t i = 0; i < n; ++i) {
      for (int y = 0; y < 4; ++y) {
        for (int x = 0; x < 3; ++x) pixels.push_back(static_cast<uint8_t>(20 * i + 3 * y + x));
      }
      labels.push_back(static_cast<uint8_t>(i % 10));
    }
    const std::string ext = gzip ? ".gz" : "";
    write_idx(path(prefix + "-images-idx3-ubyte" + ext),
              IdxArray::from_values<uint8_t>({n, 4, 3}, pixels), gzip);
    write_idx(path(prefix + "-labels-idx1-ubyte" + ext),
              IdxArray::from_values<uint8_t>({n}, labels), gzip);
  }

  std::string open_error(const std::string& dir) const {
    try {
      open_fashion_mnist(dir, Split::kTrain);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  std::string dir_;
};

TEST_F(MnistFilesTest, ReadsAndNormalizesSamples) {
  write_split("train", 12, /*gzip=*/true);
  write_split("t10k", 3, /*gzip=*/false);
  auto train = open_mnist(dir_, "train");
  EXPECT_EQ(train->name(), "mnist/train");
  EXPECT_EQ(train->size(), 12);
  EXPECT_EQ(train->num_classes(), 10);
  EXPECT_EQ(train->input_spec().shape, (Shape{1, 4, 3}));
  EXPECT_EQ(train->input_spec().dtype, DType::kF32);
  EXPECT_EQ(train->target_spec().shape, Shape{});
  EXPECT_EQ(train->target_spec().dtype, DType::kI64);

  std::vector<float> input(12);
  int64_t target = -1;
  train->get(11, input.data(), &target);
  EXPECT_EQ(target, 1);
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 3; ++x) {
      const float pixel = static_cast<float>(20 * 11 + 3 * y + x);
      EXPECT_NEAR(input[static_cast<size_t>(3 * y + x)], (pixel / 255.0f - kMnistMean) / kMnistStd,
                  1e-6)
          << y << "," << x;
    }
  }
  EXPECT_EQ(train->label(7), 7);
  EXPECT_EQ(train->pixels(1)[5], 25);
  EXPECT_THROW(train->get(12, input.data(), &target), Error);

  auto test = open_mnist(dir_, Split::kTest);
  EXPECT_EQ(test->name(), "mnist/test");
  EXPECT_EQ(test->size(), 3);

  auto fashion = open_fashion_mnist(dir_ + "/", Split::kTest);  // a trailing slash is fine
  EXPECT_EQ(fashion->name(), "fashion-mnist/test");
  EXPECT_FLOAT_EQ(fashion->mean(), kFashionMnistMean);
  EXPECT_FLOAT_EQ(fashion->stddev(), kFashionMnistStd);
}

TEST_F(MnistFilesTest, MissingDirectoryExplainsWhereToGetTheFiles) {
  const std::string missing = dir_ + "/not-here";
  const std::string msg = open_error(missing);
  EXPECT_NE(msg.find("'" + missing + "' does not exist"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train-images-idx3-ubyte(.gz)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train-labels-idx1-ubyte(.gz)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dataset-fashion-mnist"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--data-dir"), std::string::npos) << msg;
}

TEST_F(MnistFilesTest, MissingFileIsNamed) {
  write_split("train", 2, false);
  std::filesystem::remove(path("train-labels-idx1-ubyte"));
  std::string msg = open_error(dir_);
  EXPECT_NE(msg.find("'" + dir_ + "' has no train-labels-idx1-ubyte(.gz)"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("--data-dir"), std::string::npos) << msg;

  try {
    open_mnist(dir_, Split::kTest);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    msg = e.what();
    EXPECT_NE(msg.find("has no t10k-images-idx3-ubyte(.gz) and no t10k-labels-idx1-ubyte(.gz)"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("No Debian package ships mnist"), std::string::npos) << msg;
  }
}

TEST_F(MnistFilesTest, CountsMustAgree) {
  write_split("train", 5, false);
  write_idx(path("train-labels-idx1-ubyte"), IdxArray::from_values<uint8_t>({4}, {0, 1, 2, 3}));
  const std::string msg = open_error(dir_);
  EXPECT_NE(msg.find(path("train-images-idx3-ubyte") + " holds 5 images"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find(path("train-labels-idx1-ubyte") + " holds 4 labels"), std::string::npos)
      << msg;
}

TEST_F(MnistFilesTest, LabelOutOfRangeNamesFileAndIndex) {
  write_split("train", 5, true);
  write_idx(path("train-labels-idx1-ubyte.gz"),
            IdxArray::from_values<uint8_t>({5}, {0, 1, 2, 10, 4}), true);
  const std::string msg = open_error(dir_);
  EXPECT_NE(msg.find(path("train-labels-idx1-ubyte.gz")), std::string::npos) << msg;
  EXPECT_NE(msg.find("label 10 at index 3"), std::string::npos) << msg;
}

TEST_F(MnistFilesTest, ImagesMustBeU8WithThreeDims) {
  write_split("train", 2, false);
  write_idx(path("train-images-idx3-ubyte"),
            IdxArray::from_values<uint8_t>({2, 12}, std::vector<uint8_t>(24, 1)));
  std::string msg = open_error(dir_);
  EXPECT_NE(msg.find(path("train-images-idx3-ubyte")), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected u8 images with 3 dims (N, H, W), found u8 with dims (2, 12)"),
            std::string::npos)
      << msg;

  write_idx(path("train-images-idx3-ubyte"),
            IdxArray::from_values<float>({2, 2, 2}, std::vector<float>(8, 0.5f)));
  msg = open_error(dir_);
  EXPECT_NE(msg.find("found f32 with dims (2, 2, 2)"), std::string::npos) << msg;
}

TEST(Mnist, ParseSplit) {
  EXPECT_EQ(parse_split("train"), Split::kTrain);
  EXPECT_EQ(parse_split("test"), Split::kTest);
  EXPECT_STREQ(split_name(Split::kTest), "test");
  try {
    parse_split("validation");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected train or test"), std::string::npos);
  }
}

// ---- the real Fashion-MNIST (Debian package dataset-fashion-mnist) ----------------------------

bool have_fashion_mnist() {
  struct stat st;
  return ::stat(kFashionMnistDir, &st) == 0 && S_ISDIR(st.st_mode);
}

class FashionMnistReal : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (have_fashion_mnist()) {
      train_ = open_fashion_mnist(kFashionMnistDir, Split::kTrain);
      test_ = open_fashion_mnist(kFashionMnistDir, Split::kTest);
    }
  }
  static void TearDownTestSuite() {
    train_.reset();
    test_.reset();
  }
  void SetUp() override {
    if (!have_fashion_mnist()) {
      GTEST_SKIP() << kFashionMnistDir << " does not exist (install the Debian package "
                   << kFashionMnistPackage << ")";
    }
  }
  static std::shared_ptr<const IdxClassificationDataset> train_;
  static std::shared_ptr<const IdxClassificationDataset> test_;
};
std::shared_ptr<const IdxClassificationDataset> FashionMnistReal::train_;
std::shared_ptr<const IdxClassificationDataset> FashionMnistReal::test_;

TEST_F(FashionMnistReal, SizesAndShapes) {
  EXPECT_EQ(train_->size(), 60000);
  EXPECT_EQ(test_->size(), 10000);
  EXPECT_EQ(train_->input_spec().shape, (Shape{1, 28, 28}));
  EXPECT_EQ(train_->name(), "fashion-mnist/train");
}

TEST_F(FashionMnistReal, LabelsInRangeAndBalanced) {
  for (const auto& [data, per_class] :
       {std::make_pair(train_, 6000), std::make_pair(test_, 1000)}) {
    std::vector<int64_t> counts(10, 0);
    for (int64_t i = 0; i < data->size(); ++i) {
      const int64_t label = data->label(i);
      ASSERT_GE(label, 0);
      ASSERT_LT(label, 10);
      ++counts[static_cast<size_t>(label)];
    }
    for (int c = 0; c < 10; ++c) EXPECT_EQ(counts[c], per_class) << data->name() << " class " << c;
  }
  // The first labels of the published files: ankle boot, T-shirt, T-shirt, dress.
  EXPECT_EQ(train_->label(0), 9);
  EXPECT_EQ(train_->label(1), 0);
  EXPECT_EQ(train_->label(3), 3);
  EXPECT_EQ(test_->label(0), 9);
}

TEST_F(FashionMnistReal, NormalizesAKnownPixel) {
  std::vector<float> input(28 * 28);
  int64_t target = -1;
  train_->get(0, input.data(), &target);
  EXPECT_EQ(target, 9);
  // Train image 0: pixel (14, 14) is 217, pixel (0, 0) is 0, the brightest (row 14, col 25) 255.
  EXPECT_EQ(train_->pixels(0)[14 * 28 + 14], 217);
  EXPECT_NEAR(input[14 * 28 + 14], (217.0f / 255.0f - 0.2860f) / 0.3530f, 1e-6);
  EXPECT_NEAR(input[0], -0.2860f / 0.3530f, 1e-6);
  EXPECT_NEAR(input[14 * 28 + 25], (1.0f - 0.2860f) / 0.3530f, 1e-6);
}

TEST_F(FashionMnistReal, MeanAndStdMatchTheConstants) {
  // Over the first 5000 training images: close to the full-set statistics.
  double sum = 0.0, sum_sq = 0.0;
  const int64_t n = 5000;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = train_->pixels(i);
    for (int j = 0; j < 28 * 28; ++j) {
      const double v = p[j] / 255.0;
      sum += v;
      sum_sq += v * v;
    }
  }
  const double count = static_cast<double>(n) * 28 * 28;
  const double mean = sum / count;
  EXPECT_NEAR(mean, kFashionMnistMean, 0.01);
  EXPECT_NEAR(std::sqrt(sum_sq / count - mean * mean), kFashionMnistStd, 0.01);
}

}  // namespace
}  // namespace strata::io
