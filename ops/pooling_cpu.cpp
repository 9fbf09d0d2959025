// 2-D pooling on the CPU, one (image, channel) plane per loop iteration over OpenMP threads.
//
// Windows follow PyTorch. Output cell (oh, ow) of max and average pooling covers input rows
// [oh stride - pad, oh stride - pad + kernel) clipped to the input, and the same for columns;
// with ceil_mode the last window may hang over the right/bottom padding, but every window starts
// inside the input (pool2d_output_size drops one that would not), so none is empty.
//   max:      padding is -infinity; the first maximum in row-major window order wins ties, and a
//             NaN counts as the maximum (it propagates, as in PyTorch).
//   average:  sums accumulate in double; with count_include_pad the divisor is the window clipped
//             to the padded input (cells beyond the padding do not count), else the cells inside
//             the input.
//   adaptive: output cell i averages rows [floor(i H / OH), ceil((i + 1) H / OH)).
// Backward passes scatter dy into a zeroed dx; each thread owns whole planes, so no two threads
// add into the same element.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "ops/cpu_util.h"
#include "ops/pooling.h"

namespace strata::ops::cpu {
namespace {

struct PoolGeometry {
  int64_t batch = 0, channels = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int64_t planes() const { return batch * channels; }
  int64_t in_plane() const { return in_h * in_w; }
  int64_t out_plane() const { return out_h * out_w; }
};

// Checks a (B, C, H, W) input shape; `name` is the tensor (or shape argument) it came from.
PoolGeometry plane_geometry(const char* op, const char* name, const Shape& shape) {
  STRATA_CHECK(shape.size() == 4) << op << ": " << name << " must be (B, C, H, W), got "
                                  << shape_str(shape);
  STRATA_CHECK(shape[0] >= 0 && shape[1] > 0 && shape[2] > 0 && shape[3] > 0)
      << op << ": " << name << " " << shape_str(shape)
      << " has an empty channel or spatial dimension";
  PoolGeometry g;
  g.batch = shape[0];
  g.channels = shape[1];
  g.in_h = shape[2];
  g.in_w = shape[3];
  return g;
}

PoolGeometry pool_geometry(const char* op, const char* name, const Shape& shape,
                           const Pool2dParams& p) {
  PoolGeometry g = plane_geometry(op, name, shape);
  STRATA_CHECK(p.kernel_h >= 1 && p.kernel_w >= 1 && p.stride_h >= 1 && p.stride_w >= 1 &&
               p.pad_h >= 0 && p.pad_w >= 0)
      << op << ": need kernel >= 1, stride >= 1 and padding >= 0; got kernel (" << p.kernel_h
      << ", " << p.kernel_w << "), stride (" << p.stride_h << ", " << p.stride_w << "), padding ("
      << p.pad_h << ", " << p.pad_w << ")";
  STRATA_CHECK(2 * p.pad_h <= p.kernel_h && 2 * p.pad_w <= p.kernel_w)
      << op << ": padding (" << p.pad_h << ", " << p.pad_w << ") must be at most half the kernel ("
      << p.kernel_h << ", " << p.kernel_w << ")";
  STRATA_CHECK(p.kernel_h <= g.in_h + 2 * p.pad_h && p.kernel_w <= g.in_w + 2 * p.pad_w)
      << op << ": kernel (" << p.kernel_h << ", " << p.kernel_w << ") is larger than " << name
      << " " << shape_str(shape) << " padded by (" << p.pad_h << ", " << p.pad_w << ")";
  g.out_h = pool2d_output_size(g.in_h, p.kernel_h, p.stride_h, p.pad_h, p.ceil_mode);
  g.out_w = pool2d_output_size(g.in_w, p.kernel_w, p.stride_w, p.pad_w, p.ceil_mode);
  return g;
}

// Window of output position o along one axis: [begin, end) inside the input, and `padded`, the
// length of the window clipped to the padded input (count_include_pad's divisor factor; for
// adaptive windows simply end - begin).
struct Window {
  int64_t begin, end, padded;
};
Window pool_window(int64_t o, int64_t kernel, int64_t stride, int64_t pad, int64_t in) {
  const int64_t start = o * stride - pad;
  const int64_t stop = std::min(start + kernel, in + pad);
  return {std::max<int64_t>(start, 0), std::min(stop, in), stop - start};
}
// Adaptive pooling's window: [floor(o in / out), ceil((o + 1) in / out)), never empty.
Window adaptive_window(int64_t o, int64_t out, int64_t in) {
  const int64_t begin = o * in / out;
  const int64_t end = ((o + 1) * in + out - 1) / out;
  return {begin, end, end - begin};
}

int64_t plane_grain(int64_t work_per_plane) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(work_per_plane, 1));
}

