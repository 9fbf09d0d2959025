// Device-independent parts of the data-movement ops: the inverse of a permutation (what the
// backward of permute_copy permutes by).
#include "ops/shape_ops.h"

#include "engine/check.h"

namespace strata::ops {

std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& dims) {
  const int64_t n = static_cast<int64_t>(dims.size());
  std::vector<int64_t> inverse(dims.size(), -1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t d = dims[i] < 0 ? dims[i] + n : dims[i];
    STRATA_CHECK(d >= 0 && d < n) << "inverse_permutation: entry " << i << " is " << dims[i]
                                  << ", out of range for " << n << " dimensions";
    STRATA_CHECK_EQ(inverse[d], -1) << "inverse_permutation: dimension " << d << " repeated";
    inverse[d] = i;
  }
  return inverse;
}

}  // namespace strata::ops
