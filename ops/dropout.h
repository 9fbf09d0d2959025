// Inverted dropout with Philox masks that do not depend on how the batch is split.
//
// x is (B, ...): sample b of the call is global sample rng.sample_offset + b. Element e of that
// sample (row-major within the sample) is kept when
//   philox_uniform(philox4x32_10({e / 4, 0, sample, step}, philox_key(seed, stream)).v[e % 4]) >= p
// and kept elements are scaled by 1 / (1 - p). The same formula is used by the CUDA kernel, so
// masks are identical on every device and under every micro-batch split.
#pragma once

#include "engine/exec_context.h"
#include "engine/tape.h"
#include "engine/tensor.h"

namespace strata::ops {

struct DropoutResult {
  Tensor y;     // like x
  Tensor mask;  // like x, u8: 1 kept, 0 dropped
};

// 0 <= p < 1. p == 0 returns y = x (same storage) and an undefined mask.
DropoutResult dropout_forward(ExecContext& ctx, const Tensor& x, double p, const RngOffsets& rng);
// dx = dy * mask / (1 - p); with an undefined mask (p == 0) dx = dy.
Tensor dropout_backward(ExecContext& ctx, const Tensor& dy, const Tensor& mask, double p);

namespace cpu {
DropoutResult dropout_forward(ExecContext& ctx, const Tensor& x, double p, const RngOffsets& rng);
Tensor dropout_backward(ExecContext& ctx, const Tensor& dy, const Tensor& mask, double p);
}  // namespace cpu
}  // namespace strata::ops
