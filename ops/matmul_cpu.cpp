// Matrix products on the CPU through the BLAS (ops/blas.h).
//
// A product whose right operand is shared by the whole batch and whose left operand is not
// transposed folds the batch into the rows (one large gemm instead of many small ones); this is
// the linear layer's case. Gradients of a shared operand are summed over the batch by the same
// folding, or by accumulating gemms with beta = 1.
#include <algorithm>
#include <vector>

#include "ops/activation.h"
#include "ops/blas.h"
#include "ops/cpu_util.h"
#include "ops/matmul.h"

namespace strata::ops::cpu {
namespace {

constexpr const char* kMatmul = "matmul";

struct MatmulDims {
  int64_t batch = 1;
  int64_t m = 0, k = 0, n = 0;
  bool b_shared = false;  // b is 2-D and used by every batch entry of a
  Shape out_shape;
};

MatmulDims matmul_dims(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  STRATA_CHECK(a.dim() >= 2 && b.dim() >= 2)
      << "matmul needs operands of at least 2 dimensions, got " << a.shape_str() << " and "
      << b.shape_str();
  MatmulDims d;
  d.m = trans_a ? a.size(-1) : a.size(-2);
  d.k = trans_a ? a.size(-2) : a.size(-1);
  const int64_t kb = trans_b ? b.size(-1) : b.size(-2);
  d.n = trans_b ? b.size(-2) : b.size(-1);
  STRATA_CHECK_EQ(d.k, kb) << "matmul: inner dimensions differ for " << a.shape_str()
                           << (trans_a ? "^T" : "") << " @ " << b.shape_str()
                           << (trans_b ? "^T" : "");
  const Shape batch_a(a.shape().begin(), a.shape().end() - 2);
  const Shape batch_b(b.shape().begin(), b.shape().end() - 2);
  d.batch = shape_numel(batch_a);
  d.b_shared = b.dim() == 2 && a.dim() > 2;
  STRATA_CHECK(d.b_shared || batch_a == batch_b)
      << "matmul: batch dimensions differ for " << a.shape_str() << " @ " << b.shape_str()
      << " (b must have a's batch dimensions or be 2-D)";
  d.out_shape = batch_a;
  d.out_shape.push_back(d.m);
  d.out_shape.push_back(d.n);
  return d;
}

void check_matmul_operands(const Tensor& a, const Tensor& b, const char* op) {
  detail::check_float(a, op, "a");
  detail::check_float(b, op, "b");
  detail::check_same_dtype(a, b, op, "a", "b");
}

// Column sums of a (rows, cols) matrix accumulated into out (cols): out += sum over rows.
template <typename T>
void accumulate_column_sums(const T* x, int64_t rows, int64_t cols, T* out) {
  detail::parallel_for(cols, 64, [&](int64_t c0, int64_t c1) {
    std::vector<double> acc(static_cast<size_t>(c1 - c0), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = x + r * cols;
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
    }
    for (int64_t c = c0; c < c1; ++c) out[c] += static_cast<T>(acc[c - c0]);
  });
}

}  // namespace

Tensor matmul(ExecContext& ctx, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  check_matmul_operands(a, b, kMatmul);
  const MatmulDims d = matmul_dims(a, b, trans_a, trans_b);
  Tensor c = Tensor::empty(d.out_shape, a.dtype(), &ctx.allocator());
  detail::dispatch_float(a.dtype(), kMatmul, [&](auto tag) {
    using T = decltype(tag);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* pc = c.data<T>();
    const int64_t lda = a.size(-1), ldb = b.size(-1);
    if (d.b_shared && !trans_a) {
      blas::gemm(ctx, false, trans_b, d.batch * d.m, d.n, d.k, T(1), pa, lda, pb, ldb, T(0), pc,
                 d.n);
      return;
    }
    const int64_t a_step = d.m * d.k, b_step = d.b_shared ? 0 : d.k * d.n, c_step = d.m * d.n;
    for (int64_t i = 0; i < d.batch; ++i) {
      blas::gemm(ctx, trans_a, trans_b, d.m, d.n, d.k, T(1), pa + i * a_step, lda, pb + i * b_step,
                 ldb, T(0), pc + i * c_step, d.n);
    }
  });
  return c;
}

MatmulGrads matmul_backward(ExecContext& ctx, const Tensor& dc, const Tensor& a, const Tensor& b,
                            bool trans_a, bool trans_b, bool need_da, bool need_db) {
  constexpr const char* kOp = "matmul_backward";
  check_matmul_operands(a, b, kOp);
  const MatmulDims d = matmul_dims(a, b, trans_a, trans_b);
  detail::check_float(dc, kOp, "dc");
  detail::check_same_dtype(dc, a, kOp, "dc", "a");
  detail::check_shape(dc, d.out_shape, kOp, "dc");
  MatmulGrads grads;
  if (need_da) grads.da = Tensor::empty(a.shape(), a.dtype(), &ctx.allocator());
  if (need_db) grads.db = Tensor::empty(b.shape(), b.dtype(), &ctx.allocator());
  detail::dispatch_float(a.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    const T* pdc = dc.data<T>();
    const int64_t lda = a.size(-1), ldb = b.size(-1), ldc = d.n;
    const int64_t a_step = d.m * d.k, b_step = d.b_shared ? 0 : d.k * d.n, c_step = d.m * d.n;
    const bool fold = d.b_shared && !trans_a;  // batch folded into the rows of a and c
    const int64_t loops = fold ? 1 : d.batch;
    const int64_t rows = fold ? d.batch * d.m : d.m;
    if (need_da) {
      T* pda = grads.da.template data<T>();
      for (int64_t i = 0; i < loops; ++i) {
        const T* dci = pdc + i * c_step;
        const T* bi = pb + i * b_step;
        T* dai = pda + i * a_step;
        if (!trans_a) {  // da (m, k) = dc (m, n) @ op(b)^T
          blas::gemm(ctx, false, !trans_b, rows, d.k, d.n, T(1), dci, ldc, bi, ldb, T(0), dai, lda);
        } else {  // da (k, m) = op(b) (k, n) @ dc^T
          blas::gemm(ctx, trans_b, true, d.k, d.m, d.n, T(1), bi, ldb, dci, ldc, T(0), dai, lda);
        }
      }
    }
    if (need_db) {
      T* pdb = grads.db.template data<T>();
      for (int64_t i = 0; i < loops; ++i) {
        const T* dci = pdc + i * c_step;
        const T* ai = pa + i * a_step;
        T* dbi = pdb + i * b_step;
        // A shared b accumulates over the batch loop (beta = 1 after the first entry).
        const T beta = (d.b_shared && i > 0) ? T(1) : T(0);
        if (!trans_b) {  // db (k, n) = op(a)^T (k, m) @ dc (m, n)
          blas::gemm(ctx, !trans_a, false, d.k, d.n, rows, T(1), ai, lda, dci, ldc, beta, dbi, ldb);
        } else {  // db (n, k) = dc^T (n, m) @ op(a) (m, k)
          blas::gemm(ctx, true, trans_a, d.n, d.k, rows, T(1), dci, ldc, ai, lda, beta, dbi, ldb);
        }
      }
    }
  });
  return grads;
}

