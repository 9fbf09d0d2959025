// Data movement on the CPU. Pure copies, so every dtype works: elements are moved as opaque
// 1, 2, 4 or 8-byte words and no value changes.
//
// permute_copy walks the output in row-major order one innermost row at a time, keeping a
// multi-index over the outer dimensions (no division per element). Dimensions of size 1 are
// dropped and neighbours that are contiguous in the source are merged first, so a permute that
// keeps the innermost dimension copies whole runs with memcpy.
// concat and split see each tensor as (outer, size along dim x inner) and move one contiguous
// block per (outer index, piece).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ops/cpu_util.h"
#include "ops/shape_ops.h"

namespace strata::ops::cpu {
namespace {

constexpr int64_t kGrainBytes = 1 << 16;  // bytes per parallel chunk, at least

// Calls f(W{}) with W an unsigned word type as wide as one element.
template <typename F>
void dispatch_word(size_t element_size, F&& f) {
  switch (element_size) {
    case 1:
      f(uint8_t{});
      return;
    case 2:
      f(uint16_t{});
      return;
    case 4:
      f(uint32_t{});
      return;
    case 8:
      f(uint64_t{});
      return;
  }
  STRATA_THROW() << "unsupported element size " << element_size;
}

void check_defined_cpu(const Tensor& t, const char* op, const std::string& name) {
  STRATA_CHECK(t.defined()) << op << ": " << name << " is undefined";
  STRATA_CHECK(t.device().is_cpu())
      << op << ": " << name << " is on " << t.device().str() << ", the CPU kernel needs it on cpu";
}

// check_cpu for the block copies of concat and split. A tensor without elements has no layout
// to check (Tensor::is_contiguous rejects e.g. a fresh (2, 0) tensor), and split's backward
// concatenates such pieces when a size is 0.
void check_blocks(const Tensor& t, const char* op, const std::string& name) {
  if (t.defined() && t.numel() == 0) {
    check_defined_cpu(t, op, name);
  } else {
    detail::check_cpu(t, op, name.c_str());
  }
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op, const Tensor& t, const char* name) {
  const int64_t d = dim < 0 ? dim + ndim : dim;
  STRATA_CHECK(d >= 0 && d < ndim)
      << op << ": dim " << dim << " is out of range for " << name << " " << t.shape_str();
  return d;
}

int64_t product(const Shape& shape, int64_t begin, int64_t end) {
  int64_t n = 1;
  for (int64_t d = begin; d < end; ++d) n *= shape[d];
  return n;
}

// Copies the strided source (sizes, strides) into the contiguous dst, in row-major order.
template <typename W>
void gather(const Shape& sizes, const Shape& strides, const W* src, W* dst) {
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  const int64_t inner = sizes.back(), inner_stride = strides.back();
  const int64_t rows = shape_numel(sizes) / inner;
  const int64_t grain = std::max<int64_t>(1, kGrainBytes / (inner * int64_t{sizeof(W)}));
  detail::parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> index(static_cast<size_t>(ndim - 1), 0);
    int64_t offset = 0, rem = r0;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      index[d] = rem % sizes[d];
      rem /= sizes[d];
      offset += index[d] * strides[d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      const W* in = src + offset;
      W* out = dst + r * inner;
      if (inner_stride == 1) {
        std::memcpy(out, in, static_cast<size_t>(inner) * sizeof(W));
      } else {
        for (int64_t i = 0; i < inner; ++i) out[i] = in[i * inner_stride];
      }
      for (int64_t d = ndim - 2; d >= 0; --d) {
        ++index[d];
        offset += strides[d];
        if (index[d] < sizes[d]) break;
        offset -= index[d] * strides[d];
        index[d] = 0;
      }
    }
  });
}

}  // namespace

Tensor permute_copy(ExecContext& ctx, const Tensor& x, const std::vector<int64_t>& dims) {
  constexpr const char* kOp = "permute_copy";
  check_defined_cpu(x, kOp, "x");
  const int64_t ndim = x.dim();
  STRATA_CHECK_EQ(static_cast<int64_t>(dims.size()), ndim)
      << kOp << ": dims has " << dims.size() << " entries but x " << x.shape_str() << " has "
      << ndim << " dimensions";
  std::vector<bool> seen(dims.size(), false);
  Shape shape(dims.size()), strides(dims.size());
  for (int64_t i = 0; i < ndim; ++i) {
    const int64_t d = wrap_dim(dims[i], ndim, kOp, x, "x");
    STRATA_CHECK(!seen[d]) << kOp << ": dimension " << d << " of x " << x.shape_str()
                           << " appears twice in dims";
    seen[d] = true;
    shape[i] = x.shape()[d];
    strides[i] = x.strides()[d];
  }
  Tensor y = Tensor::empty(shape, x.dtype(), &ctx.allocator());
  if (y.numel() == 0) return y;

  // Drop size-1 dimensions; merge neighbours that are contiguous in the source.
  Shape sizes, steps;
  for (int64_t i = 0; i < ndim; ++i) {
    if (shape[i] == 1) continue;
    if (!sizes.empty() && steps.back() == strides[i] * shape[i]) {
      sizes.back() *= shape[i];
      steps.back() = strides[i];
    } else {
      sizes.push_back(shape[i]);
      steps.push_back(strides[i]);
    }
  }
  if (sizes.empty()) {
    sizes = {1};
    steps = {1};
  }
  dispatch_word(x.element_size(), [&](auto tag) {
    using W = decltype(tag);
    gather(sizes, steps, static_cast<const W*>(x.raw_data()), static_cast<W*>(y.raw_data()));
  });
  return y;
}

