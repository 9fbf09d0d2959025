// Image decoding (PNG, JPEG, BMP, PPM/PGM written here in their exact formats) with every error a
// file can cause, and the transforms: resampling against a direct 2-D evaluation of the filter,
// flips, the center crop's arithmetic and the random resized crop's bounds.
#include "io/image.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "engine/check.h"
#include "testing/image_files.h"

namespace strata::io {
namespace {

using strata::testing::encode_bmp;
using strata::testing::encode_jpeg;
using strata::testing::encode_png;
using strata::testing::test_rgb_image;

std::string decode_error(const std::vector<uint8_t>& bytes, const std::string& name = "x.png") {
  try {
    decode_image(bytes.data(), bytes.size(), name);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(DecodeImage, PngIsExact) {
  const std::vector<uint8_t> rgb = test_rgb_image(7, 5, 1);
  const std::vector<uint8_t> png = encode_png(7, 5, 3, rgb);
  EXPECT_EQ(sniff_image_format(png.data(), png.size()), ImageFormat::kPng);
  const RgbImage image = decode_image(png.data(), png.size(), "a.png");
  EXPECT_EQ(image.width, 7);
  EXPECT_EQ(image.height, 5);
  EXPECT_EQ(image.pixels, rgb);
}

TEST(DecodeImage, GreyIsReplicatedAndAlphaDropped) {
  std::vector<uint8_t> grey{0, 10, 200, 255, 7, 99};
  const std::vector<uint8_t> png = encode_png(3, 2, 1, grey);
  const RgbImage g = decode_image(png.data(), png.size(), "g.png");
  ASSERT_EQ(g.pixels.size(), 18u);
  for (size_t i = 0; i < grey.size(); ++i) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(g.pixels[3 * i + c], grey[i]);
  }
  const std::vector<uint8_t> rgba{1, 2, 3, 0, 4, 5, 6, 255};
  const std::vector<uint8_t> png4 = encode_png(2, 1, 4, rgba);
  const RgbImage a = decode_image(png4.data(), png4.size(), "a.png");
  EXPECT_EQ(a.pixels, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));
}

TEST(DecodeImage, JpegIsCloseAtHighQuality) {
  const std::vector<uint8_t> rgb = test_rgb_image(32, 24, 2);
  const std::vector<uint8_t> jpg = encode_jpeg(32, 24, rgb, 100);
  EXPECT_EQ(sniff_image_format(jpg.data(), jpg.size()), ImageFormat::kJpeg);
  const RgbImage image = decode_image(jpg.data(), jpg.size(), "a.jpg");
  ASSERT_EQ(image.width, 32);
  ASSERT_EQ(image.height, 24);
  double error = 0.0;
  for (size_t i = 0; i < rgb.size(); ++i) error += std::abs(image.pixels[i] - rgb[i]);
  EXPECT_LT(error / static_cast<double>(rgb.size()), 3.0);  // lossy, but a few levels at most
}

TEST(DecodeImage, BmpPpmAndPgm) {
  const std::vector<uint8_t> rgb = test_rgb_image(5, 3, 3);
  const std::vector<uint8_t> bmp = encode_bmp(5, 3, rgb);
  EXPECT_EQ(decode_image(bmp.data(), bmp.size(), "a.bmp").pixels, rgb);
  std::string header = "P6\n5 3\n255\n";
  std::vector<uint8_t> ppm(header.begin(), header.end());
  ppm.insert(ppm.end(), rgb.begin(), rgb.end());
  EXPECT_EQ(decode_image(ppm.data(), ppm.size(), "a.ppm").pixels, rgb);
  header = "P5\n# a comment\n2 1\n255\n";
  std::vector<uint8_t> pgm(header.begin(), header.end());
  pgm.push_back(17);
  pgm.push_back(230);
  EXPECT_EQ(decode_image(pgm.data(), pgm.size(), "a.pgm").pixels,
            (std::vector<uint8_t>{17, 17, 17, 230, 230, 230}));
}

// Found by the image fuzzer: 16-bit PGMs made stb_image read past its buffer (with too few pixel
// bytes, and when converting to RGB); 8-bit ones must hold every pixel they announce.
TEST(DecodeImage, TruncatedPnmIsRefusedBeforeDecoding) {
  const std::string crash = std::string("P5 2 1 666\n\n") + '\xc8';
  std::string e = decode_error({crash.begin(), crash.end()}, "x.pgm");
  EXPECT_TRUE(contains(e, "x.pgm: PNM maxval 666: 16-bit PPM/PGM")) << e;
  const std::string short_pgm = std::string("P5 2 1 255\n") + '\xc8';
  e = decode_error({short_pgm.begin(), short_pgm.end()}, "x.pgm");
  EXPECT_TRUE(contains(e, "x.pgm: PNM of 2x1 needs 2 bytes of pixels, the file has 1")) << e;
  const std::string ppm = "P6\n4 4\n255\n" + std::string(47, 'a');
  e = decode_error({ppm.begin(), ppm.end()}, "y.ppm");
  EXPECT_TRUE(contains(e, "y.ppm: PNM of 4x4 needs 48 bytes of pixels, the file has 47")) << e;
  const std::string no_height = "P5\n4 # x\n";
  e = decode_error({no_height.begin(), no_height.end()}, "z.pgm");
  EXPECT_TRUE(contains(e, "z.pgm: PNM header: expected the height")) << e;
}

// Found by the image fuzzer: a Huffman table whose 16 code counts add up to more than 256 made
// stb_image write past its tables.
TEST(DecodeImage, JpegHuffmanTableOfTooManyCodesIsRefused) {
  std::vector<uint8_t> jpg = encode_jpeg(16, 16, test_rgb_image(16, 16, 2));
  EXPECT_EQ(decode_error(jpg, "ok.jpg"), "");
  size_t dht = 0;
  for (size_t i = 2; i + 1 < jpg.size() && dht == 0; ++i) {
    if (jpg[i] == 0xFF && jpg[i + 1] == 0xC4) dht = i;
  }
  ASSERT_NE(dht, 0u) << "the encoder wrote no Huffman table";
  for (size_t i = 0; i < 16; ++i) jpg[dht + 5 + i] = 0x20;  // 16 x 32 = 512 codes
  const std::string e = decode_error(jpg, "bad.jpg");
  EXPECT_TRUE(contains(e, "bad.jpg: JPEG: the Huffman table at byte " + std::to_string(dht + 4) +
                              " defines 512 codes (at most 256)"))
      << e;
}

// Found by the image fuzzer (a timeout): 451 bytes announcing a 17990 x 21065 JPEG.
TEST(DecodeImage, HeadersAnnouncingTooManyPixelsAreRefused) {
  std::string header = "P5\n20000 20000\n255\n";
  std::vector<uint8_t> pgm(header.begin(), header.end());
  pgm.resize(pgm.size() + 16, 7);
  EXPECT_EQ(announced_pixels(pgm.data(), pgm.size()), 0) << "refused: its pixels are missing";
  const std::string e = decode_error(pgm, "huge.pgm");
  EXPECT_TRUE(contains(e, "huge.pgm: PNM of 20000x20000 needs")) << e;
  std::vector<uint8_t> jpg = encode_jpeg(16, 16, test_rgb_image(16, 16, 2));
  for (size_t i = 2; i + 8 < jpg.size(); ++i) {
    if (jpg[i] == 0xFF && jpg[i + 1] == 0xC0) {  // SOF0: length, precision, height, width
      jpg[i + 5] = 0x52, jpg[i + 6] = 0x49, jpg[i + 7] = 0x46, jpg[i + 8] = 0x46;
      break;
    }
  }
  EXPECT_EQ(announced_pixels(jpg.data(), jpg.size()), int64_t{0x5249} * 0x4646);
  const std::string j = decode_error(jpg, "huge.jpg");
  EXPECT_TRUE(contains(j, "huge.jpg: JPEG of 17990x21065 pixels: more than the 268435456")) << j;
}

TEST(DecodeImage, TruncatedJpegNamesTheFileAndTheDecodersReason) {
  const std::vector<uint8_t> jpg = encode_jpeg(40, 30, test_rgb_image(40, 30, 4));
  for (const size_t cut : {jpg.size() - 2, jpg.size() / 2, size_t{200}, size_t{4}}) {
    const std::string e =
        decode_error({jpg.begin(), jpg.begin() + static_cast<long>(cut)}, "/data/train/cat/1.jpg");
    EXPECT_TRUE(contains(e, "/data/train/cat/1.jpg: cannot decode JPEG (" + std::to_string(cut) +
                                " bytes): stb_image: "))
        << "cut at " << cut << ": " << e;
    EXPECT_TRUE(contains(e, "truncated or corrupt")) << e;
  }
}

TEST(DecodeImage, CorruptOrTruncatedPngNamesTheChunkAndItsOffset) {
  const std::vector<uint8_t> png = encode_png(16, 16, 3, test_rgb_image(16, 16, 5));
  // Chunks: signature (8), IHDR at 8 (25 bytes), then IDAT at 33.
  ASSERT_EQ(std::string(png.begin() + 37, png.begin() + 41), "IDAT");
  std::vector<uint8_t> flipped = png;
  flipped[45] ^= 0x01;  // one bit of the compressed data
  std::string e = decode_error(flipped, "/data/train/dog/2.png");
  EXPECT_TRUE(contains(e,
                       "/data/train/dog/2.png: PNG: corrupt: CRC-32 mismatch in chunk IDAT at "
                       "byte 33"))
      << e;

  e = decode_error({png.begin(), png.end() - 12});  // no IEND
  EXPECT_TRUE(contains(e, "x.png: PNG: truncated: expected a chunk header")) << e;
  EXPECT_TRUE(contains(e, "without an IEND chunk")) << e;

  e = decode_error({png.begin(), png.begin() + 60});
  EXPECT_TRUE(contains(e, "truncated: chunk IDAT at byte 33 needs")) << e;
  EXPECT_TRUE(contains(e, "the file ends at byte 60")) << e;

  std::vector<uint8_t> renamed = png;
  renamed[12] = 'X';  // the first chunk is no longer IHDR
  e = decode_error(renamed);
  EXPECT_TRUE(contains(e, "expected the IHDR chunk at byte 8")) << e;
}

TEST(DecodeImage, NonImagesAndUnsupportedFormats) {
  const std::string html = "<!DOCTYPE html><html>";
  std::string e = decode_error({html.begin(), html.end()}, "/data/val/cat/3.jpg");
  EXPECT_TRUE(contains(e, "/data/val/cat/3.jpg: not an image")) << e;
  EXPECT_TRUE(contains(e, "found 3C 21 44 4F 43 54 59 50")) << e;
  EXPECT_TRUE(contains(decode_error({}), "found an empty file"));
  const std::string gif = "GIF89a......";
  e = decode_error({gif.begin(), gif.end()});
  EXPECT_TRUE(contains(e, "GIF images are not supported")) << e;
  const std::string ascii_ppm = "P3\n1 1\n255\n1 2 3\n";
  e = decode_error({ascii_ppm.begin(), ascii_ppm.end()});
  EXPECT_TRUE(contains(e, "PNM type P3 is not supported")) << e;
}

TEST(ReadImage, MissingFileNamesIt) {
  try {
    read_image("/nonexistent/a.jpg");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "cannot open '/nonexistent/a.jpg'")) << e.what();
  }
}

