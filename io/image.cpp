// Decoding with stb_image and resampling with Pillow's antialiased bilinear filter.
//
// Decoding. stb_image (libstb-dev) is compiled here, and only here, with its functions static
// (no stbi_ symbols leave this file, so a program that links libstrata.a may compile its own
// copy) and only the loaders of the formats an image folder may hold. It decodes from memory: the
// file is read whole first, so an I/O error and a decoding error are told apart, and failure
// reasons are thread-local in this stb_image version, so loader threads may decode at once. stb
// rejects a truncated JPEG or PNG (verified for every cut of test images), but it skips PNG CRCs,
// so a flipped bit inside a PNG chunk could decode into wrong pixels: the chunk walk below checks
// every CRC-32 (zlib's crc32) first, and reports the byte offset of what it finds wrong.
//
// Resampling. Each output pixel of one axis gets its taps once (Pillow's precompute_coeffs: a
// triangle of half-width max(1, scale) around the mapped center, clipped to the image, weights
// renormalized to sum 1, computed in double and stored in f32). A pass over the output rows then
// blends the rows of its vertical taps into one f32 row of the needed source columns, and blends
// that horizontally into the three output planes, folding in /255, -mean and /stddev as one
// multiply-add. Nothing is rounded to 8 bits between the passes (Pillow rounds; the difference is
// below 1/255 of the range).
#include "io/image.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>

#include "engine/check.h"

#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#define STBI_NO_STDIO
#define STBI_ONLY_JPEG
#define STBI_ONLY_PNG
#define STBI_ONLY_BMP
#define STBI_ONLY_PNM
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb/stb_image.h>
#pragma GCC diagnostic pop

