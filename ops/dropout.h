// Inverted dropout with Philox masks that do not depend on how the batch is split.
//
// x is (B, ...): sample b of the call is global sample n = rng.sample_offset + b. Element e of that
// sample (row-major index within the sample) takes lane e % 4 of one Philox4x32-10 block:
//   key     = philox_key(rng.seed, rng.stream)
//   counter = {lo32(e / 4), hi32(e / 4), lo32(n), lo32(rng.step)}
//   bits    = philox4x32_10(counter, key).v[e % 4]
// where lo32/hi32 are the low and high 32-bit halves of the 64-bit value (hi32(e / 4) is 0 for
// samples under 2^34 elements; the sample index and the step wrap after 2^32). The element is kept
// when philox_uniform(bits) >= p, compared exactly in double (equivalently, as integers:
// (bits >> 8) >= ceil(p * 2^24)), and kept elements are scaled by 1 / (1 - p). The same formula is
// used by the CUDA kernel, so masks are identical on every device and under every micro-batch or
// data-parallel split.
#pragma once

#include "engine/exec_context.h"
#include "engine/tape.h"
#include "engine/tensor.h"

namespace strata::ops {

struct DropoutResult {
  Tensor y;     // like x
  Tensor mask;  // like x, u8: 1 kept, 0 dropped
};

// x: (B, ...) f32 or f64, contiguous. 0 <= p < 1. p == 0 returns y = x (same storage) and an
// undefined mask.
DropoutResult dropout_forward(ExecContext& ctx, const Tensor& x, double p, const RngOffsets& rng);
// dx = dy * mask / (1 - p), a new tensor; with an undefined mask (p == 0) dx is dy itself (same
// storage), mirroring forward.
Tensor dropout_backward(ExecContext& ctx, const Tensor& dy, const Tensor& mask, double p);

namespace cpu {
DropoutResult dropout_forward(ExecContext& ctx, const Tensor& x, double p, const RngOffsets& rng);
Tensor dropout_backward(ExecContext& ctx, const Tensor& dy, const Tensor& mask, double p);
}  // namespace cpu
// CUDA kernels: f32, bf16 and f16; the masks are bit-identical to the CPU's.
namespace cuda {
DropoutResult dropout_forward(ExecContext& ctx, const Tensor& x, double p, const RngOffsets& rng);
Tensor dropout_backward(ExecContext& ctx, const Tensor& dy, const Tensor& mask, double p);
}  // namespace cuda
}  // namespace strata::ops
