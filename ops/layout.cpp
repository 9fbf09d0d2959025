// Layout conversions (ops/layout.h): permute_copy on either device.
#include "ops/layout.h"

#include "engine/check.h"
#include "ops/shape_ops.h"

namespace strata::ops {
namespace {

void check_image(const Tensor& x, const char* op) {
  STRATA_CHECK(x.defined() && x.dim() == 4)
      << op << ": needs an image tensor (N, C, H, W), got "
      << (x.defined() ? x.shape_str() : std::string("an undefined tensor"));
}

}  // namespace

bool is_channels_last(const Tensor& t) {
  return t.defined() && t.dim() == 4 && !t.is_contiguous() &&
         t.permute({0, 2, 3, 1}).is_contiguous();
}

Tensor to_channels_last(ExecContext& ctx, const Tensor& x) {
  check_image(x, "to_channels_last");
  if (is_channels_last(x)) return x;
  // (N, C, H, W) -> memory (N, H, W, C), seen as (N, C, H, W) again.
  return permute_copy(ctx, x.contiguous(), {0, 2, 3, 1}).permute({0, 3, 1, 2});
}

Tensor to_channels_first(ExecContext& ctx, const Tensor& x) {
  check_image(x, "to_channels_first");
  if (x.is_contiguous()) return x;
  if (is_channels_last(x)) return permute_copy(ctx, x.permute({0, 2, 3, 1}), {0, 3, 1, 2});
  return x.contiguous();
}

Tensor empty_channels_last(ExecContext& ctx, const Shape& nchw, DType dtype) {
  STRATA_CHECK_EQ(nchw.size(), 4u)
      << "empty_channels_last: shape " << shape_str(nchw) << " is not (N, C, H, W)";
  return Tensor::empty({nchw[0], nchw[2], nchw[3], nchw[1]}, dtype, &ctx.allocator())
      .permute({0, 3, 1, 2});
}

namespace detail {

Tensor nhwc_view(const Tensor& x) { return x.permute({0, 2, 3, 1}); }

Tensor from_nhwc(const Tensor& t) { return t.permute({0, 3, 1, 2}); }

Tensor nhwc_operand(const Tensor& t) {
  STRATA_CHECK(t.defined() && t.dim() <= 4)
      << "an operand of an image op must have at most 4 dimensions, got " << t.shape_str();
  Tensor u = t;
  if (u.dim() < 4) {
    Shape s(static_cast<size_t>(4 - u.dim()), 1);
    s.insert(s.end(), u.shape().begin(), u.shape().end());
    u = u.reshape(s);
  }
  const Tensor p = u.permute({0, 2, 3, 1});
  return p.is_contiguous() ? p : p.contiguous();
}

Tensor nchw(const Tensor& t) { return is_channels_last(t) ? t.contiguous() : t; }

}  // namespace detail

}  // namespace strata::ops