namespace strata::io {
namespace {

std::string hex_bytes(const uint8_t* bytes, size_t count) {
  static const char kDigits[] = "0123456789ABCDEF";
  std::string s;
  for (size_t i = 0; i < count; ++i) {
    if (i > 0) s += ' ';
    s += kDigits[bytes[i] >> 4];
    s += kDigits[bytes[i] & 15];
  }
  return s;
}

uint32_t read_be32(const uint8_t* p) {
  return (static_cast<uint32_t>(p[0]) << 24) | (static_cast<uint32_t>(p[1]) << 16) |
         (static_cast<uint32_t>(p[2]) << 8) | static_cast<uint32_t>(p[3]);
}

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

// Walks the chunks of a PNG: IHDR first, every chunk whole and with a matching CRC-32, an IEND.
void check_png_chunks(const uint8_t* bytes, size_t size, const std::string& name) {
  const std::string where = "image: " + name + ": PNG: ";
  size_t pos = sizeof(kPngSignature);
  std::string previous = "the signature";
  for (bool first = true;; first = false) {
    if (size - pos < 8) {
      STRATA_THROW() << where << "truncated: expected a chunk header (length, type) at byte " << pos
                     << " after " << previous << ", the file ends at byte " << size
                     << " without an IEND chunk";
    }
    const uint32_t length = read_be32(bytes + pos);
    const std::string type(reinterpret_cast<const char*>(bytes + pos + 4), 4);
    if (length > 0x7FFFFFFFu) {
      STRATA_THROW() << where << "corrupt: the chunk at byte " << pos << " declares " << length
                     << " bytes, more than the 2^31 - 1 a PNG chunk may hold";
    }
    if (first && type != "IHDR") {
      STRATA_THROW() << where << "corrupt: expected the IHDR chunk at byte " << pos << ", found "
                     << hex_bytes(bytes + pos + 4, 4);
    }
    if (size - pos - 8 < static_cast<size_t>(length) + 4) {
      STRATA_THROW() << where << "truncated: chunk " << type << " at byte " << pos << " needs "
                     << 12 + static_cast<size_t>(length) << " bytes (to byte " << pos + 12 + length
                     << "), the file ends at byte " << size;
    }
    const uint32_t stored = read_be32(bytes + pos + 8 + length);
    const uint32_t computed = static_cast<uint32_t>(
        crc32(crc32(0L, Z_NULL, 0), bytes + pos + 4, static_cast<uInt>(length) + 4));
    if (stored != computed) {
      std::ostringstream s;
      s << std::hex << std::uppercase << "stored 0x" << stored << ", computed 0x" << computed;
      STRATA_THROW() << where << "corrupt: CRC-32 mismatch in chunk " << type << " at byte " << pos
                     << " (" << s.str() << ")";
    }
    if (type == "IEND") return;
    previous = "chunk " + type + " at byte " + std::to_string(pos);
    pos += 12 + static_cast<size_t>(length);
  }
}

// Taps of one output axis: output k blends source pixels first[k] .. first[k] + count[k] - 1
// with weights[k * width + t].
struct AxisTaps {
  std::vector<int64_t> first;
  std::vector<int64_t> count;
  std::vector<float> weights;
  int64_t width = 0;  // taps per output pixel, at most
  int64_t lo = 0;     // the source range all taps fall in: [lo, hi)
  int64_t hi = 0;
};

AxisTaps axis_taps(int64_t in_size, int64_t out_size, double begin, double scale) {
  const double support = std::max(scale, 1.0);  // half-width of the triangle, source pixels
  AxisTaps taps;
  taps.width = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  taps.first.resize(static_cast<size_t>(out_size));
  taps.count.resize(static_cast<size_t>(out_size));
  taps.weights.assign(static_cast<size_t>(out_size * taps.width), 0.0f);
  taps.lo = in_size;
  taps.hi = 0;
  std::vector<double> w(static_cast<size_t>(taps.width));
  for (int64_t k = 0; k < out_size; ++k) {
    const double center = begin + (static_cast<double>(k) + 0.5) * scale;
    int64_t lo = std::max<int64_t>(static_cast<int64_t>(std::floor(center - support + 0.5)), 0);
    int64_t hi =
        std::min<int64_t>(static_cast<int64_t>(std::floor(center + support + 0.5)), in_size);
    hi = std::min(hi, lo + taps.width);
    double total = 0.0;
    for (int64_t j = lo; j < hi; ++j) {
      const double x = std::fabs((static_cast<double>(j) + 0.5 - center) / support);
      w[static_cast<size_t>(j - lo)] = x < 1.0 ? 1.0 - x : 0.0;
      total += w[static_cast<size_t>(j - lo)];
    }
    if (!(total > 0.0)) {  // the center lies outside the image: clamp to the nearest pixel
      lo = std::min<int64_t>(std::max<int64_t>(static_cast<int64_t>(std::floor(center)), 0),
                             in_size - 1);
      hi = lo + 1;
      w[0] = 1.0;
      total = 1.0;
    }
    taps.first[static_cast<size_t>(k)] = lo;
    taps.count[static_cast<size_t>(k)] = hi - lo;
    for (int64_t j = lo; j < hi; ++j) {
      taps.weights[static_cast<size_t>(k * taps.width + j - lo)] =
          static_cast<float>(w[static_cast<size_t>(j - lo)] / total);
    }
    taps.lo = std::min(taps.lo, lo);
    taps.hi = std::max(taps.hi, hi);
  }
  return taps;
}

// The Huffman tables of a JPEG (DHT segments, before and between scans) may define at most 256
// codes: stb_image trusts the 16 code counts and writes past its tables when they add up to more
// (found by the image fuzzer). Anything else, truncation included, is left to stb_image, whose
// message names the problem.
void check_jpeg_huffman_tables(const uint8_t* bytes, size_t size, const std::string& name) {
  auto restart = [](uint8_t m) { return m >= 0xD0 && m <= 0xD7; };
  size_t pos = 2;  // after SOI
  while (pos < size) {
    // Like stb_image: skip to the next 0xFF, then over fill bytes, to the marker.
    if (bytes[pos] != 0xFF) {
      ++pos;
      continue;
    }
    while (pos < size && bytes[pos] == 0xFF) ++pos;
    if (pos >= size) return;
    const uint8_t marker = bytes[pos++];
    if (marker == 0xD8 || marker == 0x01 || restart(marker)) continue;  // no length
    if (marker == 0xD9 || marker == 0x00 || pos + 2 > size) return;     // end, or stb fails
    const size_t length = (static_cast<size_t>(bytes[pos]) << 8) | bytes[pos + 1];
    if (marker == 0xC4) {
      // Count bytes past the end of the file read as zeros in stb_image: so here.
      for (size_t q = pos + 2; q < pos + length && q < size;) {
        size_t codes = 0;
        for (size_t i = q + 1; i < q + 17 && i < size; ++i) codes += bytes[i];
        STRATA_CHECK(codes <= 256)
            << "image: " << name << ": JPEG: the Huffman table at byte " << q << " defines "
            << codes << " codes (at most 256): the file is corrupt";
        q += 17 + codes;
      }
    }
    if (length < 2) return;
    pos += length;
    if (marker != 0xDA) continue;
    // Entropy-coded data: 0xFF (after fill bytes) then 0x00 is a data byte, RSTn stays in the
    // data; any other marker ends it.
    while (pos < size) {
      if (bytes[pos] != 0xFF) {
        ++pos;
        continue;
      }
      size_t next = pos;
      while (next < size && bytes[next] == 0xFF) ++next;
      if (next >= size) return;
      if (bytes[next] == 0x00 || restart(bytes[next])) {
        pos = next + 1;
        continue;
      }
      pos = next - 1;  // the last 0xFF before the marker
      break;
    }
  }
}

// A binary PPM/PGM's header (magic, width, height, maxval, each after white space or # comments,
// then one white-space byte) must be followed by all the pixels it announces: stb_image reads a
// 16-bit PNM's samples without checking that they are there.
void check_pnm_size(const uint8_t* bytes, size_t size, const std::string& name) {
  size_t pos = 2;
  int64_t fields[3] = {0, 0, 0};  // width, height, maxval
  const char* const kField[3] = {"width", "height", "maxval"};
  for (int f = 0; f < 3; ++f) {
    for (;;) {
      while (pos < size && std::isspace(bytes[pos])) ++pos;
      if (pos < size && bytes[pos] == '#') {
        while (pos < size && bytes[pos] != '\n' && bytes[pos] != '\r') ++pos;
        continue;
      }
      break;
    }
    const size_t start = pos;
    while (pos < size && std::isdigit(bytes[pos]) && fields[f] <= 1000000000) {
      fields[f] = fields[f] * 10 + (bytes[pos] - '0');
      ++pos;
    }
    STRATA_CHECK(pos > start && fields[f] > 0 && fields[f] <= 1000000000)
        << "image: " << name << ": PNM header: expected the " << kField[f]
        << " (a positive number) at byte " << start;
  }
  // stb_image's 16-bit PNM path converts to RGB past its buffer: 8-bit samples only.
  STRATA_CHECK(fields[2] <= 255) << "image: " << name << ": PNM maxval " << fields[2]
                                 << ": 16-bit PPM/PGM (maxval over 255) is not supported; convert "
                                    "the file to 8 bits";
  STRATA_CHECK(pos < size && std::isspace(bytes[pos]))
      << "image: " << name << ": PNM header: expected one white-space byte after the maxval";
  const int64_t channels = bytes[1] == '6' ? 3 : 1;
  const int64_t needed = fields[0] * fields[1] * channels;
  const int64_t have = static_cast<int64_t>(size - pos - 1);
  STRATA_CHECK(have >= needed) << "image: " << name << ": PNM of " << fields[0] << "x" << fields[1]
                               << " needs " << needed << " bytes of pixels, the file has " << have
                               << ": it is truncated";
}

}  // namespace

ImageFormat sniff_image_format(const uint8_t* bytes, size_t size) {
  auto starts = [&](const char* magic, size_t n) {
    return size >= n && std::memcmp(bytes, magic, n) == 0;
  };
  if (size >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) {
    return ImageFormat::kJpeg;
  }
  if (size >= 8 && std::memcmp(bytes, kPngSignature, 8) == 0) return ImageFormat::kPng;
  if (starts("BM", 2)) return ImageFormat::kBmp;
  if (size >= 2 && bytes[0] == 'P' && bytes[1] >= '1' && bytes[1] <= '6') return ImageFormat::kPnm;
  if (starts("GIF8", 4)) return ImageFormat::kGif;
  if (starts("II*\0", 4) || starts("MM\0*", 4)) return ImageFormat::kTiff;
  if (size >= 12 && starts("RIFF", 4) && std::memcmp(bytes + 8, "WEBP", 4) == 0) {
    return ImageFormat::kWebp;
  }
  return ImageFormat::kUnknown;
}

const char* image_format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kBmp:
      return "BMP";
    case ImageFormat::kPnm:
      return "PPM/PGM";
    case ImageFormat::kGif:
      return "GIF";
    case ImageFormat::kTiff:
      return "TIFF";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kUnknown:
      break;
  }
  return "unknown";
}

