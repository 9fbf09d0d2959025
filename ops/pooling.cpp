// Device-independent parts of pooling: the output-size rule shared by every backend.
#include "ops/pooling.h"

#include "engine/check.h"

namespace strata::ops {

int64_t pool2d_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                           bool ceil_mode) {
  STRATA_CHECK(in >= 1 && kernel >= 1 && stride >= 1 && pad >= 0)
      << "pool2d_output_size: need in >= 1, kernel >= 1, stride >= 1 and pad >= 0; got in " << in
      << ", kernel " << kernel << ", stride " << stride << ", pad " << pad;
  STRATA_CHECK_LE(2 * pad, kernel)
      << "pool2d_output_size: padding " << pad << " is more than half the kernel " << kernel;
  STRATA_CHECK_LE(kernel, in + 2 * pad)
      << "pool2d_output_size: kernel " << kernel << " is larger than the padded input (" << in
      << " + 2 x " << pad << ")";
  const int64_t span = in + 2 * pad - kernel;  // >= 0
  int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  // PyTorch: with ceil_mode, the last window must start inside the input or its left padding.
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

}  // namespace strata::ops