Tensor concat(ExecContext& ctx, const TensorList& xs, int64_t dim) {
  constexpr const char* kOp = "concat";
  STRATA_CHECK(!xs.empty()) << kOp << ": needs at least one tensor";
  const Tensor& first = xs[0];
  check_blocks(first, kOp, "xs[0]");
  STRATA_CHECK_GE(first.dim(), 1) << kOp << ": xs[0] is a scalar; concat needs dimensions";
  const int64_t d = wrap_dim(dim, first.dim(), kOp, first, "xs[0]");
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const std::string name = "xs[" + std::to_string(i) + "]";
    check_blocks(xs[i], kOp, name);
    detail::check_same_dtype(xs[i], first, kOp, name.c_str(), "xs[0]");
    Shape expected = first.shape();
    if (xs[i].dim() == first.dim()) expected[d] = xs[i].size(d);
    STRATA_CHECK(xs[i].shape() == expected)
        << kOp << ": " << name << " has shape " << xs[i].shape_str() << " but xs[0] has "
        << first.shape_str() << "; they must agree in every dimension but " << d;
    total += xs[i].size(d);
  }
  Shape out_shape = first.shape();
  out_shape[d] = total;
  Tensor y = Tensor::empty(out_shape, first.dtype(), &ctx.allocator());
  if (y.numel() == 0) return y;
  const int64_t outer = product(out_shape, 0, d);
  const int64_t inner = product(out_shape, d + 1, first.dim());
  const int64_t es = static_cast<int64_t>(first.element_size());
  const int64_t row_bytes = total * inner * es;  // one outer index of the output
  char* out = static_cast<char*>(y.raw_data());
  detail::parallel_for(outer, std::max<int64_t>(1, kGrainBytes / std::max<int64_t>(row_bytes, 1)),
                       [&](int64_t o0, int64_t o1) {
                         for (int64_t o = o0; o < o1; ++o) {
                           char* dst = out + o * row_bytes;
                           for (const Tensor& x : xs) {
                             const int64_t bytes = x.size(d) * inner * es;
                             if (bytes == 0) continue;
                             std::memcpy(dst, static_cast<const char*>(x.raw_data()) + o * bytes,
                                         static_cast<size_t>(bytes));
                             dst += bytes;
                           }
                         }
                       });
  return y;
}

TensorList split(ExecContext& ctx, const Tensor& x, const std::vector<int64_t>& sizes,
                 int64_t dim) {
  constexpr const char* kOp = "split";
  check_blocks(x, kOp, "x");
  STRATA_CHECK_GE(x.dim(), 1) << kOp << ": x is a scalar; split needs dimensions";
  const int64_t d = wrap_dim(dim, x.dim(), kOp, x, "x");
  int64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    STRATA_CHECK_GE(sizes[i], 0) << kOp << ": sizes[" << i << "] is negative";
    total += sizes[i];
  }
  STRATA_CHECK_EQ(total, x.size(d))
      << kOp << ": sizes add up to " << total << " but x " << x.shape_str() << " has " << x.size(d)
      << " entries along dimension " << d;
  TensorList pieces;
  pieces.reserve(sizes.size());
  for (int64_t n : sizes) {
    Shape shape = x.shape();
    shape[d] = n;
    pieces.push_back(Tensor::empty(shape, x.dtype(), &ctx.allocator()));
  }
  if (x.numel() == 0) return pieces;
  const int64_t outer = product(x.shape(), 0, d);
  const int64_t inner = product(x.shape(), d + 1, x.dim());
  const int64_t es = static_cast<int64_t>(x.element_size());
  const int64_t row_bytes = total * inner * es;
  const char* in = static_cast<const char*>(x.raw_data());
  detail::parallel_for(outer, std::max<int64_t>(1, kGrainBytes / row_bytes),
                       [&](int64_t o0, int64_t o1) {
                         for (int64_t o = o0; o < o1; ++o) {
                           const char* src = in + o * row_bytes;
                           for (const Tensor& p : pieces) {
                             const int64_t bytes = p.size(d) * inner * es;
                             if (bytes == 0) continue;
                             std::memcpy(static_cast<char*>(p.raw_data()) + o * bytes, src,
                                         static_cast<size_t>(bytes));
                             src += bytes;
                           }
                         }
                       });
  return pieces;
}

}  // namespace strata::ops::cpu