namespace {

// The checks that run before stb_image sees the bytes (throws naming the file).
ImageFormat check_encoded(const uint8_t* bytes, size_t size, const std::string& name) {
  const ImageFormat format = sniff_image_format(bytes, size);
  const std::string where = "image: " + name + ": ";
  switch (format) {
    case ImageFormat::kUnknown:
      STRATA_THROW() << where << "not an image: expected the signature of a JPEG (FF D8 FF), PNG, "
                     << "BMP or PPM/PGM at byte 0, found "
                     << (size == 0 ? std::string("an empty file")
                                   : hex_bytes(bytes, std::min<size_t>(size, 8)));
    case ImageFormat::kGif:
    case ImageFormat::kTiff:
    case ImageFormat::kWebp:
      STRATA_THROW() << where << image_format_name(format) << " images are not supported "
                     << "(JPEG, PNG, BMP, binary PPM/PGM are): convert the file";
    case ImageFormat::kPnm:
      if (bytes[1] != '5' && bytes[1] != '6') {
        STRATA_THROW() << where << "PNM type P" << bytes[1] << " is not supported: only binary "
                       << "P5 (PGM) and P6 (PPM) are; convert the file";
      }
      check_pnm_size(bytes, size, name);
      break;
    case ImageFormat::kPng:
      check_png_chunks(bytes, size, name);
      break;
    case ImageFormat::kJpeg:
      check_jpeg_huffman_tables(bytes, size, name);
      break;
    default:
      break;
  }
  return format;
}

}  // namespace

