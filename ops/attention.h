// Multi-head scaled dot-product attention.
//
//   scores = scale * q k^T              (B, H, T, S)
//   scores[t, s] = -inf where masked    causal: s > t (+ (S - T) when S > T, so the last query
//                                       sees every key); padding: key_padding_mask[b, s] == 0
//   probs  = softmax(scores) over s     rows with every key masked give probs = 0 (not NaN)
//   out    = probs v                    (B, H, T, D)
//
// The CPU reference materializes probs and keeps them for backward; the CUDA kernel (fused,
// flash-attention style) recomputes them instead.
#pragma once

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

struct AttentionOptions {
  bool causal = false;
  double scale = 0.0;  // 0: 1 / sqrt(D)
};

struct AttentionResult {
  Tensor out;    // (B, H, T, D)
  Tensor probs;  // (B, H, T, S), saved for backward
};

struct AttentionGrads {
  Tensor dq, dk, dv;
};

// q: (B, H, T, D); k, v: (B, H, S, D) with T, S, D > 0; key_padding_mask: (B, S) u8/i32/i64,
// nonzero = attend, or undefined. f32 or f64; contiguous.
AttentionResult attention_forward(ExecContext& ctx, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& key_padding_mask,
                                  const AttentionOptions& options);
// dq, dk, dv are new tensors shaped like q, k, v. probs is forward's; the masks need not be
// given again (probs are 0 wherever a key was masked), but options.scale must match forward's.
AttentionGrads attention_backward(ExecContext& ctx, const Tensor& dout, const Tensor& q,
                                  const Tensor& k, const Tensor& v, const Tensor& probs,
                                  const AttentionOptions& options);

namespace cpu {
AttentionResult attention_forward(ExecContext& ctx, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& key_padding_mask,
                                  const AttentionOptions& options);
AttentionGrads attention_backward(ExecContext& ctx, const Tensor& dout, const Tensor& q,
                                  const Tensor& k, const Tensor& v, const Tensor& probs,
                                  const AttentionOptions& options);
}  // namespace cpu
}  // namespace strata::ops
