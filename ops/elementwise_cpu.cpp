// Element-wise arithmetic on the CPU, computed in the inputs' dtype.
//
// add/mul take a flat loop when both shapes are equal. Otherwise both operands are laid over the
// output shape with stride 0 along broadcast dimensions, size-1 dimensions are dropped and
// neighbours that stay contiguous in both operands are merged, and the output is walked one
// innermost row at a time (each row a plain, broadcast-scalar or contiguous loop).
//
// sum_to_shape splits t's dimensions (after the same merging) into kept and reduced groups and
// accumulates every output element in double over a fixed order of the reduced positions, so the
// result does not depend on the thread count. When the innermost dimension is kept (a bias
// gradient), rows of t are added into blocks of output columns; when it is reduced, every output
// element sums contiguous runs.
#include <algorithm>
#include <vector>

#include "ops/cpu_util.h"
#include "ops/elementwise.h"

namespace strata::ops::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;  // elements per parallel chunk, at least

// Two operands laid over the output shape: merged dimensions, strides 0 where broadcast.
struct BroadcastLayout {
  Shape shape;
  Shape a_strides, b_strides;
};

// Strides of an operand (contiguous, `shape`) seen through the `ndim`-dimensional output.
Shape broadcast_strides(const Shape& shape, size_t ndim) {
  const Shape own = contiguous_strides(shape);
  Shape strides(ndim, 0);
  const size_t lead = ndim - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) strides[lead + d] = shape[d] == 1 ? 0 : own[d];
  return strides;
}

BroadcastLayout broadcast_layout(const Shape& a, const Shape& b, const Shape& out) {
  const Shape sa = broadcast_strides(a, out.size()), sb = broadcast_strides(b, out.size());
  BroadcastLayout l;
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;
    // Merge into the previous dimension when both operands step through it contiguously.
    if (!l.shape.empty() && l.a_strides.back() == sa[d] * out[d] &&
        l.b_strides.back() == sb[d] * out[d]) {
      l.shape.back() *= out[d];
      l.a_strides.back() = sa[d];
      l.b_strides.back() = sb[d];
      continue;
    }
    l.shape.push_back(out[d]);
    l.a_strides.push_back(sa[d]);
    l.b_strides.push_back(sb[d]);
  }
  if (l.shape.empty()) {  // a single element; both operands hold exactly one
    l.shape = {1};
    l.a_strides = {1};
    l.b_strides = {1};
  }
  return l;
}

// y = f(a, b) over the broadcast layout; y is contiguous in the output shape.
template <typename T, typename F>
void broadcast_apply(const BroadcastLayout& l, const T* a, const T* b, T* y, F f) {
  const int64_t ndim = static_cast<int64_t>(l.shape.size());
  const int64_t inner = l.shape.back();
  const int64_t rows = shape_numel(l.shape) / inner;
  const int64_t sa = l.a_strides.back(), sb = l.b_strides.back();
  detail::parallel_for(rows, std::max<int64_t>(1, kGrain / inner), [&](int64_t r0, int64_t r1) {
    // Multi-index of row r0 over the outer dimensions, and the operands' offsets there.
    std::vector<int64_t> index(static_cast<size_t>(ndim - 1), 0);
    int64_t oa = 0, ob = 0, rem = r0;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      index[d] = rem % l.shape[d];
      rem /= l.shape[d];
      oa += index[d] * l.a_strides[d];
      ob += index[d] * l.b_strides[d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      const T* pa = a + oa;
      const T* pb = b + ob;
      T* py = y + r * inner;
      if (sa != 0 && sb != 0) {
        for (int64_t i = 0; i < inner; ++i) py[i] = f(pa[i], pb[i]);
      } else if (sb == 0) {
        const T vb = *pb;
        for (int64_t i = 0; i < inner; ++i) py[i] = f(pa[i], vb);
      } else {
        const T va = *pa;
        for (int64_t i = 0; i < inner; ++i) py[i] = f(va, pb[i]);
      }
      for (int64_t d = ndim - 2; d >= 0; --d) {
        ++index[d];
        oa += l.a_strides[d];
        ob += l.b_strides[d];
        if (index[d] < l.shape[d]) break;
        oa -= index[d] * l.a_strides[d];
        ob -= index[d] * l.b_strides[d];
        index[d] = 0;
      }
    }
  });
}