// Output shape (B, C, OH, OW) for geometry g.
Shape output_shape(const PoolGeometry& g) { return {g.batch, g.channels, g.out_h, g.out_w}; }

// Checks dy against the forward's output shape.
void check_dy(const char* op, const Tensor& dy, const PoolGeometry& g) {
  detail::check_float(dy, op, "dy");
  detail::check_shape(dy, output_shape(g), op, "dy");
}

}  // namespace

MaxPool2dResult max_pool2d_forward(ExecContext& ctx, const Tensor& x, const Pool2dParams& params) {
  constexpr const char* kOp = "max_pool2d_forward";
  detail::check_float(x, kOp, "x");
  const PoolGeometry g = pool_geometry(kOp, "x", x.shape(), params);
  MaxPool2dResult r;
  r.y = Tensor::empty(output_shape(g), x.dtype(), &ctx.allocator());
  r.indices = Tensor::empty(output_shape(g), DType::kI64, &ctx.allocator());
  detail::dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = r.y.data<T>();
    int64_t* pi = r.indices.data<int64_t>();
    const int64_t work = g.out_plane() * params.kernel_h * params.kernel_w;
    // 2x2 windows with stride 2 and no padding, all inside the input: the common case (VGG, small
    // CNNs), with the window arithmetic and clipping taken out of the loop.
    const bool pairs = params.kernel_h == 2 && params.kernel_w == 2 && params.stride_h == 2 &&
                       params.stride_w == 2 && params.pad_h == 0 && params.pad_w == 0 &&
                       2 * g.out_h <= g.in_h && 2 * g.out_w <= g.in_w;
    detail::parallel_for(g.planes(), plane_grain(work), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const T* src = px + t * g.in_plane();
        T* dst = py + t * g.out_plane();
        int64_t* idx = pi + t * g.out_plane();
        if (pairs) {
          for (int64_t oh = 0; oh < g.out_h; ++oh) {
            const int64_t r0 = 2 * oh * g.in_w, r1 = r0 + g.in_w;
            for (int64_t ow = 0; ow < g.out_w; ++ow) {
              // Row-major window order with the same comparison as the general loop.
              const int64_t at[4] = {r0 + 2 * ow, r0 + 2 * ow + 1, r1 + 2 * ow, r1 + 2 * ow + 1};
              T best = src[at[0]];
              int64_t best_at = at[0];
              for (int k = 1; k < 4; ++k) {
                const T v = src[at[k]];
                if (v > best || std::isnan(v)) {
                  best = v;
                  best_at = at[k];
                }
              }
              dst[oh * g.out_w + ow] = best;
              idx[oh * g.out_w + ow] = best_at;
            }
          }
          continue;
        }
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const Window wh = pool_window(oh, params.kernel_h, params.stride_h, params.pad_h, g.in_h);
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const Window ww =
                pool_window(ow, params.kernel_w, params.stride_w, params.pad_w, g.in_w);
            T best = -std::numeric_limits<T>::infinity();
            int64_t best_at = wh.begin * g.in_w + ww.begin;
            for (int64_t ih = wh.begin; ih < wh.end; ++ih) {
              for (int64_t iw = ww.begin; iw < ww.end; ++iw) {
                const T v = src[ih * g.in_w + iw];
                if (v > best || std::isnan(v)) {
                  best = v;
                  best_at = ih * g.in_w + iw;
                }
              }
            }
            dst[oh * g.out_w + ow] = best;
            idx[oh * g.out_w + ow] = best_at;
          }
        }
      }
    });
  });
  return r;
}