// The Pillow BILINEAR rule, evaluated directly in 2-D and double: the reference for the
// separable f32 implementation.
std::vector<double> reference_resample(const RgbImage& img, const CropResize& crop, int64_t ow,
                                       int64_t oh) {
  auto weights = [](int64_t in, double begin, double scale, int64_t k) {
    const double center = begin + (k + 0.5) * scale;
    const double support = std::max(scale, 1.0);
    std::vector<double> w(static_cast<size_t>(in), 0.0);
    double total = 0.0;
    for (int64_t j = 0; j < in; ++j) {
      const double d = std::fabs((j + 0.5 - center) / support);
      if (d < 1.0 && j >= static_cast<int64_t>(std::floor(center - support + 0.5)) &&
          j < static_cast<int64_t>(std::floor(center + support + 0.5))) {
        w[static_cast<size_t>(j)] = 1.0 - d;
      }
      total += w[static_cast<size_t>(j)];
    }
    for (double& v : w) v /= total;
    return w;
  };
  std::vector<double> out(static_cast<size_t>(3 * ow * oh));
  for (int64_t y = 0; y < oh; ++y) {
    const std::vector<double> wy = weights(img.height, crop.top, crop.scale_y, y);
    for (int64_t x = 0; x < ow; ++x) {
      const int64_t k = crop.flip ? ow - 1 - x : x;
      const std::vector<double> wx = weights(img.width, crop.left, crop.scale_x, k);
      for (int c = 0; c < 3; ++c) {
        double acc = 0.0;
        for (int64_t i = 0; i < img.height; ++i) {
          for (int64_t j = 0; j < img.width; ++j) {
            acc += wy[static_cast<size_t>(i)] * wx[static_cast<size_t>(j)] *
                   img.pixels[static_cast<size_t>((i * img.width + j) * 3 + c)];
          }
        }
        out[static_cast<size_t>((c * oh + y) * ow + x)] = acc;
      }
    }
  }
  return out;
}

