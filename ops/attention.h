// Multi-head scaled dot-product attention.
//
//   scores = scale * q k^T              (B, H, T, S)
//   scores[t, s] = -inf where masked    causal: s > t (+ (S - T) when S > T, so the last query
//                                       sees every key); padding: key_padding_mask[b, s] == 0
//   probs  = softmax(scores) over s     rows with every key masked give probs = 0 (not NaN)
//   out    = probs v                    (B, H, T, D)
//   lse    = log sum_s exp(scores)      (B, H, T), -inf for rows with every key masked
//
// The CPU reference materializes probs and keeps them for backward (and fills lse too); the CUDA
// kernel (fused, flash-attention style) never writes the (T x S) scores to memory: it saves lse
// and recomputes the probabilities from q, k and lse in backward.
#pragma once

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

struct AttentionOptions {
  bool causal = false;
  double scale = 0.0;  // 0: 1 / sqrt(D)
};

// What forward returns and backward reads back ("saved"). probs is optional: the CPU fills it,
// CUDA leaves it undefined. lse is always filled: f32 (f64 for f64 inputs on the CPU).
struct AttentionResult {
  Tensor out;    // (B, H, T, D)
  Tensor probs;  // (B, H, T, S), or undefined (CUDA)
  Tensor lse;    // (B, H, T) log-sum-exp of the scaled, masked scores per query (-inf for fully
                 // masked rows), saved for backward by the fused kernel
};

struct AttentionGrads {
  Tensor dq, dk, dv;
};

// q: (B, H, T, D); k, v: (B, H, S, D) with T, S, D > 0; key_padding_mask: (B, S) u8/i32/i64,
// nonzero = attend, or undefined. Contiguous; f32 or f64 on the CPU, f32, bf16 or f16 with
// D <= 128 on CUDA.
AttentionResult attention_forward(ExecContext& ctx, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& key_padding_mask,
                                  const AttentionOptions& options);
// dq, dk, dv are new tensors shaped like q, k, v. `saved` is forward's result for the same q, k,
// v; key_padding_mask and options must be forward's too. The CPU kernel uses saved.probs when
// defined (the masks are then not needed: probs are 0 wherever a key was masked), else recomputes
// the probabilities from q, k, saved.lse and the masks. The CUDA kernel always recomputes them
// from saved.lse and needs saved.out (for rowsum(dout * out)); it ignores saved.probs.
AttentionGrads attention_backward(ExecContext& ctx, const Tensor& dout, const Tensor& q,
                                  const Tensor& k, const Tensor& v, const AttentionResult& saved,
                                  const Tensor& key_padding_mask, const AttentionOptions& options);

namespace cpu {
AttentionResult attention_forward(ExecContext& ctx, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& key_padding_mask,
                                  const AttentionOptions& options);
AttentionGrads attention_backward(ExecContext& ctx, const Tensor& dout, const Tensor& q,
                                  const Tensor& k, const Tensor& v, const AttentionResult& saved,
                                  const Tensor& key_padding_mask, const AttentionOptions& options);
}  // namespace cpu

// Fused kernels: f32, bf16 and f16 (f32 accumulation), D <= 128.
namespace cuda {
AttentionResult attention_forward(ExecContext& ctx, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& key_padding_mask,
                                  const AttentionOptions& options);
AttentionGrads attention_backward(ExecContext& ctx, const Tensor& dout, const Tensor& q,
                                  const Tensor& k, const Tensor& v, const AttentionResult& saved,
                                  const Tensor& key_padding_mask, const AttentionOptions& options);
}  // namespace cuda
}  // namespace strata::ops
