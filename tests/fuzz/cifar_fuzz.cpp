// CIFAR-10 binary batches (io/cifar.h): one file as the whole training split, with augmentation;
// an accepted file yields samples whose labels are classes and whose pixels are finite. The same
// bytes also go through the batches.meta.txt reader.
#include <cmath>
#include <vector>

#include "engine/check.h"
#include "fuzz/fuzz_util.h"
#include "io/cifar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  const std::string path = fuzz::scratch().write("data_batch_1.bin", fuzz::as_text(data, size));
  try {
    io::Cifar10Dataset dataset("fuzz", {path}, io::cifar10_default_class_names(),
                               io::CifarOptions{true, size});
    FUZZ_CHECK(dataset.size() * io::kCifarRecordBytes == static_cast<int64_t>(size));
    std::vector<float> input(3 * io::kCifarSide * io::kCifarSide);
    for (int64_t i = 0; i < dataset.size() && i < 4; ++i) {
      int64_t target = -1;
      dataset.get_in_epoch(i, i, input.data(), &target);
      FUZZ_CHECK(target >= 0 && target < io::kCifar10Classes);
      for (float v : input) FUZZ_CHECK(std::isfinite(v));
    }
  } catch (const Error&) {
  }
  try {
    const std::vector<std::string> names = io::read_cifar10_class_names(path);
    FUZZ_CHECK(names.size() == static_cast<size_t>(io::kCifar10Classes));
  } catch (const Error&) {
  }
  return 0;
}