RgbImage make_image(int w, int h, int seed) { return RgbImage{w, h, test_rgb_image(w, h, seed)}; }

const float kZero[3] = {0.0f, 0.0f, 0.0f};
const float kUnit[3] = {1.0f / 255.0f, 1.0f / 255.0f, 1.0f / 255.0f};  // output = raw 0..255

std::vector<float> resample(const RgbImage& img, const CropResize& crop, int64_t ow, int64_t oh,
                            const float* mean = kZero, const float* stddev = kUnit) {
  std::vector<float> out(static_cast<size_t>(3 * ow * oh));
  resample_normalized(img, crop, ow, oh, mean, stddev, out.data());
  return out;
}

TEST(Resample, IdentityIsExactAndNormalizes) {
  const RgbImage img = make_image(6, 4, 1);
  const std::vector<float> out = resample(img, CropResize{}, 6, 4, kImageNetMean, kImageNetStd);
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 4; ++y) {
      for (int x = 0; x < 6; ++x) {
        const float v = img.pixels[static_cast<size_t>((y * 6 + x) * 3 + c)];
        EXPECT_NEAR(out[static_cast<size_t>((c * 4 + y) * 6 + x)],
                    (v / 255.0f - kImageNetMean[c]) / kImageNetStd[c], 1e-5);
      }
    }
  }
}