Tensor max_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Tensor& indices,
                           const Shape& x_shape) {
  constexpr const char* kOp = "max_pool2d_backward";
  PoolGeometry g = plane_geometry(kOp, "x_shape", x_shape);
  detail::check_float(dy, kOp, "dy");
  detail::check_cpu(indices, kOp, "indices");
  STRATA_CHECK(indices.dtype() == DType::kI64)
      << kOp << ": indices must be i64, got " << dtype_name(indices.dtype());
  STRATA_CHECK(dy.dim() == 4 && dy.size(0) == g.batch && dy.size(1) == g.channels)
      << kOp << ": dy " << dy.shape_str() << " must be (B, C, OH, OW) for x_shape "
      << shape_str(x_shape);
  detail::check_shape(indices, dy.shape(), kOp, "indices");
  g.out_h = dy.size(2);
  g.out_w = dy.size(3);
  Tensor dx = Tensor::zeros(x_shape, dy.dtype(), &ctx.allocator());
  std::atomic<bool> out_of_range{false};
  detail::dispatch_float(dy.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = dy.data<T>();
    const int64_t* pi = indices.data<int64_t>();
    T* pdx = dx.data<T>();
    detail::parallel_for(g.planes(), plane_grain(g.out_plane()), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const T* src = pdy + t * g.out_plane();
        const int64_t* idx = pi + t * g.out_plane();
        T* dst = pdx + t * g.in_plane();
        for (int64_t q = 0; q < g.out_plane(); ++q) {
          if (idx[q] < 0 || idx[q] >= g.in_plane()) {
            out_of_range.store(true, std::memory_order_relaxed);
            continue;
          }
          dst[idx[q]] += src[q];
        }
      }
    });
  });
  STRATA_CHECK(!out_of_range.load())
      << kOp << ": indices hold a position outside the " << g.in_h << " x " << g.in_w
      << " plane of x_shape " << shape_str(x_shape);
  return dx;
}

Tensor avg_pool2d_forward(ExecContext& ctx, const Tensor& x, const Pool2dParams& params) {
  constexpr const char* kOp = "avg_pool2d_forward";
  detail::check_float(x, kOp, "x");
  const PoolGeometry g = pool_geometry(kOp, "x", x.shape(), params);
  Tensor y = Tensor::empty(output_shape(g), x.dtype(), &ctx.allocator());
  detail::dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t work = g.out_plane() * params.kernel_h * params.kernel_w;
    detail::parallel_for(g.planes(), plane_grain(work), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const T* src = px + t * g.in_plane();
        T* dst = py + t * g.out_plane();
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const Window wh = pool_window(oh, params.kernel_h, params.stride_h, params.pad_h, g.in_h);
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const Window ww =
                pool_window(ow, params.kernel_w, params.stride_w, params.pad_w, g.in_w);
            double sum = 0.0;
            for (int64_t ih = wh.begin; ih < wh.end; ++ih) {
              for (int64_t iw = ww.begin; iw < ww.end; ++iw) sum += src[ih * g.in_w + iw];
            }
            const int64_t divisor = params.count_include_pad
                                        ? wh.padded * ww.padded
                                        : (wh.end - wh.begin) * (ww.end - ww.begin);
            dst[oh * g.out_w + ow] = static_cast<T>(sum / static_cast<double>(divisor));
          }
        }
      }
    });
  });
  return y;
}

Tensor avg_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Shape& x_shape,
                           const Pool2dParams& params) {
  constexpr const char* kOp = "avg_pool2d_backward";
  const PoolGeometry g = pool_geometry(kOp, "x_shape", x_shape, params);
  check_dy(kOp, dy, g);
  Tensor dx = Tensor::zeros(x_shape, dy.dtype(), &ctx.allocator());
  detail::dispatch_float(dy.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    const int64_t work = g.out_plane() * params.kernel_h * params.kernel_w;
    detail::parallel_for(g.planes(), plane_grain(work), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const T* src = pdy + t * g.out_plane();
        T* dst = pdx + t * g.in_plane();
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const Window wh = pool_window(oh, params.kernel_h, params.stride_h, params.pad_h, g.in_h);
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const Window ww =
                pool_window(ow, params.kernel_w, params.stride_w, params.pad_w, g.in_w);
            const int64_t divisor = params.count_include_pad
                                        ? wh.padded * ww.padded
                                        : (wh.end - wh.begin) * (ww.end - ww.begin);
            const T grad = src[oh * g.out_w + ow] / static_cast<T>(divisor);
            for (int64_t ih = wh.begin; ih < wh.end; ++ih) {
              for (int64_t iw = ww.begin; iw < ww.end; ++iw) dst[ih * g.in_w + iw] += grad;
            }
          }
        }
      }
    });
  });
  return dx;
}

Tensor adaptive_avg_pool2d_forward(ExecContext& ctx, const Tensor& x, int64_t out_h,
                                   int64_t out_w) {
  constexpr const char* kOp = "adaptive_avg_pool2d_forward";
  detail::check_float(x, kOp, "x");
  PoolGeometry g = plane_geometry(kOp, "x", x.shape());
  STRATA_CHECK(out_h >= 1 && out_w >= 1)
      << kOp << ": output size (" << out_h << ", " << out_w << ") must be positive";
  g.out_h = out_h;
  g.out_w = out_w;
  Tensor y = Tensor::empty(output_shape(g), x.dtype(), &ctx.allocator());
  detail::dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    detail::parallel_for(g.planes(), plane_grain(g.in_plane()), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const T* src = px + t * g.in_plane();
        T* dst = py + t * g.out_plane();
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const Window wh = adaptive_window(oh, g.out_h, g.in_h);
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const Window ww = adaptive_window(ow, g.out_w, g.in_w);
            double sum = 0.0;
            for (int64_t ih = wh.begin; ih < wh.end; ++ih) {
              for (int64_t iw = ww.begin; iw < ww.end; ++iw) sum += src[ih * g.in_w + iw];
            }
            dst[oh * g.out_w + ow] =
                static_cast<T>(sum / static_cast<double>(wh.padded * ww.padded));
          }
        }
      }
    });
  });
  return y;
}

Tensor adaptive_avg_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Shape& x_shape) {
  constexpr const char* kOp = "adaptive_avg_pool2d_backward";
  PoolGeometry g = plane_geometry(kOp, "x_shape", x_shape);
  detail::check_float(dy, kOp, "dy");
  STRATA_CHECK(dy.dim() == 4 && dy.size(0) == g.batch && dy.size(1) == g.channels &&
               dy.size(2) >= 1 && dy.size(3) >= 1)
      << kOp << ": dy " << dy.shape_str() << " must be (B, C, OH, OW) for x_shape "
      << shape_str(x_shape);
  g.out_h = dy.size(2);
  g.out_w = dy.size(3);
  Tensor dx = Tensor::zeros(x_shape, dy.dtype(), &ctx.allocator());
  detail::dispatch_float(dy.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    detail::parallel_for(g.planes(), plane_grain(g.in_plane()), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const T* src = pdy + t * g.out_plane();
        T* dst = pdx + t * g.in_plane();
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const Window wh = adaptive_window(oh, g.out_h, g.in_h);
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const Window ww = adaptive_window(ow, g.out_w, g.in_w);
            const T grad = src[oh * g.out_w + ow] / static_cast<T>(wh.padded * ww.padded);
            for (int64_t ih = wh.begin; ih < wh.end; ++ih) {
              for (int64_t iw = ww.begin; iw < ww.end; ++iw) dst[ih * g.in_w + iw] += grad;
            }
          }
        }
      }
    });
  });
  return dx;
}

}  // namespace strata::ops::cpu