// The broadcast of a's and b's shapes; the error names the op and both operands.
Shape broadcast_checked(const Tensor& a, const Tensor& b, const char* op) {
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  const size_t ndim = std::max(sa.size(), sb.size());
  Shape out(ndim);
  for (size_t i = 0; i < ndim; ++i) {  // i counts from the last dimension
    const int64_t da = i < sa.size() ? sa[sa.size() - 1 - i] : 1;
    const int64_t db = i < sb.size() ? sb[sb.size() - 1 - i] : 1;
    STRATA_CHECK(da == db || da == 1 || db == 1)
        << op << ": a " << a.shape_str() << " and b " << b.shape_str()
        << " cannot be broadcast: dimension -" << (i + 1) << " has sizes " << da << " and " << db
        << " (they must be equal or one of them 1)";
    out[ndim - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

template <typename F>
Tensor binary(ExecContext& ctx, const Tensor& a, const Tensor& b, const char* op, F f) {
  detail::check_float(a, op, "a");
  detail::check_float(b, op, "b");
  detail::check_same_dtype(a, b, op, "a", "b");
  const Shape out_shape = broadcast_checked(a, b, op);
  Tensor y = Tensor::empty(out_shape, a.dtype(), &ctx.allocator());
  if (y.numel() == 0) return y;
  detail::dispatch_float(a.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* py = y.data<T>();
    if (a.shape() == b.shape()) {
      detail::parallel_for(y.numel(), kGrain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) py[i] = f(pa[i], pb[i]);
      });
      return;
    }
    broadcast_apply(broadcast_layout(a.shape(), b.shape(), out_shape), pa, pb, py, f);
  });
  return y;
}

// Every offset of a row-major walk over `sizes` with the given strides, in walk order.
std::vector<int64_t> walk_offsets(const Shape& sizes, const Shape& strides) {
  std::vector<int64_t> offsets{0};
  for (size_t d = 0; d < sizes.size(); ++d) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * static_cast<size_t>(sizes[d]));
    for (int64_t o : offsets) {
      for (int64_t i = 0; i < sizes[d]; ++i) next.push_back(o + i * strides[d]);
    }
    offsets.swap(next);
  }
  return offsets;
}

}  // namespace

Tensor add(ExecContext& ctx, const Tensor& a, const Tensor& b) {
  return binary(ctx, a, b, "add", [](auto x, auto y) { return x + y; });
}

Tensor mul(ExecContext& ctx, const Tensor& a, const Tensor& b) {
  return binary(ctx, a, b, "mul", [](auto x, auto y) { return x * y; });
}

Tensor scale(ExecContext& ctx, const Tensor& x, double alpha) {
  constexpr const char* kOp = "scale";
  detail::check_float(x, kOp, "x");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  detail::dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const T s = static_cast<T>(alpha);
    detail::parallel_for(x.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) py[i] = s * px[i];
    });
  });
  return y;
}

void add_(ExecContext& ctx, const Tensor& dst, const Tensor& src, double alpha) {
  constexpr const char* kOp = "add_";
  detail::check_float(dst, kOp, "dst");
  detail::check_float(src, kOp, "src");
  detail::check_same_dtype(dst, src, kOp, "dst", "src");
  detail::check_shape(src, dst.shape(), kOp, "src");
  detail::dispatch_float(dst.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    T* pd = dst.data<T>();
    const T* ps = src.data<T>();  // may alias pd: each element is read before it is written
    const T s = static_cast<T>(alpha);
    detail::parallel_for(dst.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      if (alpha == 1.0) {
        for (int64_t i = i0; i < i1; ++i) pd[i] += ps[i];
      } else {
        for (int64_t i = i0; i < i1; ++i) pd[i] += s * ps[i];
      }
    });
  });
}

