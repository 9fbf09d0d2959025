// The padded linear layer on the CPU (ops/linear_padded.h): the unpadded product's kernels on the
// first n rows, so that the results are bit for bit those of the unpadded layer.
#include <limits>

#include "engine/check.h"
#include "ops/linear_padded.h"
#include "ops/matmul.h"

namespace strata::ops {

namespace detail {

void check_linear_padded(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                         int64_t n) {
  STRATA_CHECK(x.defined() && weight.defined()) << op << ": x and weight must be defined";
  STRATA_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1))
      << op << ": x " << x.shape_str() << " and weight " << weight.shape_str()
      << " do not fit (x (..., K), weight (Np, K))";
  STRATA_CHECK(n >= 1 && n <= weight.size(0))
      << op << ": the unpadded size " << n << " must be in [1, " << weight.size(0) << "]";
  STRATA_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)))
      << op << ": bias " << bias.shape_str() << " must be (" << weight.size(0) << ",)";
  STRATA_CHECK(weight.is_contiguous()) << op << ": weight must be contiguous";
}

}  // namespace detail

namespace cpu {
namespace {

Tensor first_rows(const Tensor& t, int64_t n) { return t.defined() ? t.narrow(0, 0, n) : t; }

Shape with_last(const Shape& s, int64_t last) {
  Shape out = s;
  out.back() = last;
  return out;
}

}  // namespace

Tensor linear_padded_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight,
                             const Tensor& bias, int64_t n) {
  detail::check_linear_padded("linear_padded_forward", x, weight, bias, n);
  const int64_t np = weight.size(0);
  const Tensor real = cpu::linear_forward(ctx, x, first_rows(weight, n), first_rows(bias, n));
  if (np == n) return real;
  Tensor y = Tensor::empty(with_last(x.shape(), np), real.dtype(), &ctx.allocator());
  const Tensor rows = y.view({-1, np});
  rows.narrow(1, 0, n).copy_from(real.view({-1, n}));
  rows.narrow(1, n, np - n).fill_(-std::numeric_limits<double>::infinity());
  return y;
}

Tensor linear_padded_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x,
                              const Tensor& weight, const Tensor& dweight, const Tensor& dbias,
                              int64_t n, bool need_dx) {
  detail::check_linear_padded("linear_padded_backward", x, weight, dbias, n);
  const int64_t np = weight.size(0);
  STRATA_CHECK(dy.defined() && dy.shape() == with_last(x.shape(), np))
      << "linear_padded_backward: dy " << dy.shape_str() << " must be "
      << shape_str(with_last(x.shape(), np));
  Tensor real = dy;
  if (np != n) {
    real = Tensor::empty(with_last(x.shape(), n), dy.dtype(), &ctx.allocator());
    real.view({-1, n}).copy_from(dy.reshape({-1, np}).narrow(1, 0, n));
  }
  return cpu::linear_backward(ctx, real, x, first_rows(weight, n), first_rows(dweight, n),
                              first_rows(dbias, n), need_dx);
}

}  // namespace cpu
}  // namespace strata::ops