int64_t announced_pixels(const uint8_t* bytes, size_t size) {
  try {
    check_encoded(bytes, size, "");  // stb_image's header parser trusts what these check
  } catch (const Error&) {
    return 0;
  }
  int width = 0, height = 0, channels = 0;
  if (size > static_cast<size_t>(INT32_MAX) ||
      stbi_info_from_memory(bytes, static_cast<int>(size), &width, &height, &channels) == 0) {
    return 0;
  }
  return static_cast<int64_t>(width) * height;
}

RgbImage decode_image(const uint8_t* bytes, size_t size, const std::string& name) {
  const ImageFormat format = check_encoded(bytes, size, name);
  const std::string where = "image: " + name + ": ";
  STRATA_CHECK(size <= static_cast<size_t>(INT32_MAX))
      << where << size << " bytes: larger than the 2 GiB stb_image can decode";
  int width = 0, height = 0, channels = 0;
  // A few hundred corrupt bytes can announce hundreds of megapixels: refuse before decoding.
  if (stbi_info_from_memory(bytes, static_cast<int>(size), &width, &height, &channels) != 0) {
    STRATA_CHECK(static_cast<int64_t>(width) * height <= kMaxImagePixels)
        << where << image_format_name(format) << " of " << width << "x" << height
        << " pixels: more than the " << kMaxImagePixels << " pixels an image may have";
  }
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(
      stbi_load_from_memory(bytes, static_cast<int>(size), &width, &height, &channels, 3),
      &stbi_image_free);
  if (pixels == nullptr) {
    const char* reason = stbi_failure_reason();
    STRATA_THROW() << where << "cannot decode " << image_format_name(format) << " (" << size
                   << " bytes): stb_image: "
                   << (reason != nullptr && reason[0] != '\0' ? reason : "unknown error")
                   << "; the file is truncated or corrupt";
  }
  STRATA_CHECK(width > 0 && height > 0)
      << where << image_format_name(format) << " of " << width << "x" << height
      << " pixels: an image needs at least one; the file is corrupt";
  RgbImage image;
  image.width = width;
  image.height = height;
  const size_t n = static_cast<size_t>(width) * static_cast<size_t>(height) * 3;
  image.pixels.assign(pixels.get(), pixels.get() + n);
  return image;
}