Tensor sum_to_shape(ExecContext& ctx, const Tensor& t, const Shape& shape) {
  constexpr const char* kOp = "sum_to_shape";
  detail::check_float(t, kOp, "t");
  STRATA_CHECK_LE(static_cast<int64_t>(shape.size()), t.dim())
      << kOp << ": target shape " << shape_str(shape) << " has more dimensions than t "
      << t.shape_str();
  const size_t lead = t.shape().size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) {
    STRATA_CHECK(shape[d] == t.shape()[lead + d] || shape[d] == 1)
        << kOp << ": t " << t.shape_str() << " is not a broadcast of shape " << shape_str(shape)
        << " (dimension " << d << " of the target has size " << shape[d] << ", t has "
        << t.shape()[lead + d] << ")";
  }
  if (t.numel() == 0) return Tensor::zeros(shape, t.dtype(), &ctx.allocator());
  Tensor out = Tensor::empty(shape, t.dtype(), &ctx.allocator());

  // Group t's dimensions into runs that are all kept or all reduced (size-1 ones drop out).
  Shape sizes;
  std::vector<bool> kept;
  for (size_t d = 0; d < t.shape().size(); ++d) {
    const int64_t n = t.shape()[d];
    if (n == 1) continue;
    const bool keep = d >= lead && shape[d - lead] == n;
    if (!kept.empty() && kept.back() == keep) {
      sizes.back() *= n;
    } else {
      sizes.push_back(n);
      kept.push_back(keep);
    }
  }
  if (sizes.empty()) {  // a single element
    sizes = {1};
    kept = {true};
  }
  const Shape strides = contiguous_strides(sizes);
  Shape kept_sizes, kept_strides, reduced_sizes, reduced_strides;
  for (size_t d = 0; d + 1 < sizes.size(); ++d) {
    (kept[d] ? kept_sizes : reduced_sizes).push_back(sizes[d]);
    (kept[d] ? kept_strides : reduced_strides).push_back(strides[d]);
  }
  const std::vector<int64_t> kept_base = walk_offsets(kept_sizes, kept_strides);
  const std::vector<int64_t> reduced_base = walk_offsets(reduced_sizes, reduced_strides);
  const int64_t n_kept = static_cast<int64_t>(kept_base.size());
  const int64_t n_reduced = static_cast<int64_t>(reduced_base.size());
  const int64_t inner = sizes.back();

  detail::dispatch_float(t.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* pt = t.data<T>();
    T* po = out.data<T>();
    if (kept.back()) {
      // out[k, c] = sum_r t[k, r, c]: work items are (k, block of columns).
      constexpr int64_t kBlock = 64;
      const int64_t blocks = (inner + kBlock - 1) / kBlock;
      const int64_t work = std::min(inner, kBlock) * n_reduced;
      detail::parallel_for(
          n_kept * blocks, std::max<int64_t>(1, kGrain / work), [&](int64_t w0, int64_t w1) {
            double acc[kBlock];
            for (int64_t w = w0; w < w1; ++w) {
              const int64_t k = w / blocks;
              const int64_t c0 = (w % blocks) * kBlock, c1 = std::min(inner, c0 + kBlock);
              std::fill(acc, acc + (c1 - c0), 0.0);
              for (int64_t r = 0; r < n_reduced; ++r) {
                const T* row = pt + kept_base[k] + reduced_base[r];
                for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
              }
              for (int64_t c = c0; c < c1; ++c) po[k * inner + c] = static_cast<T>(acc[c - c0]);
            }
          });
    } else {
      // out[k] = sum_r sum_c t[k, r, c]: every output element sums contiguous runs.
      detail::parallel_for(n_kept, std::max<int64_t>(1, kGrain / (inner * n_reduced)),
                           [&](int64_t k0, int64_t k1) {
                             for (int64_t k = k0; k < k1; ++k) {
                               double acc = 0.0;
                               for (int64_t r = 0; r < n_reduced; ++r) {
                                 const T* run = pt + kept_base[k] + reduced_base[r];
                                 for (int64_t c = 0; c < inner; ++c) acc += run[c];
                               }
                               po[k] = static_cast<T>(acc);
                             }
                           });
    }
  });
  return out;
}

}  // namespace strata::ops::cpu
