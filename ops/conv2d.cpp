// PLACEHOLDER: replaced by the real code.
#include "ops/conv2d.h"
#include "engine/check.h"

namespace strata::ops {

int64_t conv2d_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops
