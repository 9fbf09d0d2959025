// Image decoding and the geometric transforms of image classification, on the host.
//
//   RgbImage image = read_image("train/n01440764/x.JPEG");          // decode to 8-bit RGB
//   CropResize crop = resize_center_crop(image.width, image.height, 256, 224);   // evaluation
//   CropResize crop = random_resized_crop(image.width, image.height, 224, rng);  // training
//   resample_normalized(image, crop, 224, 224, kImageNetMean, kImageNetStd, out);  // (3, 224, 224)
//
// Coordinates are continuous: source pixel p covers [p, p + 1) and its center is p + 0.5. A
// CropResize maps output pixel (y, x) (center (y + 0.5, x + 0.5)) to the source point
// (top + (y + 0.5) * scale_y, left + (x' + 0.5) * scale_x), x' = x, or out_width - 1 - x when
// flipped; so a crop box (left, top, w, h) resized to (out_w, out_h) has scale_x = w / out_w.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/philox.h"

namespace strata::io {

// Per-channel mean and standard deviation of ImageNet (RGB, after scaling pixels to [0, 1]).
inline constexpr float kImageNetMean[3] = {0.485f, 0.456f, 0.406f};
inline constexpr float kImageNetStd[3] = {0.229f, 0.224f, 0.225f};

// The most pixels an image may announce (2^28: 16384 x 16384; 768 MiB decoded): a corrupt header
// cannot make the loader allocate and decode gigabytes.
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 28;

struct RgbImage {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> pixels;  // (height, width, 3): R, G, B interleaved, row-major
};

enum class ImageFormat { kJpeg, kPng, kBmp, kPnm, kGif, kTiff, kWebp, kUnknown };
// The format of an encoded image, told by its first bytes (never by a file name).
ImageFormat sniff_image_format(const uint8_t* bytes, size_t size);
const char* image_format_name(ImageFormat format);  // "JPEG", "PNG", ...

// Decodes a JPEG (baseline or progressive), PNG, BMP or binary PPM/PGM to 8-bit RGB with
// stb_image: grey is replicated, alpha is dropped, 16-bit samples are reduced to 8. The chunks of
// a PNG are checked first (order, length, CRC-32, a final IEND), which stb_image does not do.
// Throws strata::Error naming `name`, the format and the reason: the decoder's, or the byte
// offset and what was expected there.
// The width x height an encoded image's header announces (0 when it cannot be read or fails
// the checks decode_image makes before decoding).
int64_t announced_pixels(const uint8_t* bytes, size_t size);
RgbImage decode_image(const uint8_t* bytes, size_t size, const std::string& name);
// Reads the file `path` whole and decodes it; errors name the file.
RgbImage read_image(const std::string& path);

struct CropResize {
  double left = 0.0;     // source x of the output's left edge
  double top = 0.0;      // source y of the output's top edge
  double scale_x = 1.0;  // source pixels per output pixel, > 0
  double scale_y = 1.0;
  bool flip = false;  // mirror the output left-right
};

// Evaluation: the shorter side resized to `resize` (the longer to floor(resize * long / short)),
// then the centered `size` x `size` window (offset round((resized - size) / 2), halves to even), as
// torchvision's Resize(resize) + CenterCrop(size). Needs resize >= size.
CropResize resize_center_crop(int64_t width, int64_t height, int64_t resize, int64_t size);

// Training: torchvision's RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)) and
// RandomHorizontalFlip(0.5). Up to 10 tries draw an area fraction uniform in [0.08, 1] and a
// log-uniform aspect ratio; the first box that fits is placed uniformly at random (integer
// offsets); if none fits, the largest centered box of a clamped ratio. Then one draw for the flip.
// Everything comes from `rng`, so the crop is a function of its key and subsequence.
CropResize random_resized_crop(int64_t width, int64_t height, int64_t size, PhiloxStream& rng);

// Resamples `image` through `crop` into (3, out_height, out_width) f32 at `out`, normalized per
// channel: (v / 255 - mean[c]) / stddev[c]. The filter is Pillow's antialiased BILINEAR: a
// triangle whose half-width is max(1, scale) source pixels, so downscaling averages every pixel
// it covers; taps outside the image are dropped and the weights of each output pixel renormalized
// (edges are clamped). Separable, vertical pass first, in f32 without intermediate rounding.
void resample_normalized(const RgbImage& image, const CropResize& crop, int64_t out_width,
                         int64_t out_height, const float mean[3], const float stddev[3],
                         float* out);

}  // namespace strata::io