TEST(Resample, MatchesTheDirectFilterWhenScalingDownUpAndCropping) {
  const RgbImage img = make_image(23, 17, 2);
  const std::vector<std::pair<CropResize, std::pair<int64_t, int64_t>>> cases{
      {{0.0, 0.0, 23.0 / 8, 17.0 / 6, false}, {8, 6}},      // downscale, antialiased
      {{0.0, 0.0, 23.0 / 40, 17.0 / 30, false}, {40, 30}},  // upscale
      {{3.0, 2.0, 10.0 / 7, 12.0 / 9, true}, {7, 9}},       // crop, resize and flip
      {{5.5, 1.25, 0.8, 1.9, false}, {11, 8}},              // fractional box
  };
  for (const auto& [crop, size] : cases) {
    const std::vector<float> got = resample(img, crop, size.first, size.second);
    const std::vector<double> want = reference_resample(img, crop, size.first, size.second);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 2e-3) << "element " << i << " of output " << size.first << "x"
                                         << size.second << " scale " << crop.scale_x;
    }
  }
}

TEST(Resample, ConstantImageStaysConstant) {
  RgbImage img{9, 7, std::vector<uint8_t>(9 * 7 * 3)};
  for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = i % 3 == 0 ? 200 : 40;
  for (const CropResize& crop :
       {CropResize{0, 0, 9.0 / 4, 7.0 / 3, false}, CropResize{1, 1, 0.3, 0.4, true}}) {
    const std::vector<float> out = resample(img, crop, 4, 3);
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_NEAR(out[i], i < 12 ? 200.0f : 40.0f, 1e-3) << i;
    }
  }
}

TEST(Resample, FlipMirrorsTheOutput) {
  const RgbImage img = make_image(20, 10, 3);
  CropResize crop{2.0, 1.0, 1.5, 1.2, false};
  const std::vector<float> plain = resample(img, crop, 8, 6);
  crop.flip = true;
  const std::vector<float> flipped = resample(img, crop, 8, 6);
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 6; ++y) {
      for (int x = 0; x < 8; ++x) {
        EXPECT_EQ(flipped[static_cast<size_t>((c * 6 + y) * 8 + x)],
                  plain[static_cast<size_t>((c * 6 + y) * 8 + 7 - x)]);
      }
    }
  }
}

TEST(CenterCrop, ResizesTheShorterSideThenCentersTheWindow) {
  // 500x375 -> 341x256 (floor(256 * 500 / 375)), window at round(117 / 2) = 58 (half to even).
  CropResize c = resize_center_crop(500, 375, 256, 224);
  EXPECT_DOUBLE_EQ(c.scale_x, 500.0 / 341);
  EXPECT_DOUBLE_EQ(c.scale_y, 375.0 / 256);
  EXPECT_DOUBLE_EQ(c.left, 58 * 500.0 / 341);
  EXPECT_DOUBLE_EQ(c.top, 16 * 375.0 / 256);
  EXPECT_FALSE(c.flip);
  // Portrait: 300x400 -> 256x341.
  c = resize_center_crop(300, 400, 256, 224);
  EXPECT_DOUBLE_EQ(c.scale_x, 300.0 / 256);
  EXPECT_DOUBLE_EQ(c.left, 16 * 300.0 / 256);
  EXPECT_DOUBLE_EQ(c.top, 58 * 400.0 / 341);
  EXPECT_THROW(resize_center_crop(300, 400, 200, 224), Error);
}

TEST(RandomResizedCrop, BoxesFitAndFollowTheScaleAndRatioBounds) {
  bool flips[2] = {false, false};
  for (uint64_t i = 0; i < 500; ++i) {
    PhiloxStream rng(1, 2, i);
    const CropResize c = random_resized_crop(400, 300, 224, rng);
    const double w = c.scale_x * 224, h = c.scale_y * 224;
    ASSERT_GE(c.left, 0.0);
    ASSERT_GE(c.top, 0.0);
    ASSERT_LE(c.left + w, 400.0 + 1e-9);
    ASSERT_LE(c.top + h, 300.0 + 1e-9);
    EXPECT_EQ(c.left, std::floor(c.left));  // integer offsets
    const double area = w * h / (400.0 * 300.0);
    EXPECT_GT(area, 0.07);
    EXPECT_LE(area, 1.0 + 1e-9);
    EXPECT_GT(w / h, 0.74);
    EXPECT_LT(w / h, 1.35);
    flips[c.flip] = true;
    PhiloxStream again(1, 2, i);
    const CropResize d = random_resized_crop(400, 300, 224, again);
    EXPECT_EQ(c.left, d.left);
    EXPECT_EQ(c.scale_x, d.scale_x);
    EXPECT_EQ(c.flip, d.flip);
  }
  EXPECT_TRUE(flips[0] && flips[1]);
  // A strip no box of ratio 3/4..4/3 and scale >= 0.08 fits: the centered fallback of ratio 4/3.
  PhiloxStream rng(1, 2, 0);
  const CropResize c = random_resized_crop(1000, 10, 32, rng);
  EXPECT_DOUBLE_EQ(c.scale_y * 32, 10.0);
  EXPECT_DOUBLE_EQ(c.scale_x * 32, 13.0);
  EXPECT_DOUBLE_EQ(c.left, (1000 - 13) / 2);
  EXPECT_DOUBLE_EQ(c.top, 0.0);
}

}  // namespace
}  // namespace strata::io
