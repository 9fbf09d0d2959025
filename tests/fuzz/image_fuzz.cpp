// Image decoding (io/image.h): the format sniffing, our PNG chunk checks and stb_image's decoders;
// an accepted image has positive sides and width x height x 3 bytes, and the evaluation transform
// (resize + center crop to 8 x 8) samples it to finite values.
#include <cmath>
#include <vector>

#include "engine/check.h"
#include "fuzz/fuzz_util.h"
#include "io/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  // Inputs announcing more than a megapixel only measure the decoders' speed under the
  // sanitizers (and time out): the size limit of decode_image is tested in tests/io.
  if (io::announced_pixels(data, size) > (int64_t{1} << 20)) return 0;
  try {
    const io::RgbImage image = io::decode_image(data, size, "fuzz");
    FUZZ_CHECK(image.width > 0 && image.height > 0);
    FUZZ_CHECK(image.pixels.size() == static_cast<size_t>(image.width * image.height * 3));
    constexpr int64_t kSide = 8;
    const io::CropResize crop = io::resize_center_crop(image.width, image.height, kSide, kSide);
    std::vector<float> out(3 * kSide * kSide);
    io::resample_normalized(image, crop, kSide, kSide, io::kImageNetMean, io::kImageNetStd,
                            out.data());
    for (float v : out) FUZZ_CHECK(std::isfinite(v));
  } catch (const Error&) {
  }
  return 0;
}
