// CIFAR-10 binary batches written in the exact published format (with a few records per file):
// decoding and normalization, labels and class names, every error, the augmentation's crops and
// flips, and a DataLoader with workers.
#include "io/cifar.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "io/data_loader.h"
#include "testing/image_files.h"

namespace strata::io {
namespace {

using strata::testing::cifar_pixel;
using strata::testing::cifar_records;
using strata::testing::TempDir;
using strata::testing::write_bytes;
using strata::testing::write_cifar_dir;

constexpr int64_t kPlane = 32 * 32;

float normalized(uint8_t v, int c) {
  return (static_cast<float>(v) / 255.0f - kCifar10Mean[c]) / kCifar10Std[c];
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<float> sample(const Dataset& d, int64_t epoch, int64_t index, int64_t* label) {
  std::vector<float> input(3 * kPlane);
  d.get_in_epoch(epoch, index, input.data(), label);
  return input;
}

TEST(Cifar10, ReadsLabelsAndNormalizesPixelsInFileOrder) {
  TempDir dir("cifar");
  write_cifar_dir(dir.path(), 3, 2);
  auto train = open_cifar10(dir.path(), Split::kTrain);
  EXPECT_EQ(train->name(), "cifar10/train");
  EXPECT_EQ(train->size(), 15);
  EXPECT_EQ(train->num_classes(), 10);
  EXPECT_EQ(train->input_spec().shape, (Shape{3, 32, 32}));
  EXPECT_EQ(train->input_spec().dtype, DType::kF32);
  EXPECT_EQ(train->target_spec().shape, Shape{});
  EXPECT_EQ(train->target_spec().dtype, DType::kI64);
  EXPECT_EQ(train->class_names(), cifar10_default_class_names());
  for (int f = 1; f <= 5; ++f) {
    for (int64_t r = 0; r < 3; ++r) {
      const int64_t i = (f - 1) * 3 + r;
      int64_t label = -1;
      const std::vector<float> x = sample(*train, 0, i, &label);
      EXPECT_EQ(label, (3 * f + r) % 10) << "sample " << i;
      EXPECT_EQ(train->label(i), label);
      for (int c = 0; c < 3; ++c) {
        for (int y = 0; y < 32; ++y) {
          for (int xx = 0; xx < 32; ++xx) {
            ASSERT_FLOAT_EQ(x[c * kPlane + y * 32 + xx], normalized(cifar_pixel(f, r, c, y, xx), c))
                << "sample " << i << " (" << c << ", " << y << ", " << xx << ")";
          }
        }
      }
    }
  }
  // Known values: file 2, record 1, green pixel (3, 4): 31*2 + 7 + 50 + 15 + 4 = 138.
  int64_t label = -1;
  const std::vector<float> x = sample(*train, 0, 4, &label);
  EXPECT_NEAR(x[kPlane + 3 * 32 + 4], (138.0f / 255.0f - 0.4822f) / 0.2435f, 1e-6);
  EXPECT_EQ(train->pixels(4)[kPlane + 3 * 32 + 4], 138);

  auto test = open_cifar10(dir.path(), Split::kTest);
  EXPECT_EQ(test->name(), "cifar10/test");
  EXPECT_EQ(test->size(), 2);
  EXPECT_EQ(test->label(1), (3 * 6 + 1) % 10);
}

TEST(Cifar10, ClassNamesFromTheMetaFile) {
  TempDir dir("cifar");
  write_cifar_dir(dir.path(), 1, 1);
  std::string meta;
  for (int i = 0; i < 10; ++i) meta += "  class" + std::to_string(i) + "\r\n";
  meta += "\n\n";  // the published file ends with blank lines
  write_bytes(dir.path() + "/batches.meta.txt", std::vector<uint8_t>(meta.begin(), meta.end()));
  auto train = open_cifar10(dir.path(), Split::kTrain);
  ASSERT_EQ(train->class_names().size(), 10u);
  EXPECT_EQ(train->class_names()[0], "class0");
  EXPECT_EQ(train->class_names()[9], "class9");

  const std::string nine = "a\nb\nc\nd\ne\nf\ng\nh\ni\n";
  write_bytes(dir.path() + "/batches.meta.txt", std::vector<uint8_t>(nine.begin(), nine.end()));
  const std::string e = error_of([&] { open_cifar10(dir.path(), Split::kTrain); });
  EXPECT_NE(e.find(dir.path() + "/batches.meta.txt"), std::string::npos) << e;
  EXPECT_NE(e.find("expected 10 class names"), std::string::npos) << e;
  EXPECT_NE(e.find("found 9"), std::string::npos) << e;
}

TEST(Cifar10, FindsTheArchiveFolderInsideTheDirectory) {
  TempDir dir("cifar");
  std::filesystem::create_directories(dir.path() + "/cifar-10-batches-bin");
  write_cifar_dir(dir.path() + "/cifar-10-batches-bin", 2, 2);
  EXPECT_EQ(open_cifar10(dir.path(), Split::kTrain)->size(), 10);
}

TEST(Cifar10, MissingFilesNameTheDirectoryTheFilesAndTheFlag) {
  TempDir dir("cifar");
  std::string e = error_of([&] { open_cifar10(dir.path() + "/nope", Split::kTrain); });
  EXPECT_NE(e.find("directory '" + dir.path() + "/nope' does not exist"), std::string::npos) << e;
  EXPECT_NE(e.find("data_batch_1.bin .. data_batch_5.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("--data-dir"), std::string::npos) << e;
  EXPECT_NE(e.find("cifar-10-binary.tar.gz"), std::string::npos) << e;

  write_cifar_dir(dir.path(), 2, 2);
  std::filesystem::remove(dir.path() + "/data_batch_3.bin");
  std::filesystem::remove(dir.path() + "/data_batch_5.bin");
  e = error_of([&] { open_cifar10(dir.path(), Split::kTrain); });
  EXPECT_NE(e.find("'" + dir.path() + "' has no data_batch_3.bin, data_batch_5.bin"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--data-dir"), std::string::npos) << e;
  EXPECT_EQ(open_cifar10(dir.path(), Split::kTest)->size(), 2);  // the test split is whole

  std::filesystem::remove(dir.path() + "/test_batch.bin");
  write_bytes(dir.path() + "/data_batch_1", {0x80, 0x02});  // the pickle version's name
  e = error_of([&] { open_cifar10(dir.path(), Split::kTest); });
  EXPECT_NE(e.find("has no test_batch.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("Python (pickle) version"), std::string::npos) << e;
}

TEST(Cifar10, TruncatedOrOversizedFilesNameTheFileAndTheLengths) {
  TempDir dir("cifar");
  write_cifar_dir(dir.path(), 2, 2);
  const std::string path = dir.path() + "/data_batch_2.bin";
  std::vector<uint8_t> bytes = strata::testing::read_bytes(path);

  write_bytes(path, std::vector<uint8_t>(bytes.begin(), bytes.begin() + 5000));  // cut short
  std::string e = error_of([&] { open_cifar10(dir.path(), Split::kTrain); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("expected a whole number of 3073-byte records"), std::string::npos) << e;
  EXPECT_NE(e.find("30730000 bytes for the published 10000 records"), std::string::npos) << e;
  EXPECT_NE(e.find("found 5000 bytes: 1 records and 1927 bytes of a partial record at byte "
                   "offset 3073"),
            std::string::npos)
      << e;

  bytes.push_back(7);  // one byte too many
  write_bytes(path, bytes);
  e = error_of([&] { open_cifar10(dir.path(), Split::kTrain); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("found 6147 bytes: 2 records and 1 bytes"), std::string::npos) << e;

  write_bytes(path, {});
  e = error_of([&] { open_cifar10(dir.path(), Split::kTrain); });
  EXPECT_NE(e.find("found 0 bytes (an empty file)"), std::string::npos) << e;

  // Whole records, but fewer than in the other files: every file is listed with its length.
  bytes.resize(3073);
  write_bytes(path, bytes);
  e = error_of([&] { open_cifar10(dir.path(), Split::kTrain); });
  EXPECT_NE(e.find("the batch files differ in length"), std::string::npos) << e;
  EXPECT_NE(e.find(path + " 3073 bytes (1 records)"), std::string::npos) << e;
  EXPECT_NE(e.find(dir.path() + "/data_batch_1.bin 6146 bytes (2 records)"), std::string::npos)
      << e;
}

TEST(Cifar10, LabelAboveNineNamesTheFileAndTheRecord) {
  TempDir dir("cifar");
  write_cifar_dir(dir.path(), 4, 1);
  const std::string path = dir.path() + "/data_batch_4.bin";
  std::vector<uint8_t> bytes = strata::testing::read_bytes(path);
  bytes[2 * 3073] = 12;
  write_bytes(path, bytes);
  const std::string e = error_of([&] { open_cifar10(dir.path(), Split::kTrain); });
  EXPECT_NE(e.find(path + ": record 2 (byte offset 6146): label 12, expected a class in 0..9"),
            std::string::npos)
      << e;
}

TEST(Cifar10, AugmentationIsAFunctionOfSeedEpochAndIndex) {
  TempDir dir("cifar");
  write_cifar_dir(dir.path(), 4, 1);
  CifarOptions opt;
  opt.augment = true;
  opt.seed = 7;
  auto a = open_cifar10(dir.path(), Split::kTrain, opt);
  auto b = open_cifar10(dir.path(), Split::kTrain, opt);
  opt.seed = 8;
  auto other_seed = open_cifar10(dir.path(), Split::kTrain, opt);
  std::set<int> dys, dxs, flips;
  int differ_epoch = 0, differ_seed = 0;
  for (int64_t epoch = 0; epoch < 20; ++epoch) {
    for (int64_t i = 0; i < a->size(); ++i) {
      const CifarAugmentation x = a->augmentation(epoch, i);
      const CifarAugmentation y = b->augmentation(epoch, i);
      EXPECT_EQ(x.dy, y.dy);
      EXPECT_EQ(x.dx, y.dx);
      EXPECT_EQ(x.flip, y.flip);
      ASSERT_GE(x.dy, 0);
      ASSERT_LE(x.dy, 8);
      ASSERT_GE(x.dx, 0);
      ASSERT_LE(x.dx, 8);
      dys.insert(x.dy);
      dxs.insert(x.dx);
      flips.insert(x.flip);
      const CifarAugmentation next = a->augmentation(epoch + 1, i);
      const CifarAugmentation s = other_seed->augmentation(epoch, i);
      differ_epoch += next.dy != x.dy || next.dx != x.dx || next.flip != x.flip;
      differ_seed += s.dy != x.dy || s.dx != x.dx || s.flip != x.flip;
      int64_t la = -1, lb = -1;
      ASSERT_EQ(sample(*a, epoch, i, &la), sample(*b, epoch, i, &lb));
      EXPECT_EQ(la, lb);
    }
  }
  EXPECT_EQ(dys.size(), 9u);  // every offset 0..8 occurs in 400 draws
  EXPECT_EQ(dxs.size(), 9u);
  EXPECT_EQ(flips.size(), 2u);
  EXPECT_GT(differ_epoch, 300);  // 1 - 1/162 of 400 draws change with the epoch
  EXPECT_GT(differ_seed, 300);
  // Without augment, every epoch gives the plain normalized image.
  auto plain = open_cifar10(dir.path(), Split::kTrain);
  int64_t l0 = -1, l1 = -1;
  EXPECT_EQ(sample(*plain, 0, 3, &l0), sample(*plain, 5, 3, &l1));
}

TEST(Cifar10, CropsAndFlipsDoWhatTheySay) {
  TempDir dir("cifar");
  write_cifar_dir(dir.path(), 4, 1);
  CifarOptions opt;
  opt.augment = true;
  opt.seed = 3;
  auto aug = open_cifar10(dir.path(), Split::kTrain, opt);
  auto plain = open_cifar10(dir.path(), Split::kTrain);
  bool saw_identity_flip = false, saw_corner = false;
  for (int64_t epoch = 0; epoch < 40; ++epoch) {
    for (int64_t i = 0; i < aug->size(); ++i) {
      const CifarAugmentation a = aug->augmentation(epoch, i);
      int64_t label = -1, plain_label = -1;
      const std::vector<float> x = sample(*aug, epoch, i, &label);
      const std::vector<float> p = sample(*plain, 0, i, &plain_label);
      EXPECT_EQ(label, plain_label);
      // Output (c, y, x) is padded pixel (y + dy, dx + (flip ? 31 - x : x)), padding black.
      for (int c = 0; c < 3; ++c) {
        for (int y = 0; y < 32; ++y) {
          for (int xx = 0; xx < 32; ++xx) {
            const int sy = y + a.dy - 4;
            const int sx = (a.flip ? 31 - xx : xx) + a.dx - 4;
            const bool inside = sy >= 0 && sy < 32 && sx >= 0 && sx < 32;
            const float expected = inside ? p[c * kPlane + sy * 32 + sx] : normalized(0, c);
            ASSERT_EQ(x[c * kPlane + y * 32 + xx], expected)
                << "epoch " << epoch << " sample " << i << " dy " << a.dy << " dx " << a.dx
                << " flip " << a.flip << " at (" << c << ", " << y << ", " << xx << ")";
          }
        }
      }
      if (a.dy == 4 && a.dx == 4 && a.flip) {  // a pure mirror image
        saw_identity_flip = true;
        for (int y = 0; y < 32; ++y) {
          for (int xx = 0; xx < 32; ++xx) ASSERT_EQ(x[y * 32 + xx], p[y * 32 + 31 - xx]);
        }
      }
      if (a.dy == 0 && a.dx == 8 && !a.flip) {  // shifted down and left: black top rows
        saw_corner = true;
        for (int xx = 0; xx < 32; ++xx) EXPECT_EQ(x[3 * 32 + xx], normalized(0, 0));
        EXPECT_EQ(x[4 * 32 + 0], p[0 * 32 + 4]);
        EXPECT_EQ(x[4 * 32 + 31], normalized(0, 0));  // right columns black
      }
    }
  }
  EXPECT_TRUE(saw_identity_flip);
  EXPECT_TRUE(saw_corner);
}

std::vector<Batch> loader_epochs(std::shared_ptr<const Dataset> data, int workers) {
  DataLoaderOptions o;
  o.batch_size = 4;
  o.shuffle = true;
  o.seed = 11;
  o.num_workers = workers;
  DataLoader loader(std::move(data), o);
  std::vector<Batch> batches;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    loader.start_epoch(epoch);
    Batch b;
    while (loader.next(&b)) batches.push_back(b);
  }
  return batches;
}

TEST(Cifar10, DataLoaderWithWorkersGivesTheSameBatchesAsWithout) {
  TempDir dir("cifar");
  write_cifar_dir(dir.path(), 5, 1);
  CifarOptions opt;
  opt.augment = true;
  opt.seed = 5;
  auto data = open_cifar10(dir.path(), Split::kTrain, opt);
  const std::vector<Batch> serial = loader_epochs(data, 0);
  const std::vector<Batch> threaded = loader_epochs(data, 2);
  ASSERT_EQ(serial.size(), 14u);  // 25 samples in batches of 4, two epochs
  ASSERT_EQ(threaded.size(), serial.size());
  for (size_t i = 0; i < serial.size(); ++i) {
    EXPECT_EQ(serial[i].input.to_vector<float>(), threaded[i].input.to_vector<float>()) << i;
    EXPECT_EQ(serial[i].target.to_vector<int64_t>(), threaded[i].target.to_vector<int64_t>()) << i;
  }
  // The loader passes its epoch: without shuffling, epoch e's rows are get_in_epoch(e, i), and
  // the two epochs differ.
  std::vector<std::vector<float>> epochs;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    DataLoaderOptions o;
    o.batch_size = 25;
    DataLoader loader(data, o);
    loader.start_epoch(epoch);
    Batch b;
    ASSERT_TRUE(loader.next(&b));
    epochs.push_back(b.input.to_vector<float>());
    for (int64_t i = 0; i < 25; ++i) {
      int64_t label = -1;
      const std::vector<float> row(epochs.back().begin() + i * 3 * kPlane,
                                   epochs.back().begin() + (i + 1) * 3 * kPlane);
      ASSERT_EQ(row, sample(*data, epoch, i, &label)) << "epoch " << epoch << " sample " << i;
    }
  }
  EXPECT_NE(epochs[0], epochs[1]);
}

}  // namespace
}  // namespace strata::io
