// Test helpers that write small image-dataset files in their exact formats: CIFAR-10 binary
// batches, and PNG, JPEG and BMP files through stb_image_write (libstb-dev). Nothing binary is
// committed; every test makes what it reads in a fresh temporary directory.
//
// stb_image_write itself is compiled once, in tests/testing/stb_image_write.cpp: a test that
// includes this header links strata_test_images (tests/CMakeLists.txt).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include <stb/stb_image_write.h>

namespace strata::testing {

// A fresh directory under the test temp dir, removed with the object.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    std::string pattern = ::testing::TempDir() + "strata_" + tag + "_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << pattern;
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/relative, with the parent directories created.
  std::string file(const std::string& relative) const {
    const std::filesystem::path p = std::filesystem::path(path_) / relative;
    std::filesystem::create_directories(p.parent_path());
    return p.string();
  }

 private:
  std::string path_;
};

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "writing " << path;
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// CIFAR-10 records: label(r) then pixel(r, c, y, x) for the R, G, B planes of 32x32.
inline std::vector<uint8_t> cifar_records(
    int64_t count, const std::function<uint8_t(int64_t)>& label,
    const std::function<uint8_t(int64_t, int, int, int)>& pixel) {
  std::vector<uint8_t> bytes;
  bytes.reserve(static_cast<size_t>(count * 3073));
  for (int64_t r = 0; r < count; ++r) {
    bytes.push_back(label(r));
    for (int c = 0; c < 3; ++c) {
      for (int y = 0; y < 32; ++y) {
        for (int x = 0; x < 32; ++x) bytes.push_back(pixel(r, c, y, x));
      }
    }
  }
  return bytes;
}

// The pixel pattern of the CIFAR tests: record r of file f.
inline uint8_t cifar_pixel(int file, int64_t r, int c, int y, int x) {
  return static_cast<uint8_t>(31 * file + 7 * r + 50 * c + 5 * y + x);
}

// A full CIFAR-10 layout in `dir`: data_batch_1..5.bin with `records` records each and
// test_batch.bin with `test_records`; file f (1..5, test 6) record r has label (3 f + r) % 10.
inline void write_cifar_dir(const std::string& dir, int64_t records, int64_t test_records) {
  for (int f = 1; f <= 6; ++f) {
    const std::string name = f <= 5 ? "data_batch_" + std::to_string(f) + ".bin" : "test_batch.bin";
    write_bytes(dir + "/" + name,
                cifar_records(
                    f <= 5 ? records : test_records,
                    [f](int64_t r) { return static_cast<uint8_t>((3 * f + r) % 10); },
                    [f](int64_t r, int c, int y, int x) { return cifar_pixel(f, r, c, y, x); }));
  }
}

// An RGB image (h, w, 3) with a smooth but asymmetric pattern, different per `seed`.
inline std::vector<uint8_t> test_rgb_image(int w, int h, int seed) {
  std::vector<uint8_t> p(static_cast<size_t>(w * h * 3));
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        p[static_cast<size_t>((y * w + x) * 3 + c)] = static_cast<uint8_t>(
            (seed * 40 + c * 60 + x * 255 / w + (y * 128 / h) * (c + 1)) % 256);
      }
    }
  }
  return p;
}

inline void append_bytes(void* context, void* data, int size) {
  auto* out = static_cast<std::vector<uint8_t>*>(context);
  out->insert(out->end(), static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
}

inline std::vector<uint8_t> encode_png(int w, int h, int channels, const std::vector<uint8_t>& px) {
  std::vector<uint8_t> out;
  stbi_write_png_to_func(append_bytes, &out, w, h, channels, px.data(), w * channels);
  return out;
}

inline std::vector<uint8_t> encode_jpeg(int w, int h, const std::vector<uint8_t>& rgb,
                                        int quality = 95) {
  std::vector<uint8_t> out;
  stbi_write_jpg_to_func(append_bytes, &out, w, h, 3, rgb.data(), quality);
  return out;
}

inline std::vector<uint8_t> encode_bmp(int w, int h, const std::vector<uint8_t>& rgb) {
  std::vector<uint8_t> out;
  stbi_write_bmp_to_func(append_bytes, &out, w, h, 3, rgb.data());
  return out;
}

}  // namespace strata::testing