Tensor linear_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  constexpr const char* kOp = "linear_forward";
  detail::check_float(x, kOp, "x");
  detail::check_float(weight, kOp, "weight");
  detail::check_same_dtype(x, weight, kOp, "x", "weight");
  STRATA_CHECK(x.dim() >= 1 && weight.dim() == 2)
      << kOp << ": x must be (..., K) and weight (M, K), got " << x.shape_str() << " and "
      << weight.shape_str();
  const int64_t k = x.size(-1), m = weight.size(0);
  STRATA_CHECK_EQ(weight.size(1), k)
      << kOp << ": x " << x.shape_str() << " and weight " << weight.shape_str() << " disagree on K";
  if (bias.defined()) {
    detail::check_float(bias, kOp, "bias");
    detail::check_shape(bias, {m}, kOp, "bias");
    detail::check_same_dtype(x, bias, kOp, "x", "bias");
  }
  const int64_t n = x.numel() / std::max<int64_t>(k, 1);
  Shape out_shape = x.shape();
  out_shape.back() = m;
  Tensor y = Tensor::empty(out_shape, x.dtype(), &ctx.allocator());
  detail::dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    T* py = y.data<T>();
    T beta = T(0);
    if (bias.defined()) {  // start from the bias rows, then accumulate the product
      const T* pb = bias.data<T>();
      detail::parallel_for(n, 256, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) std::copy(pb, pb + m, py + r * m);
      });
      beta = T(1);
    }
    blas::gemm(ctx, false, true, n, m, k, T(1), x.data<T>(), k, weight.data<T>(), k, beta, py, m);
  });
  return y;
}

Tensor linear_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight,
                       const Tensor& dweight, const Tensor& dbias, bool need_dx) {
  constexpr const char* kOp = "linear_backward";
  detail::check_float(dy, kOp, "dy");
  detail::check_float(x, kOp, "x");
  detail::check_float(weight, kOp, "weight");
  detail::check_same_dtype(x, weight, kOp, "x", "weight");
  detail::check_same_dtype(x, dy, kOp, "x", "dy");
  const int64_t k = x.size(-1), m = weight.size(0);
  const int64_t n = x.numel() / std::max<int64_t>(k, 1);
  Shape y_shape = x.shape();
  y_shape.back() = m;
  detail::check_shape(dy, y_shape, kOp, "dy");
  if (dweight.defined()) {
    detail::check_float(dweight, kOp, "dweight");
    detail::check_shape(dweight, weight.shape(), kOp, "dweight");
    detail::check_same_dtype(x, dweight, kOp, "x", "dweight");
  }
  if (dbias.defined()) {
    detail::check_float(dbias, kOp, "dbias");
    detail::check_shape(dbias, {m}, kOp, "dbias");
    detail::check_same_dtype(x, dbias, kOp, "x", "dbias");
  }
  Tensor dx;
  if (need_dx) dx = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  detail::dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = dy.data<T>();
    if (need_dx) {  // dx (n, k) = dy (n, m) @ weight (m, k)
      blas::gemm(ctx, false, false, n, k, m, T(1), pdy, m, weight.data<T>(), k, T(0),
                 dx.template data<T>(), k);
    }
    if (dweight.defined()) {  // dweight (m, k) += dy^T (m, n) @ x (n, k)
      blas::gemm(ctx, true, false, m, k, n, T(1), pdy, m, x.data<T>(), k, T(1), dweight.data<T>(),
                 k);
    }
    if (dbias.defined()) accumulate_column_sums(pdy, n, m, dbias.data<T>());
  });
  return dx;
}

LinearGeluResult linear_gelu_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight,
                                     const Tensor& bias) {
  LinearGeluResult r;
  r.pre = linear_forward(ctx, x, weight, bias);
  r.y = gelu_forward(ctx, r.pre);
  return r;
}

}  // namespace strata::ops::cpu
