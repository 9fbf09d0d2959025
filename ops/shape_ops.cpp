// PLACEHOLDER: replaced by the real code.
#include "ops/shape_ops.h"
#include "engine/check.h"

namespace strata::ops {

std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& dims) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops
