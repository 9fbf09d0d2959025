// Device-independent parts of conv2d: the output-size rule shared by every backend.
#include "ops/conv2d.h"

#include "engine/check.h"

namespace strata::ops {

int64_t conv2d_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                           int64_t dilation) {
  STRATA_CHECK(in >= 1 && kernel >= 1 && stride >= 1 && pad >= 0 && dilation >= 1)
      << "conv2d_output_size: need in >= 1, kernel >= 1, stride >= 1, pad >= 0, dilation >= 1; "
      << "got in " << in << ", kernel " << kernel << ", stride " << stride << ", pad " << pad
      << ", dilation " << dilation;
  const int64_t span = dilation * (kernel - 1) + 1;
  STRATA_CHECK_LE(span, in + 2 * pad)
      << "conv2d_output_size: the kernel (" << kernel << " taps, dilation " << dilation
      << ") spans " << span << " cells, more than the padded input (" << in << " + 2 x " << pad
      << ")";
  return (in + 2 * pad - span) / stride + 1;
}

}  // namespace strata::ops