RgbImage read_image(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    STRATA_THROW() << "image: cannot open '" << path << "': " << std::strerror(err);
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(f, &std::fclose);
  struct stat st;
  const size_t expected = ::fstat(fileno(f), &st) == 0 ? static_cast<size_t>(st.st_size) : 0;
  // One byte more than fstat says, so that a complete read ends short of the buffer.
  std::vector<uint8_t> bytes(expected + 1);
  size_t got = 0;
  for (;;) {
    got += std::fread(bytes.data() + got, 1, bytes.size() - got, f);
    if (got < bytes.size()) break;
    bytes.resize(bytes.size() * 2);  // the file grew since fstat
  }
  if (std::ferror(f)) {
    const int err = errno;
    STRATA_THROW() << "image: error reading '" << path << "' at byte " << got << ": "
                   << std::strerror(err);
  }
  bytes.resize(got);
  return decode_image(bytes.data(), bytes.size(), path);
}

CropResize resize_center_crop(int64_t width, int64_t height, int64_t resize, int64_t size) {
  STRATA_CHECK(width > 0 && height > 0)
      << "resize_center_crop: empty image " << width << "x" << height;
  STRATA_CHECK(size > 0 && resize >= size) << "resize_center_crop: the resized shorter side "
                                           << resize << " must be at least the crop size " << size;
  const int64_t shorter = std::min(width, height);
  const int64_t longer = std::max(width, height);
  const int64_t resized_long = resize * longer / shorter;
  const int64_t resized_w = width <= height ? resize : resized_long;
  const int64_t resized_h = width <= height ? resized_long : resize;
  CropResize crop;
  crop.scale_x = static_cast<double>(width) / static_cast<double>(resized_w);
  crop.scale_y = static_cast<double>(height) / static_cast<double>(resized_h);
  // Python's round(): halves to even (nearbyint in the default rounding mode).
  crop.left = std::nearbyint(static_cast<double>(resized_w - size) / 2.0) * crop.scale_x;
  crop.top = std::nearbyint(static_cast<double>(resized_h - size) / 2.0) * crop.scale_y;
  return crop;
}

CropResize random_resized_crop(int64_t width, int64_t height, int64_t size, PhiloxStream& rng) {
  STRATA_CHECK(width > 0 && height > 0 && size > 0)
      << "random_resized_crop: empty image " << width << "x" << height << " or size " << size;
  constexpr double kMinScale = 0.08, kMaxScale = 1.0;
  const double log_min_ratio = std::log(3.0 / 4.0), log_max_ratio = std::log(4.0 / 3.0);
  const double area = static_cast<double>(width) * static_cast<double>(height);
  int64_t w = 0, h = 0, x = 0, y = 0;
  bool found = false;
  for (int attempt = 0; attempt < 10 && !found; ++attempt) {
    const double target = area * (kMinScale + (kMaxScale - kMinScale) * rng.next_uniform());
    const double ratio =
        std::exp(log_min_ratio + (log_max_ratio - log_min_ratio) * rng.next_uniform());
    w = std::llround(std::sqrt(target * ratio));
    h = std::llround(std::sqrt(target / ratio));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      y = static_cast<int64_t>(rng.next_below(static_cast<uint64_t>(height - h + 1)));
      x = static_cast<int64_t>(rng.next_below(static_cast<uint64_t>(width - w + 1)));
      found = true;
    }
  }
  if (!found) {  // torchvision's fallback: a centered box of the nearest allowed ratio
    const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
    w = width;
    h = height;
    if (in_ratio < 3.0 / 4.0) {
      h = std::llround(static_cast<double>(width) / (3.0 / 4.0));
    } else if (in_ratio > 4.0 / 3.0) {
      w = std::llround(static_cast<double>(height) * (4.0 / 3.0));
    }
    y = (height - h) / 2;
    x = (width - w) / 2;
  }
  CropResize crop;
  crop.left = static_cast<double>(x);
  crop.top = static_cast<double>(y);
  crop.scale_x = static_cast<double>(w) / static_cast<double>(size);
  crop.scale_y = static_cast<double>(h) / static_cast<double>(size);
  crop.flip = rng.next_below(2) == 1;
  return crop;
}

