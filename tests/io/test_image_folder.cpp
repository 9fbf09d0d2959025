// Image folders in the ImageNet layout, made of PNG and JPEG files written here: class and file
// order, the evaluation and training transforms, every error, skip mode and its count, and a
// DataLoader with workers.
#include "io/image_folder.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "io/data_loader.h"
#include "testing/image_files.h"

namespace strata::io {
namespace {

using strata::testing::encode_jpeg;
using strata::testing::encode_png;
using strata::testing::TempDir;
using strata::testing::test_rgb_image;
using strata::testing::write_bytes;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void write_png(const std::string& path, int w, int h, int seed) {
  write_bytes(path, encode_png(w, h, 3, test_rgb_image(w, h, seed)));
}

void write_jpeg(const std::string& path, int w, int h, int seed) {
  write_bytes(path, encode_jpeg(w, h, test_rgb_image(w, h, seed)));
}

// root/train and root/val with classes cat (3 images), dog (2), bird (1), created out of order,
// plus files the scan must ignore.
void write_small_folder(const TempDir& root) {
  for (const std::string split : {"train", "val"}) {
    write_png(root.file(split + "/dog/b.png"), 30, 20, 1);
    write_jpeg(root.file(split + "/dog/a.JPEG"), 24, 24, 2);
    write_png(root.file(split + "/cat/z.png"), 20, 30, 3);
    write_jpeg(root.file(split + "/cat/nested/m.jpg"), 16, 16, 4);
    write_png(root.file(split + "/cat/c.png"), 18, 18, 5);
    write_png(root.file(split + "/bird/only.png"), 40, 10, 6);
    write_bytes(root.file(split + "/cat/README.txt"), {'h', 'i'});
    write_bytes(root.file(split + "/cat/._c.png"), {0, 5, 22, 7});  // macOS AppleDouble
    write_bytes(root.file(split + "/.cache/x.png"), {1});
  }
}

std::vector<float> sample(const Dataset& d, int64_t epoch, int64_t index, int64_t* label) {
  std::vector<float> input(static_cast<size_t>(shape_numel(d.input_spec().shape)));
  d.get_in_epoch(epoch, index, input.data(), label);
  return input;
}

ImageFolderOptions small_options(bool augment = false, bool skip = false) {
  ImageFolderOptions o;
  o.image_size = 8;
  o.augment = augment;
  o.seed = 4;
  o.skip_bad_samples = skip;
  return o;
}

TEST(ImageFolder, ClassesAndFilesInByteOrder) {
  TempDir root("folder");
  write_small_folder(root);
  auto train = open_image_folder(root.path(), Split::kTrain, small_options());
  EXPECT_EQ(train->name(), "image-folder/train");
  EXPECT_EQ(train->classes(), (std::vector<std::string>{"bird", "cat", "dog"}));
  EXPECT_EQ(train->num_classes(), 3);
  ASSERT_EQ(train->size(), 6);
  const std::string dir = root.path() + "/train/";
  const std::vector<std::string> paths{dir + "bird/only.png",    dir + "cat/c.png",
                                       dir + "cat/nested/m.jpg", dir + "cat/z.png",
                                       dir + "dog/a.JPEG",       dir + "dog/b.png"};
  const std::vector<int64_t> labels{0, 1, 1, 1, 2, 2};
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(train->path(i), paths[static_cast<size_t>(i)]);
    EXPECT_EQ(train->label(i), labels[static_cast<size_t>(i)]);
    int64_t label = -1;
    sample(*train, 0, i, &label);
    EXPECT_EQ(label, labels[static_cast<size_t>(i)]);
  }
  EXPECT_EQ(train->input_spec().shape, (Shape{3, 8, 8}));
  EXPECT_EQ(train->input_spec().dtype, DType::kF32);
  EXPECT_EQ(train->target_spec().dtype, DType::kI64);
  EXPECT_EQ(train->resize_size(), 9);  // round(8 / 0.875)
  auto val = open_image_folder(root.path(), Split::kTest, small_options());
  EXPECT_EQ(val->name(), "image-folder/test");
  EXPECT_EQ(val->dir(), root.path() + "/val");
  EXPECT_EQ(val->size(), 6);
}

TEST(ImageFolder, EvaluationSampleIsTheNormalizedCenterCrop) {
  TempDir root("folder");
  // A 12x12 PNG with resize 12 and size 8: no scaling, the window at offset 2.
  const std::vector<uint8_t> rgb = test_rgb_image(12, 12, 9);
  write_bytes(root.file("train/a/x.png"), encode_png(12, 12, 3, rgb));
  ImageFolderOptions o = small_options();
  o.resize_size = 12;
  auto d = open_image_folder(root.path(), Split::kTrain, o);
  int64_t label = -1;
  const std::vector<float> x = sample(*d, 0, 0, &label);
  EXPECT_EQ(label, 0);
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 8; ++y) {
      for (int xx = 0; xx < 8; ++xx) {
        const float v = rgb[static_cast<size_t>(((y + 2) * 12 + xx + 2) * 3 + c)];
        ASSERT_NEAR(x[static_cast<size_t>((c * 8 + y) * 8 + xx)],
                    (v / 255.0f - kImageNetMean[c]) / kImageNetStd[c], 1e-5)
            << c << "," << y << "," << xx;
      }
    }
  }
  // A constant image stays constant through any resize.
  std::vector<uint8_t> flat(50 * 30 * 3);
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = i % 3 == 1 ? 255 : 0;
  write_bytes(root.file("train/a/y.png"), encode_png(50, 30, 3, flat));
  d = open_image_folder(root.path(), Split::kTrain, small_options());
  const std::vector<float> f = sample(*d, 0, 1, &label);
  for (int c = 0; c < 3; ++c) {
    const float want = ((c == 1 ? 1.0f : 0.0f) - kImageNetMean[c]) / kImageNetStd[c];
    for (int i = 0; i < 64; ++i) ASSERT_NEAR(f[static_cast<size_t>(c * 64 + i)], want, 1e-5);
  }
}

TEST(ImageFolder, TrainingCropsAreDeterministicPerEpochAndMatchTheirBox) {
  TempDir root("folder");
  write_small_folder(root);
  auto a = open_image_folder(root.path(), Split::kTrain, small_options(true));
  auto b = open_image_folder(root.path(), Split::kTrain, small_options(true));
  int changed = 0;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    for (int64_t i = 0; i < a->size(); ++i) {
      int64_t la = -1, lb = -1;
      const std::vector<float> x = sample(*a, epoch, i, &la);
      ASSERT_EQ(x, sample(*b, epoch, i, &lb));
      EXPECT_EQ(la, lb);
      changed += x != sample(*a, epoch + 1, i, &lb);
      // The sample is the file resampled through the box crop() reports.
      const RgbImage image = read_image(a->path(i));
      const CropResize box = a->crop(epoch, i, image.width, image.height);
      EXPECT_GE(box.left, 0.0);
      EXPECT_LE(box.left + box.scale_x * 8, image.width + 1e-9);
      std::vector<float> want(3 * 64);
      resample_normalized(image, box, 8, 8, kImageNetMean, kImageNetStd, want.data());
      ASSERT_EQ(x, want) << "epoch " << epoch << " sample " << i;
    }
  }
  EXPECT_GE(changed, 12);  // of 18: a new epoch draws new crops
  // get() is epoch 0.
  int64_t l0 = -1, l1 = -1;
  std::vector<float> g(3 * 64);
  a->get(2, g.data(), &l0);
  EXPECT_EQ(g, sample(*a, 0, 2, &l1));
}

TEST(ImageFolder, MissingOrMalformedLayoutsNameTheDirectory) {
  TempDir root("folder");
  std::string e =
      error_of([&] { open_image_folder(root.path() + "/nope", Split::kTrain, small_options()); });
  EXPECT_TRUE(contains(e, "directory '" + root.path() + "/nope' does not exist")) << e;
  EXPECT_TRUE(contains(e, "--data-dir")) << e;

  e = error_of([&] { open_image_folder(root.path(), Split::kTest, small_options()); });
  EXPECT_TRUE(contains(e, "'" + root.path() + "' has no val/ or test/ directory")) << e;
  EXPECT_TRUE(contains(e, root.path() + "/train/<class>/<image>")) << e;

  write_png(root.file("train/flat1.png"), 8, 8, 1);  // the flat validation layout
  e = error_of([&] { open_image_folder(root.path(), Split::kTrain, small_options()); });
  EXPECT_TRUE(contains(e, "'" + root.path() + "/train' holds no class directories")) << e;
  EXPECT_TRUE(contains(e, "valprep.sh")) << e;

  write_png(root.file("train/cat/1.png"), 8, 8, 1);
  write_bytes(root.file("train/dog/notes.txt"), {'x'});
  e = error_of([&] { open_image_folder(root.path(), Split::kTrain, small_options()); });
  EXPECT_TRUE(contains(e, "class directory '" + root.path() + "/train/dog' holds no image files"))
      << e;

  write_png(root.file("train/dog/1.png"), 8, 8, 1);
  write_png(root.file("test/cat/1.png"), 8, 8, 1);
  write_png(root.file("test/cow/1.png"), 8, 8, 1);
  e = error_of([&] { open_image_folder(root.path(), Split::kTest, small_options()); });
  EXPECT_TRUE(contains(e, "the class directories of '" + root.path() + "/test' (2) differ")) << e;
  EXPECT_TRUE(contains(e, "Only in train: 'dog'")) << e;
  EXPECT_TRUE(contains(e, "Only in test: 'cow'")) << e;
}

// A folder whose samples 1 and 2 (cat/b.jpg, cat/c.png) and 4 (dog/z.jpg, the last) are bad.
struct BadFolder {
  BadFolder() : root("folder") {
    write_png(root.file("train/cat/a.png"), 20, 16, 1);
    std::vector<uint8_t> jpg = encode_jpeg(20, 16, test_rgb_image(20, 16, 2));
    jpg.resize(jpg.size() / 2);
    write_bytes(root.file("train/cat/b.jpg"), jpg);  // truncated JPEG
    std::vector<uint8_t> png = encode_png(20, 16, 3, test_rgb_image(20, 16, 3));
    png[45] ^= 0x10;
    write_bytes(root.file("train/cat/c.png"), png);  // corrupt PNG
    write_png(root.file("train/dog/d.png"), 16, 20, 4);
    const std::string text = "not an image";
    write_bytes(root.file("train/dog/z.jpg"), {text.begin(), text.end()});  // non-image file
  }
  TempDir root;
};

TEST(ImageFolder, BadFilesAreErrorsNamingTheFile) {
  BadFolder f;
  auto d = open_image_folder(f.root.path(), Split::kTrain, small_options());
  ASSERT_EQ(d->size(), 5);
  int64_t label = -1;
  const std::string dir = f.root.path() + "/train/";
  std::string e = error_of([&] { sample(*d, 0, 1, &label); });
  EXPECT_TRUE(contains(e, "image-folder/train: sample 1 (class 'cat')")) << e;
  EXPECT_TRUE(contains(e, dir + "cat/b.jpg: cannot decode JPEG")) << e;
  EXPECT_TRUE(contains(e, "--skip-bad-samples")) << e;
  e = error_of([&] { sample(*d, 0, 2, &label); });
  EXPECT_TRUE(contains(e, dir + "cat/c.png: PNG: corrupt: CRC-32 mismatch in chunk IDAT")) << e;
  e = error_of([&] { sample(*d, 0, 4, &label); });
  EXPECT_TRUE(contains(e, dir + "dog/z.jpg: not an image")) << e;
  EXPECT_EQ(d->skipped_samples(), 0);
  std::filesystem::remove(dir + "cat/a.png");  // gone since the scan
  e = error_of([&] { sample(*d, 0, 0, &label); });
  EXPECT_TRUE(contains(e, "cannot open '" + dir + "cat/a.png'")) << e;
}

TEST(ImageFolder, SkipModeSubstitutesTheNextReadableFileAndCountsEachBadFileOnce) {
  BadFolder f;
  auto skip = open_image_folder(f.root.path(), Split::kTrain, small_options(false, true));
  int64_t label = -1, want_label = -1;
  // Samples 1 and 2 become sample 3 (dog/d.png, label 1); sample 4 wraps around to sample 0.
  const std::vector<float> three = sample(*skip, 0, 3, &want_label);
  EXPECT_EQ(sample(*skip, 0, 1, &label), three);
  EXPECT_EQ(label, 1);
  EXPECT_EQ(skip->skipped_samples(), 2);
  EXPECT_EQ(sample(*skip, 0, 2, &label), three);
  EXPECT_EQ(skip->skipped_samples(), 2);  // known bad files are not counted again
  const std::vector<float> zero = sample(*skip, 0, 0, &want_label);
  EXPECT_EQ(sample(*skip, 0, 4, &label), zero);
  EXPECT_EQ(label, 0);
  EXPECT_EQ(skip->skipped_samples(), 3);
  EXPECT_EQ(make_subset(skip, 1, 3)->skipped_samples(), 3);

  // With augmentation, a substitute keeps the draws of the sample it stands for.
  auto aug = open_image_folder(f.root.path(), Split::kTrain, small_options(true, true));
  const RgbImage d_png = read_image(aug->path(3));
  std::vector<float> want(3 * 64);
  resample_normalized(d_png, aug->crop(5, 1, d_png.width, d_png.height), 8, 8, kImageNetMean,
                      kImageNetStd, want.data());
  EXPECT_EQ(sample(*aug, 5, 1, &label), want);

  // Nothing readable at all is an error, even in skip mode.
  TempDir bad("folder");
  write_bytes(bad.file("train/x/1.jpg"), {1, 2, 3});
  auto none = open_image_folder(bad.path(), Split::kTrain, small_options(false, true));
  const std::string e = error_of([&] { sample(*none, 0, 0, &label); });
  EXPECT_TRUE(contains(e, "none of the 1 files")) << e;
  EXPECT_EQ(none->skipped_samples(), 1);
}

std::vector<Batch> loader_epochs(std::shared_ptr<const Dataset> data, int workers) {
  DataLoaderOptions o;
  o.batch_size = 2;
  o.shuffle = true;
  o.seed = 3;
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

TEST(ImageFolder, DataLoaderWithWorkersGivesTheSameBatchesAsWithout) {
  BadFolder f;
  for (int k = 0; k < 6; ++k)
    write_png(f.root.file("train/bird/" + std::to_string(k) + ".png"), 9 + k, 12, k);
  auto serial_data = open_image_folder(f.root.path(), Split::kTrain, small_options(true, true));
  auto threaded_data = open_image_folder(f.root.path(), Split::kTrain, small_options(true, true));
  ASSERT_EQ(serial_data->size(), 11);
  const std::vector<Batch> serial = loader_epochs(serial_data, 0);
  const std::vector<Batch> threaded = loader_epochs(threaded_data, 2);
  ASSERT_EQ(serial.size(), 12u);
  ASSERT_EQ(threaded.size(), serial.size());
  for (size_t i = 0; i < serial.size(); ++i) {
    EXPECT_EQ(serial[i].input.to_vector<float>(), threaded[i].input.to_vector<float>()) << i;
    EXPECT_EQ(serial[i].target.to_vector<int64_t>(), threaded[i].target.to_vector<int64_t>()) << i;
  }
  EXPECT_NE(serial[0].input.to_vector<float>(), serial[6].input.to_vector<float>());
  EXPECT_EQ(serial_data->skipped_samples(), 3);  // whole epochs touch every file
  EXPECT_EQ(threaded_data->skipped_samples(), 3);
}

}  // namespace
}  // namespace strata::io
