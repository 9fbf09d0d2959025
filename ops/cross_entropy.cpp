// Device-independent parts of cross-entropy: counting the targets a loss is averaged over (on
// the host; targets on a CUDA device are copied to the host first).
#include "ops/cross_entropy.h"

#include "ops/cpu_util.h"

namespace strata::ops {

int64_t count_targets(const Tensor& targets, int64_t ignore_index) {
  STRATA_CHECK(targets.defined()) << "count_targets: targets is undefined";
  // Targets on a device are copied to the host first (this waits for the device); they are small.
  const Tensor host =
      targets.device().is_cpu() ? targets : to_allocator(targets, default_cpu_allocator());
  detail::check_index(host, "count_targets", "targets");
  int64_t count = 0;
  for (int64_t i = 0; i < host.numel(); ++i) {
    if (detail::index_at(host, i) != ignore_index) ++count;
  }
  return count;
}

}  // namespace strata::ops