void resample_normalized(const RgbImage& image, const CropResize& crop, int64_t out_width,
                         int64_t out_height, const float mean[3], const float stddev[3],
                         float* out) {
  STRATA_CHECK(image.width > 0 && image.height > 0 &&
               image.pixels.size() == static_cast<size_t>(image.width * image.height * 3))
      << "resample_normalized: image of " << image.width << "x" << image.height << " with "
      << image.pixels.size() << " bytes (expected width * height * 3)";
  STRATA_CHECK(out_width > 0 && out_height > 0 && crop.scale_x > 0.0 && crop.scale_y > 0.0)
      << "resample_normalized: output " << out_width << "x" << out_height << ", scale "
      << crop.scale_x << "x" << crop.scale_y << " (expected positive)";
  const AxisTaps ty = axis_taps(image.height, out_height, crop.top, crop.scale_y);
  const AxisTaps tx = axis_taps(image.width, out_width, crop.left, crop.scale_x);
  const int64_t span = (tx.hi - tx.lo) * 3;  // source columns any output pixel reads, x RGB
  std::vector<float> row(static_cast<size_t>(span));
  float gain[3], shift[3];  // v * gain - shift == (v / 255 - mean) / stddev
  for (int c = 0; c < 3; ++c) {
    gain[c] = 1.0f / (255.0f * stddev[c]);
    shift[c] = mean[c] / stddev[c];
  }
  const int64_t plane = out_width * out_height;
  for (int64_t y = 0; y < out_height; ++y) {
    // Vertical: the blended source row, columns [tx.lo, tx.hi), RGB interleaved.
    std::fill(row.begin(), row.end(), 0.0f);
    const size_t yk = static_cast<size_t>(y);
    for (int64_t t = 0; t < ty.count[yk]; ++t) {
      const float w = ty.weights[static_cast<size_t>(y * ty.width + t)];
      const uint8_t* src = image.pixels.data() + ((ty.first[yk] + t) * image.width + tx.lo) * 3;
      float* r = row.data();
      for (int64_t n = 0; n < span; ++n) r[n] += w * static_cast<float>(src[n]);
    }
    // Horizontal, then normalization, into the three planes.
    for (int64_t x = 0; x < out_width; ++x) {
      const int64_t k = crop.flip ? out_width - 1 - x : x;
      const size_t kk = static_cast<size_t>(k);
      const float* wk = tx.weights.data() + k * tx.width;
      const float* src = row.data() + (tx.first[kk] - tx.lo) * 3;
      float acc[3] = {0.0f, 0.0f, 0.0f};
      for (int64_t t = 0; t < tx.count[kk]; ++t) {
        acc[0] += wk[t] * src[3 * t];
        acc[1] += wk[t] * src[3 * t + 1];
        acc[2] += wk[t] * src[3 * t + 2];
      }
      for (int c = 0; c < 3; ++c) out[c * plane + y * out_width + x] = acc[c] * gain[c] - shift[c];
    }
  }
}

}  // namespace strata::io
