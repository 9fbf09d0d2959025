// GpuStress in a build without CUDA: there is no GPU to load (engine/gpu_stress.h).
#include "engine/check.h"
#include "engine/gpu_stress.h"

namespace strata::cuda {

struct GpuStress::State {};

GpuStress::GpuStress(const Options& options) {
  STRATA_THROW() << "GPU stress on cuda:" << options.device
                 << ": this build of Strata has no CUDA support (configure with "
                    "-DSTRATA_WITH_CUDA=ON on a machine with the CUDA toolkit)";
}
GpuStress::~GpuStress() = default;
void GpuStress::stop() {}
int64_t GpuStress::kernels() const { return 0; }
const char* GpuStress::error() const { return ""; }

}  // namespace strata::cuda
