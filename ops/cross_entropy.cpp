// Device-independent parts of cross-entropy: counting the targets a loss is averaged over.
#include "ops/cross_entropy.h"

#include "ops/cpu_util.h"

namespace strata::ops {

int64_t count_targets(const Tensor& targets, int64_t ignore_index) {
  detail::check_index(targets, "count_targets", "targets");
  int64_t count = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) {
    if (detail::index_at(targets, i) != ignore_index) ++count;
  }
  return count;
}

}  // namespace strata::ops
