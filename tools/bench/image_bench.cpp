// strata_image_bench: throughput of the image-folder pipeline (read + JPEG decode + crop/resize +
// normalize), in images per second.
//
//   strata_image_bench                       # 64 generated 500x375 JPEGs, 224 px samples
//   strata_image_bench --dir /data/imagenet  # a real folder (its train/ split)
//
// Generated images are smooth colour fields with per-pixel noise, encoded at quality 90, so that
// their size (about 100 KB at 500x375) and decoding cost resemble ImageNet photographs. Each
// measurement runs whole passes over the folder until --seconds have passed; stages are timed
// separately on one thread (decode only; decode + evaluation transform; decode + training
// transform), then through a DataLoader with each worker count.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "engine/check.h"
#include "engine/philox.h"
#include "io/data_loader.h"
#include "io/image_folder.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

namespace {

using Clock = std::chrono::steady_clock;

void append(void* context, void* data, int size) {
  auto* out = static_cast<std::vector<uint8_t>*>(context);
  out->insert(out->end(), static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
}

// `count` JPEGs of width x height in root/train/c<k>/ (4 classes); returns the mean file size.
double generate_folder(const std::string& root, int count, int width, int height) {
  size_t total = 0;
  for (int i = 0; i < count; ++i) {
    strata::PhiloxStream rng(1, 2, static_cast<uint64_t>(i));
    const float base[3] = {255 * rng.next_uniform(), 255 * rng.next_uniform(),
                           255 * rng.next_uniform()};
    std::vector<uint8_t> rgb(static_cast<size_t>(width * height * 3));
    for (int y = 0; y < height; ++y) {
      for (int x = 0; x < width; ++x) {
        for (int c = 0; c < 3; ++c) {
          const float v = base[c] * 0.5f + 60.0f * static_cast<float>(x) / width +
                          60.0f * static_cast<float>(y) / height + 40.0f * rng.next_uniform();
          rgb[static_cast<size_t>((y * width + x) * 3 + c)] =
              static_cast<uint8_t>(v < 255.0f ? v : 255.0f);
        }
      }
    }
    std::vector<uint8_t> jpg;
    stbi_write_jpg_to_func(append, &jpg, width, height, 3, rgb.data(), 90);
    const std::filesystem::path dir =
        std::filesystem::path(root) / "train" / ("c" + std::to_string(i % 4));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / (std::to_string(i) + ".jpg"), std::ios::binary)
        .write(reinterpret_cast<const char*>(jpg.data()), static_cast<std::streamsize>(jpg.size()));
    total += jpg.size();
  }
  return static_cast<double>(total) / count;
}

double process_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Rate {
  double images_per_s = 0.0;      // wall clock
  double cpu_ms_per_image = 0.0;  // CPU time of the whole process (all threads)
};

// The rate of `pass` (which handles `images` images), over whole passes. On a shared machine the
// CPU time per image is the steadier number: it does not count time spent waiting for a core.
Rate rate(int64_t images, double min_seconds, const std::function<void()>& pass) {
  pass();  // warm-up: page cache, allocator
  int64_t done = 0;
  const auto start = Clock::now();
  const double cpu_start = process_cpu_seconds();
  double elapsed = 0.0;
  do {
    pass();
    done += images;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < min_seconds);
  Rate r;
  r.images_per_s = static_cast<double>(done) / elapsed;
  r.cpu_ms_per_image = 1e3 * (process_cpu_seconds() - cpu_start) / static_cast<double>(done);
  return r;
}

void print_rate(const std::string& what, const Rate& r) {
  std::printf("  %-58s %8.1f img/s  %6.2f ms CPU/img\n", what.c_str(), r.images_per_s,
              r.cpu_ms_per_image);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Throughput of image decoding and augmentation (image-folder datasets)"};
  app.option_defaults()->always_capture_default();
  std::string dir;
  int images = 64, width = 500, height = 375;
  int64_t size = 224;
  double seconds = 2.0;
  std::vector<int> workers{1, 2};
  app.add_option("--dir", dir, "An image folder with a train/ split (empty = generate JPEGs)");
  app.add_option("--images", images, "Generated images");
  app.add_option("--width", width, "Width of the generated images");
  app.add_option("--height", height, "Height of the generated images");
  app.add_option("--size", size, "Side of the samples");
  app.add_option("--seconds", seconds, "Minimum time per measurement");
  app.add_option("--workers", workers, "DataLoader worker counts to measure");
  CLI11_PARSE(app, argc, argv);

  try {
    std::string root = dir;
    std::string temp;
    if (root.empty()) {
      std::string pattern =
          (std::filesystem::temp_directory_path() / "strata_image_bench_XXXXXX").string();
      STRATA_CHECK(::mkdtemp(pattern.data()) != nullptr) << "mkdtemp " << pattern;
      root = temp = pattern;
      const double bytes = generate_folder(root, images, width, height);
      std::printf("generated %d JPEGs of %dx%d, %.0f KB each on average\n", images, width, height,
                  bytes / 1024.0);
    }
    strata::io::ImageFolderOptions eval_options;
    eval_options.image_size = size;
    strata::io::ImageFolderOptions train_options = eval_options;
    train_options.augment = true;
    auto eval = strata::io::open_image_folder(root, strata::io::Split::kTrain, eval_options);
    auto train = std::make_shared<const strata::io::ImageFolderDataset>("bench/train", eval->dir(),
                                                                        train_options);
    const int64_t n = eval->size();
    std::printf("%lld images in %s, samples (3, %lld, %lld)\n", static_cast<long long>(n),
                eval->dir().c_str(), static_cast<long long>(size), static_cast<long long>(size));

    std::vector<float> sample(static_cast<size_t>(3 * size * size));
    int64_t label = 0;
    int64_t epoch = 0;
    const std::string side = std::to_string(size);
    std::printf("one thread:\n");
    print_rate("read + decode", rate(n, seconds, [&] {
                 for (int64_t i = 0; i < n; ++i) strata::io::read_image(eval->path(i));
               }));
    print_rate("read + decode + resize, center crop " + side + ", normalize", rate(n, seconds, [&] {
                 for (int64_t i = 0; i < n; ++i) eval->get_in_epoch(0, i, sample.data(), &label);
               }));
    print_rate("read + decode + random resized crop " + side + ", flip, normalize",
               rate(n, seconds, [&] {
                 for (int64_t i = 0; i < n; ++i) {
                   train->get_in_epoch(epoch, i, sample.data(), &label);
                 }
                 ++epoch;
               }));
    std::printf("DataLoader (batches of 32, training transform):\n");
    for (int w : workers) {
      strata::io::DataLoaderOptions o;
      o.batch_size = 32;
      o.shuffle = true;
      o.num_workers = w;
      o.prefetch = 2 * w;
      strata::io::DataLoader loader(train, o);
      int64_t loader_epoch = 0;
      print_rate(std::to_string(w) + (w == 1 ? " worker" : " workers"), rate(n, seconds, [&] {
                   loader.start_epoch(loader_epoch++);
                   strata::io::Batch b;
                   while (loader.next(&b)) {
                   }
                 }));
    }
    if (!temp.empty()) std::filesystem::remove_all(temp);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
