// Multi-head scaled dot-product attention on the CPU: the reference the fused CUDA kernel is
// tested against. It materializes probs (B, H, T, S) and keeps them for backward.
//
// Forward, per (b, h): scores = scale q k^T (one gemm), then a masked, max-subtracted softmax per
// query row (exponentials in the input's dtype, their sum in double; lse = max + log(sum)), then
// out = probs v (one gemm). Masked keys get probability exactly 0; a row with no visible key is
// all zeros (lse -inf), so its output is zero and its gradients are zero, never NaN.
//
// Backward, with P = probs and dP = dout v^T:
//   dv = P^T dout,  dS = P (dP - rowsum(dP P)),  dq = scale dS k,  dk = scale dS^T q
// Masks need not be re-applied: P is 0 wherever a key was masked, so dS is 0 there too. Without
// saved probs (a result from the CUDA kernel), P is recomputed as exp(scale q k^T - lse) over the
// visible keys, which needs the masks.
//
// The work is split over the B H heads (detail::parallel_for): each thread runs a head's gemms
// (single-threaded inside a parallel region: OpenBLAS's OpenMP build runs one thread there) and
// its row softmaxes back to back, so a head's scores stay in cache between them. f32 rows take
// vectorized exponentials (ops/cpu_math.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/attention.h"
#include "ops/blas.h"
#include "ops/cpu_math.h"
#include "ops/cpu_util.h"

namespace strata::ops::cpu {
namespace {

constexpr const char* kForward = "attention_forward";
constexpr const char* kBackward = "attention_backward";

struct AttentionDims {
  int64_t b = 0, h = 0, t = 0, s = 0, d = 0;
  double scale = 0.0;
};

// Checks q (B, H, T, D) and k, v (B, H, S, D) and resolves the scale.
AttentionDims check_qkv(const Tensor& q, const Tensor& k, const Tensor& v,
                        const AttentionOptions& options, const char* op) {
  detail::check_float(q, op, "q");
  detail::check_float(k, op, "k");
  detail::check_float(v, op, "v");
  detail::check_same_dtype(k, q, op, "k", "q");
  detail::check_same_dtype(v, q, op, "v", "q");
  STRATA_CHECK(q.dim() == 4) << op << ": q must be (B, H, T, D), got " << q.shape_str();
  STRATA_CHECK(k.dim() == 4) << op << ": k must be (B, H, S, D), got " << k.shape_str();
  AttentionDims dims;
  dims.b = q.size(0);
  dims.h = q.size(1);
  dims.t = q.size(2);
  dims.d = q.size(3);
  dims.s = k.size(2);
  STRATA_CHECK(dims.t > 0 && dims.s > 0 && dims.d > 0)
      << op << ": T, S and D must be positive, got q " << q.shape_str() << " and k "
      << k.shape_str();
  detail::check_shape(k, {dims.b, dims.h, dims.s, dims.d}, op, "k");
  detail::check_shape(v, k.shape(), op, "v");
  STRATA_CHECK(std::isfinite(options.scale))
      << op << ": scale must be finite (0 for 1 / sqrt(D)), got " << options.scale;
  dims.scale = options.scale != 0.0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(dims.d));
  return dims;
}

// Heads per parallel chunk: enough work (~4 T S D multiply-adds) to be worth a thread.
int64_t head_grain(const AttentionDims& dims) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(dims.t * dims.s * dims.d, 1));
}

// key_padding_mask (B, S) as one keep flag per key (all 1 when the mask is undefined).
std::vector<uint8_t> key_flags(const Tensor& mask, const AttentionDims& dims, const char* op) {
  std::vector<uint8_t> flags(static_cast<size_t>(dims.b * dims.s), 1);
  if (!mask.defined()) return flags;
  detail::check_cpu(mask, op, "key_padding_mask");
  STRATA_CHECK(mask.dtype() == DType::kU8 || mask.dtype() == DType::kI32 ||
               mask.dtype() == DType::kI64)
      << op << ": key_padding_mask must be u8, i32 or i64, got " << dtype_name(mask.dtype());
  detail::check_shape(mask, {dims.b, dims.s}, op, "key_padding_mask");
  for (size_t i = 0; i < flags.size(); ++i) {
    const int64_t j = static_cast<int64_t>(i);
    const bool keep =
        mask.dtype() == DType::kU8 ? mask.data<uint8_t>()[j] != 0 : detail::index_at(mask, j) != 0;
    flags[i] = keep ? 1 : 0;
  }
  return flags;
}

// e^x: vectorizable in f32 (ops/cpu_math.h), the library's in f64.
inline float exp_of(float x) { return cpu_math::exp(x); }
inline double exp_of(double x) { return std::exp(x); }

// Softmax of row t of head (b, h) in place over the visible keys s: s < limit (causal) and
// flags[s] != 0. Invisible keys and rows without any visible key get 0. Returns the row's
// log-sum-exp (-inf without a visible key).
template <typename T>
T masked_softmax_row(T* row, int64_t s_len, int64_t limit, const uint8_t* flags) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  T m = kNegInf;
  int64_t visible = 0;
#pragma omp simd reduction(max : m) reduction(+ : visible)
  for (int64_t s = 0; s < limit; ++s) {
    m = flags[s] != 0 ? std::max(m, row[s]) : m;
    visible += flags[s] != 0;
  }
  if (visible == 0) {
    std::fill(row, row + s_len, T(0));
    return kNegInf;
  }
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int64_t s = 0; s < limit; ++s) {
    const T e = exp_of(row[s] - m);
    row[s] = flags[s] != 0 ? e : T(0);
    sum += row[s];
  }
  std::fill(row + limit, row + s_len, T(0));
  const T inv = static_cast<T>(1.0 / sum);
#pragma omp simd
  for (int64_t s = 0; s < limit; ++s) row[s] *= inv;
  return static_cast<T>(static_cast<double>(m) + std::log(sum));
}

// Probabilities recomputed from scores and lse in place (the backward without saved probs).
template <typename T>
void probs_from_lse_row(T* row, int64_t s_len, int64_t limit, const uint8_t* flags, T lse) {
  if (!std::isfinite(static_cast<double>(lse))) {
    std::fill(row, row + s_len, T(0));
    return;
  }
#pragma omp simd
  for (int64_t s = 0; s < limit; ++s) {
    const T e = exp_of(row[s] - lse);
    row[s] = flags[s] != 0 ? e : T(0);
  }
  std::fill(row + limit, row + s_len, T(0));
}

// dS = P (dP - rowsum(dP P)) over one row, in place of dP.
template <typename T>
void softmax_backward_row(const T* p_row, T* ds_row, int64_t s_len) {
  double dot = 0.0;
#pragma omp simd reduction(+ : dot)
  for (int64_t s = 0; s < s_len; ++s) dot += static_cast<double>(ds_row[s]) * p_row[s];
  const T dt = static_cast<T>(dot);
#pragma omp simd
  for (int64_t s = 0; s < s_len; ++s) ds_row[s] = p_row[s] * (ds_row[s] - dt);
}

}  // namespace

AttentionResult attention_forward(ExecContext& ctx, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& key_padding_mask,
                                  const AttentionOptions& options) {
  const AttentionDims dims = check_qkv(q, k, v, options, kForward);
  const std::vector<uint8_t> flags = key_flags(key_padding_mask, dims, kForward);
  const int64_t heads = dims.b * dims.h, t_len = dims.t, s_len = dims.s, d = dims.d;
  // Causal: query t sees keys s <= t + max(S - T, 0), so the last query sees every key.
  const int64_t causal_shift = std::max<int64_t>(s_len - t_len, 0);
  AttentionResult r;
  r.out = Tensor::empty({dims.b, dims.h, t_len, d}, q.dtype(), &ctx.allocator());
  r.probs = Tensor::empty({dims.b, dims.h, t_len, s_len}, q.dtype(), &ctx.allocator());
  r.lse = Tensor::empty({dims.b, dims.h, t_len}, q.dtype(), &ctx.allocator());
  detail::dispatch_float(q.dtype(), kForward, [&](auto tag) {
    using T = decltype(tag);
    const T* pq = q.data<T>();
    const T* pk = k.data<T>();
    const T* pv = v.data<T>();
    T* pp = r.probs.data<T>();
    T* po = r.out.data<T>();
    T* plse = r.lse.data<T>();
    detail::parallel_for(heads, head_grain(dims), [&](int64_t h0, int64_t h1) {
      for (int64_t i = h0; i < h1; ++i) {
        const int64_t b = i / dims.h;
        T* p_i = pp + i * t_len * s_len;
        // scores (T, S) = scale q (T, D) k^T (D, S)
        blas::gemm(ctx, false, true, t_len, s_len, d, static_cast<T>(dims.scale),
                   pq + i * t_len * d, d, pk + i * s_len * d, d, T(0), p_i, s_len);
        for (int64_t t = 0; t < t_len; ++t) {
          const int64_t limit = options.causal ? std::min(s_len, t + causal_shift + 1) : s_len;
          plse[i * t_len + t] =
              masked_softmax_row(p_i + t * s_len, s_len, limit, flags.data() + b * s_len);
        }
        // out (T, D) = probs (T, S) v (S, D)
        blas::gemm(ctx, false, false, t_len, d, s_len, T(1), p_i, s_len, pv + i * s_len * d, d,
                   T(0), po + i * t_len * d, d);
      }
    });
  });
  return r;
}

