// PLACEHOLDER: replaced by the real code.
#include "ops/pooling.h"
#include "engine/check.h"

namespace strata::ops {

int64_t pool2d_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, bool ceil_mode) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops
