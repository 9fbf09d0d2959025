// The public entry of linear_gelu_forward (ops/matmul.h), routed by the context's device like the
// rows of dispatch.cpp.
#include "engine/check.h"
#include "ops/matmul.h"

namespace strata::ops {

LinearGeluResult linear_gelu_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight,
                                     const Tensor& bias) {
  switch (ctx.device().type) {
    case DeviceType::kCPU:
      return cpu::linear_gelu_forward(ctx, x, weight, bias);
    case DeviceType::kCUDA:
#ifdef STRATA_WITH_CUDA
      return cuda::linear_gelu_forward(ctx, x, weight, bias);
#else
      break;
#endif
  }
  STRATA_THROW() << "op linear_gelu_forward has no kernel for " << ctx.device().str()
                 << " in this build";
}

}  // namespace strata::ops