AttentionGrads attention_backward(ExecContext& ctx, const Tensor& dout, const Tensor& q,
                                  const Tensor& k, const Tensor& v, const AttentionResult& saved,
                                  const Tensor& key_padding_mask, const AttentionOptions& options) {
  const AttentionDims dims = check_qkv(q, k, v, options, kBackward);
  const int64_t heads = dims.b * dims.h, t_len = dims.t, s_len = dims.s, d = dims.d;
  detail::check_float(dout, kBackward, "dout");
  detail::check_same_dtype(dout, q, kBackward, "dout", "q");
  detail::check_shape(dout, q.shape(), kBackward, "dout");
  const std::vector<uint8_t> flags = key_flags(key_padding_mask, dims, kBackward);
  const Tensor& probs = saved.probs;
  Tensor lse;  // in q's dtype, only when probs must be recomputed
  if (probs.defined()) {
    detail::check_float(probs, kBackward, "probs");
    detail::check_same_dtype(probs, q, kBackward, "probs", "q");
    detail::check_shape(probs, {dims.b, dims.h, t_len, s_len}, kBackward, "probs");
  } else {
    STRATA_CHECK(saved.lse.defined())
        << kBackward << ": saved holds neither probs nor lse (pass forward's result)";
    detail::check_cpu(saved.lse, kBackward, "lse");
    STRATA_CHECK(is_floating(saved.lse.dtype()))
        << kBackward << ": lse must be a float tensor, got " << dtype_name(saved.lse.dtype());
    detail::check_shape(saved.lse, {dims.b, dims.h, t_len}, kBackward, "lse");
    lse = saved.lse.to(q.dtype());
  }
  AttentionGrads g;
  g.dq = Tensor::empty(q.shape(), q.dtype(), &ctx.allocator());
  g.dk = Tensor::empty(k.shape(), k.dtype(), &ctx.allocator());
  g.dv = Tensor::empty(v.shape(), v.dtype(), &ctx.allocator());
  const Shape score_shape{dims.b, dims.h, t_len, s_len};
  Tensor dscores = Tensor::empty(score_shape, q.dtype(), &ctx.allocator());  // (B, H, T, S)
  const Tensor p_all =
      probs.defined() ? probs : Tensor::empty(score_shape, q.dtype(), &ctx.allocator());
  detail::dispatch_float(q.dtype(), kBackward, [&](auto tag) {
    using T = decltype(tag);
    const T scale = static_cast<T>(dims.scale);
    const T* pq = q.data<T>();
    const T* pk = k.data<T>();
    const T* pv = v.data<T>();
    const T* pp = p_all.data<T>();
    const T* pdo = dout.data<T>();
    T* pds = dscores.data<T>();
    T* pdq = g.dq.data<T>();
    T* pdk = g.dk.data<T>();
    T* pdv = g.dv.data<T>();
    const T* plse = probs.defined() ? nullptr : lse.data<T>();
    T* pw = probs.defined() ? nullptr : p_all.data<T>();
    const int64_t causal_shift = std::max<int64_t>(s_len - t_len, 0);
    detail::parallel_for(heads, head_grain(dims), [&](int64_t h0, int64_t h1) {
      for (int64_t i = h0; i < h1; ++i) {
        const int64_t b = i / dims.h;
        const T* p_i = pp + i * t_len * s_len;
        const T* do_i = pdo + i * t_len * d;
        T* ds_i = pds + i * t_len * s_len;
        if (pw != nullptr) {  // P = exp(scale q k^T - lse) over the visible keys
          T* w_i = pw + i * t_len * s_len;
          blas::gemm(ctx, false, true, t_len, s_len, d, scale, pq + i * t_len * d, d,
                     pk + i * s_len * d, d, T(0), w_i, s_len);
          for (int64_t t = 0; t < t_len; ++t) {
            const int64_t limit = options.causal ? std::min(s_len, t + causal_shift + 1) : s_len;
            probs_from_lse_row(w_i + t * s_len, s_len, limit, flags.data() + b * s_len,
                               plse[i * t_len + t]);
          }
        }
        // dv (S, D) = P^T (S, T) dout (T, D)
        blas::gemm(ctx, true, false, s_len, d, t_len, T(1), p_i, s_len, do_i, d, T(0),
                   pdv + i * s_len * d, d);
        // dP (T, S) = dout (T, D) v^T (D, S), then dS in place
        blas::gemm(ctx, false, true, t_len, s_len, d, T(1), do_i, d, pv + i * s_len * d, d, T(0),
                   ds_i, s_len);
        for (int64_t t = 0; t < t_len; ++t) {
          softmax_backward_row(p_i + t * s_len, ds_i + t * s_len, s_len);
        }
        // dq (T, D) = scale dS (T, S) k (S, D)
        blas::gemm(ctx, false, false, t_len, d, s_len, scale, ds_i, s_len, pk + i * s_len * d, d,
                   T(0), pdq + i * t_len * d, d);
        // dk (S, D) = scale dS^T (S, T) q (T, D)
        blas::gemm(ctx, true, false, s_len, d, t_len, scale, ds_i, s_len, pq + i * t_len * d, d,
                   T(0), pdk + i * s_len * d, d);
      }
    });
  });
  return g;
}

}  // namespace strata::ops::cpu
