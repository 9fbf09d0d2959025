// 2-D convolution on the CPU: im2col + gemm through the BLAS (ops/blas.h); float32 3x3
// stride-1 convolutions with enough channels go to Winograd F(4x4, 3x3) instead
// (ops/conv2d_winograd_cpu.h, chosen by winograd::takes).
//
// Forward, per chunk of nb images and per group g (G groups):
//   cols  (C/G KH KW, nb OH OW) = im2col(x[chunk]) rows of group g   zeros where taps hit padding
//   out_g (OC/G, nb OH OW)      = weight_g (OC/G, C/G KH KW) @ cols
//   y[b, g OC/G + o, :]         = out_g[o, b-th block of OH OW] + bias[o]   (scatter to NCHW)
// A chunk holds as many images as fit a bounded buffer (kChunkBudgetBytes), so one large gemm
// covers many images (much faster than a gemm per image) while memory stays bounded. The buffer
// is a tensor from ctx.allocator(), so it counts toward the allocator's limit. A chunk of one
// image writes the gemm's output straight into y, with no scatter; convolutions with very few
// column rows (first layers on 1-3 channels) run that way, one image at a time. A 1x1 kernel
// with stride 1 and no padding on planes of 14 x 14 or more skips im2col as well: each image of
// x is its own column matrix.
//
// Backward recomputes the columns chunk by chunk:
//   dy_g (OC/G, nb OH OW) gathered from dy (NCHW)
//   dweight_g += dy_g @ cols^T                      (gemm with beta = 1: accumulates)
//   dcols      = weight_g^T @ dy_g;  dx += col2im(dcols)
// dbias sums dy over (B, OH, OW) in double. The data-movement loops (im2col, col2im, scatter,
// gather) use detail::parallel_for with a large grain (see kMoveGrainElements); col2im gives
// each thread whole (image, channel) planes, so no two threads add into the same element. gemm
// is never called inside a parallel loop: OpenBLAS runs its own threads.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "ops/blas.h"
#include "ops/conv2d.h"
#include "ops/conv2d_winograd_cpu.h"
#include "ops/cpu_util.h"

namespace strata::ops::cpu {
namespace {

// Upper bound on the per-chunk buffer (columns plus the gemm's output or the gathered dy). One
// image whose columns alone pass it is still processed, as a chunk of its own. Measured on the
// 2-core Xeon (Fashion-MNIST and ResNet shapes), 4 MiB beat 8-24 MiB: the columns are still in
// cache when the gemm reads them, and N = nb OH OW stays in the thousands.
constexpr int64_t kChunkBudgetBytes = int64_t{4} << 20;
// A pointwise convolution runs one gemm per image, without im2col, from this plane size (OH OW)
// up; below it (7 x 7 planes) the chunked path's larger gemms win.
constexpr int64_t kPointwiseDirectPlane = 196;
// With fewer column rows per group than this (C/G KH KW; a first layer on 1 or 3 channels), the
// gemm is bound by writing its output, so chunking would not speed it up, and the scatter to
// NCHW would cost about as much again: such convolutions run one image at a time.
constexpr int64_t kMinRowsForChunks = 32;

// One kernel tap along one axis: output position o reads input o stride + offset, which lies
// inside the input for o in [begin, end).
struct AxisTap {
  int64_t offset, begin, end;
};

std::vector<AxisTap> axis_taps(int64_t kernel, int64_t stride, int64_t pad, int64_t dilation,
                               int64_t in, int64_t out) {
  std::vector<AxisTap> taps;
  for (int64_t k = 0; k < kernel; ++k) {
    const int64_t offset = k * dilation - pad;
    const int64_t begin = offset >= 0 ? 0 : std::min(out, (-offset + stride - 1) / stride);
    const int64_t end = in - 1 - offset >= 0 ? std::min(out, (in - 1 - offset) / stride + 1) : 0;
    taps.push_back({offset, begin, std::max(begin, end)});
  }
  return taps;
}

struct ConvGeometry {
  int64_t batch = 0, in_c = 0, in_h = 0, in_w = 0;
  int64_t out_c = 0, k_h = 0, k_w = 0, out_h = 0, out_w = 0;
  int64_t groups = 1;
  int64_t out_c_g = 0;    // output channels per group
  int64_t rows_g = 0;     // column-matrix rows per group: C/G KH KW
  int64_t in_plane = 0;   // H W
  int64_t out_plane = 0;  // OH OW
  bool direct = false;    // pointwise kernel on a large plane: x is the column matrix
  Conv2dParams p;
  std::vector<AxisTap> taps_h, taps_w;  // per kernel row / column
};

ConvGeometry conv_geometry(const char* op, const Tensor& x, const Tensor& weight,
                           const Conv2dParams& p) {
  detail::check_float(x, op, "x");
  detail::check_float(weight, op, "weight");
  detail::check_same_dtype(x, weight, op, "x", "weight");
  STRATA_CHECK(x.dim() == 4) << op << ": x must be (B, C, H, W), got " << x.shape_str();
  STRATA_CHECK(weight.dim() == 4) << op << ": weight must be (OC, C / groups, KH, KW), got "
                                  << weight.shape_str();
  STRATA_CHECK(p.stride_h >= 1 && p.stride_w >= 1 && p.dilation_h >= 1 && p.dilation_w >= 1 &&
               p.pad_h >= 0 && p.pad_w >= 0 && p.groups >= 1)
      << op << ": need stride >= 1, dilation >= 1, padding >= 0 and groups >= 1; got stride ("
      << p.stride_h << ", " << p.stride_w << "), dilation (" << p.dilation_h << ", " << p.dilation_w
      << "), padding (" << p.pad_h << ", " << p.pad_w << "), groups " << p.groups;
  ConvGeometry g;
  g.p = p;
  g.batch = x.size(0);
  g.in_c = x.size(1);
  g.in_h = x.size(2);
  g.in_w = x.size(3);
  g.out_c = weight.size(0);
  g.k_h = weight.size(2);
  g.k_w = weight.size(3);
  g.groups = p.groups;
  STRATA_CHECK(g.in_c > 0 && g.in_h > 0 && g.in_w > 0)
      << op << ": x " << x.shape_str() << " has an empty channel or spatial dimension";
  STRATA_CHECK(g.out_c > 0 && weight.size(1) > 0 && g.k_h > 0 && g.k_w > 0)
      << op << ": weight " << weight.shape_str() << " has an empty dimension";
  STRATA_CHECK(g.in_c % g.groups == 0 && g.out_c % g.groups == 0)
      << op << ": groups " << g.groups << " must divide both x's channels (" << g.in_c
      << ") and weight's output channels (" << g.out_c << ")";
  STRATA_CHECK_EQ(weight.size(1) * g.groups, g.in_c)
      << op << ": weight " << weight.shape_str() << " with groups " << g.groups << " takes "
      << weight.size(1) * g.groups << " input channels, but x " << x.shape_str() << " has "
      << g.in_c;
  const int64_t span_h = p.dilation_h * (g.k_h - 1) + 1;
  const int64_t span_w = p.dilation_w * (g.k_w - 1) + 1;
  STRATA_CHECK(span_h <= g.in_h + 2 * p.pad_h && span_w <= g.in_w + 2 * p.pad_w)
      << op << ": weight " << weight.shape_str() << " with dilation (" << p.dilation_h << ", "
      << p.dilation_w << ") spans " << span_h << " x " << span_w << ", larger than x "
      << x.shape_str() << " padded by (" << p.pad_h << ", " << p.pad_w << ")";
  g.out_h = conv2d_output_size(g.in_h, g.k_h, p.stride_h, p.pad_h, p.dilation_h);
  g.out_w = conv2d_output_size(g.in_w, g.k_w, p.stride_w, p.pad_w, p.dilation_w);
  g.out_c_g = g.out_c / g.groups;
  g.rows_g = weight.size(1) * g.k_h * g.k_w;
  g.in_plane = g.in_h * g.in_w;
  g.out_plane = g.out_h * g.out_w;
  const bool pointwise = g.k_h == 1 && g.k_w == 1 && p.stride_h == 1 && p.stride_w == 1 &&
                         p.pad_h == 0 && p.pad_w == 0;
  g.direct = pointwise && g.out_plane >= kPointwiseDirectPlane;
  g.taps_h = axis_taps(g.k_h, p.stride_h, p.pad_h, p.dilation_h, g.in_h, g.out_h);
  g.taps_w = axis_taps(g.k_w, p.stride_w, p.pad_w, p.dilation_w, g.in_w, g.out_w);
  return g;
}

// Images per chunk: as many as fit kChunkBudgetBytes (at least one), spread evenly over the
// chunks. `per_image` counts the buffer elements one image needs.
int64_t images_per_chunk(const ConvGeometry& g, int64_t per_image, size_t element_size) {
  if (g.batch <= 1 || g.direct || g.rows_g < kMinRowsForChunks) return 1;
  const int64_t per_image_bytes = std::max<int64_t>(per_image * element_size, 1);
  const int64_t fit = std::clamp<int64_t>(kChunkBudgetBytes / per_image_bytes, 1, g.batch);
  const int64_t chunks = (g.batch + fit - 1) / fit;
  return (g.batch + chunks - 1) / chunks;
}

// A data-movement loop (im2col, col2im, scatter, gather, the bias sum) goes to OpenMP threads
// only in runs of at least this many elements per thread (16 MiB of f32), that is, for a single
// image larger than a chunk; a within-budget chunk is moved by the calling thread. These loops
// sit between gemms, and the OpenMP and OpenBLAS (pthreads) pools each spin-wait after their
// work: libgomp's workers for 300k pause loops (milliseconds on this Xeon), OpenBLAS's with
// sched_yield. A region before a gemm therefore takes cores from it. Measured on 2 cores,
// fanning these loops out for every chunk made conv2d forward 1.4-2.5x slower.
constexpr int64_t kMoveGrainElements = int64_t{1} << 22;
int64_t move_grain(int64_t elements_per_iteration) {
  return std::max<int64_t>(1, kMoveGrainElements / std::max<int64_t>(elements_per_iteration, 1));
}

// cols (C KH KW, nb OH OW): row (c KH + kh) KW + kw, column i OH OW + oh OW + ow holds
// x[i, c, oh sh - ph + kh dh, ow sw - pw + kw dw], or 0 where that falls in the padding.
template <typename T>
void im2col(const ConvGeometry& g, const T* x, int64_t nb, T* cols) {
  const int64_t ld = nb * g.out_plane;
  // Stride 1 with the output as wide as the input ("same" convolutions): a block of output rows
  // is a block of input rows shifted by the column offset, so it copies in one piece.
  const bool same_width = g.p.stride_h == 1 && g.p.stride_w == 1 && g.out_w == g.in_w;
  // One (plane of x, kernel tap) pair: the OH OW entries of one column-matrix row for one image.
  auto copy_tap = [&](const T* plane, const AxisTap& th, const AxisTap& tw, T* out) {
    std::fill(out, out + th.begin * g.out_w, T(0));
    std::fill(out + th.end * g.out_w, out + g.out_plane, T(0));
    if (same_width && tw.begin < tw.end) {
      // Copy the rows whole, then zero the columns that wrapped in from the neighbouring row.
      T* dst = out + th.begin * g.out_w;
      const T* src = plane + (th.begin + th.offset) * g.in_w + tw.offset;
      const int64_t len = (th.end - th.begin) * g.out_w;
      std::copy(src + tw.begin, src + len - (g.out_w - tw.end), dst + tw.begin);
      auto zero_column = [&](int64_t ow) {  // a strided loop: no library call per row
        for (T* cell = dst + ow; cell < dst + len; cell += g.out_w) *cell = T(0);
      };
      for (int64_t ow = 0; ow < tw.begin; ++ow) zero_column(ow);
      for (int64_t ow = tw.end; ow < g.out_w; ++ow) zero_column(ow);
      return;
    }
    for (int64_t oh = th.begin; oh < th.end; ++oh) {
      const T* row = plane + (oh * g.p.stride_h + th.offset) * g.in_w + tw.offset;
      T* dst = out + oh * g.out_w;
      std::fill(dst, dst + tw.begin, T(0));
      for (int64_t ow = tw.begin; ow < tw.end; ++ow) dst[ow] = row[ow * g.p.stride_w];
      std::fill(dst + tw.end, dst + g.out_w, T(0));
    }
  };
  auto rows = [&](int64_t t0, int64_t t1) {  // t = row nb + image
    // Decode t0 once, then step the counters (divisions per task would cost more than copying).
    int64_t i = t0 % nb, kw = (t0 / nb) % g.k_w, kh = (t0 / nb / g.k_w) % g.k_h;
    int64_t c = t0 / nb / g.k_w / g.k_h;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = (c * g.k_h + kh) * g.k_w + kw;
      copy_tap(x + (i * g.in_c + c) * g.in_plane, g.taps_h[kh], g.taps_w[kw],
               cols + r * ld + i * g.out_plane);
      if (++i < nb) continue;
      i = 0;
      if (++kw < g.k_w) continue;
      kw = 0;
      if (++kh < g.k_h) continue;
      kh = 0;
      ++c;
    }
  };
  detail::parallel_for(g.in_c * g.k_h * g.k_w * nb, move_grain(g.out_plane), rows);
}

// The adjoint of im2col: dx[i, c, ih, iw] += every column entry that im2col read from there.
// Each thread owns whole (image, channel) planes of dx. Entries of cols that im2col would have
// taken from the padding have nowhere to go; the "same"-width path zeroes them in cols (a
// scratch buffer) so that a block of rows adds in one contiguous run, as im2col copies it.
template <typename T>
void col2im_add(const ConvGeometry& g, T* cols, int64_t nb, T* dx) {
  const int64_t ld = nb * g.out_plane;
  const bool same_width = g.p.stride_h == 1 && g.p.stride_w == 1 && g.out_w == g.in_w;
  auto add_tap = [&](T* from, const AxisTap& th, const AxisTap& tw, T* plane) {
    if (same_width && tw.begin < tw.end) {
      T* src = from + th.begin * g.out_w;
      T* dst = plane + (th.begin + th.offset) * g.in_w + tw.offset;
      const int64_t len = (th.end - th.begin) * g.out_w;
      auto zero_column = [&](int64_t ow) {
        for (T* cell = src + ow; cell < src + len; cell += g.out_w) *cell = T(0);
      };
      for (int64_t ow = 0; ow < tw.begin; ++ow) zero_column(ow);
      for (int64_t ow = tw.end; ow < g.out_w; ++ow) zero_column(ow);
      for (int64_t j = tw.begin; j < len - (g.out_w - tw.end); ++j) dst[j] += src[j];
      return;
    }
    for (int64_t oh = th.begin; oh < th.end; ++oh) {
      T* row = plane + (oh * g.p.stride_h + th.offset) * g.in_w + tw.offset;
      const T* src = from + oh * g.out_w;
      for (int64_t ow = tw.begin; ow < tw.end; ++ow) row[ow * g.p.stride_w] += src[ow];
    }
  };
  auto planes = [&](int64_t t0, int64_t t1) {  // t = image C + channel
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i = t / g.in_c, c = t % g.in_c;
      for (int64_t kh = 0; kh < g.k_h; ++kh) {
        for (int64_t kw = 0; kw < g.k_w; ++kw) {
          T* from = cols + ((c * g.k_h + kh) * g.k_w + kw) * ld + i * g.out_plane;
          add_tap(from, g.taps_h[kh], g.taps_w[kw], dx + t * g.in_plane);
        }
      }
    }
  };
  detail::parallel_for(nb * g.in_c, move_grain(g.k_h * g.k_w * g.out_plane), planes);
}

// y[i, o, :] = out[o, i-th block of OH OW] + bias[o] for the chunk's nb images; out is
// (OC, nb OH OW). With nb == 1, out may be y itself (then only the bias is added).
template <typename T>
void scatter_output(const ConvGeometry& g, const T* out, int64_t nb, const T* bias, T* y) {
  if (nb == 1 && out == y && bias == nullptr) return;
  const int64_t plane = g.out_plane, ld = nb * plane;
  auto planes = [&](int64_t t0, int64_t t1) {  // t = image OC + output channel
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i = t / g.out_c, o = t % g.out_c;
      const T* src = out + o * ld + i * plane;
      T* dst = y + t * plane;
      const T b = bias != nullptr ? bias[o] : T(0);
      for (int64_t q = 0; q < plane; ++q) dst[q] = src[q] + b;
    }
  };
  detail::parallel_for(nb * g.out_c, move_grain(plane), planes);
}

// The inverse of scatter_output without bias: out (OC, nb OH OW) from dy[i, o, :].
template <typename T>
void gather_output_grad(const ConvGeometry& g, const T* dy, int64_t nb, T* out) {
  const int64_t plane = g.out_plane, ld = nb * plane;
  auto planes = [&](int64_t t0, int64_t t1) {  // t = image OC + output channel
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i = t / g.out_c, o = t % g.out_c;
      std::copy(dy + t * plane, dy + (t + 1) * plane, out + o * ld + i * plane);
    }
  };
  detail::parallel_for(nb * g.out_c, move_grain(plane), planes);
}

// Sum of n values in double, over four interleaved partial sums (one running sum would wait on
// the latency of every add).
template <typename T>
double sum_in_double(const T* v, int64_t n) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int64_t q = 0;
  for (; q + 4 <= n; q += 4) {
    s0 += v[q];
    s1 += v[q + 1];
    s2 += v[q + 2];
    s3 += v[q + 3];
  }
  for (; q < n; ++q) s0 += v[q];
  return (s0 + s1) + (s2 + s3);
}

// dbias[o] += sum of dy[:, o, :, :], accumulated in double.
template <typename T>
void accumulate_bias_grad(const ConvGeometry& g, const T* dy, T* dbias) {
  auto channels = [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      double sum = 0.0;
      for (int64_t b = 0; b < g.batch; ++b) {
        sum += sum_in_double(dy + (b * g.out_c + o) * g.out_plane, g.out_plane);
      }
      dbias[o] += static_cast<T>(sum);
    }
  };
  detail::parallel_for(g.out_c, move_grain(g.batch * g.out_plane), channels);
}

// A scratch tensor of `elements` from the context's allocator (empty when none are needed).
Tensor scratch(ExecContext& ctx, int64_t elements, DType dtype) {
  return elements > 0 ? Tensor::empty({elements}, dtype, &ctx.allocator()) : Tensor();
}

}  // namespace

Tensor conv2d_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const Conv2dParams& params) {
  return conv2d_forward_with(ctx, x, weight, bias, params, Conv2dAlgo::kAuto);
}

Tensor conv2d_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight,
                       const Conv2dParams& params, const Tensor& dweight, const Tensor& dbias,
                       bool need_dx) {
  return conv2d_backward_with(ctx, dy, x, weight, params, dweight, dbias, need_dx,
                              Conv2dAlgo::kAuto);
}

Tensor conv2d_forward_with(ExecContext& ctx, const Tensor& x, const Tensor& weight,
                           const Tensor& bias, const Conv2dParams& params, Conv2dAlgo algo) {
  constexpr const char* kOp = "conv2d_forward";
  const ConvGeometry g = conv_geometry(kOp, x, weight, params);
  if (bias.defined()) {
    detail::check_float(bias, kOp, "bias");
    detail::check_same_dtype(x, bias, kOp, "x", "bias");
    detail::check_shape(bias, {g.out_c}, kOp, "bias");
  }
  Tensor y = Tensor::empty({g.batch, g.out_c, g.out_h, g.out_w}, x.dtype(), &ctx.allocator());
  if (g.batch == 0) return y;
  if (algo == Conv2dAlgo::kAuto && winograd::takes(x, weight, params)) {
    winograd::forward(ctx, x, weight, bias.defined() ? bias.data<float>() : nullptr, params, y);
    return y;
  }
  detail::dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    const T* pw = weight.data<T>();
    const T* pb = bias.defined() ? bias.data<T>() : nullptr;
    T* py = y.data<T>();
    const int64_t col_rows = g.in_c * g.k_h * g.k_w;
    const int64_t nb_max = images_per_chunk(g, (col_rows + g.out_c) * g.out_plane, sizeof(T));
    // cols (C KH KW, nb OH OW), then out (OC, nb OH OW) when a chunk has several images.
    const int64_t col_elems = g.direct ? 0 : col_rows * nb_max * g.out_plane;
    const int64_t out_elems = nb_max > 1 ? g.out_c * nb_max * g.out_plane : 0;
    Tensor buffer = scratch(ctx, col_elems + out_elems, x.dtype());
    T* col_buf = buffer.defined() ? buffer.template data<T>() : nullptr;
    T* out_buf = col_buf + col_elems;
    for (int64_t b0 = 0; b0 < g.batch; b0 += nb_max) {
      const int64_t nb = std::min(nb_max, g.batch - b0);
      const int64_t n = nb * g.out_plane;
      const T* xb = px + b0 * g.in_c * g.in_plane;
      T* yb = py + b0 * g.out_c * g.out_plane;
      const T* cols = xb;
      if (!g.direct) {
        im2col(g, xb, nb, col_buf);
        cols = col_buf;
      }
      T* out = nb == 1 ? yb : out_buf;
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        blas::gemm(ctx, false, false, g.out_c_g, n, g.rows_g, T(1), pw + grp * g.out_c_g * g.rows_g,
                   g.rows_g, cols + grp * g.rows_g * n, n, T(0), out + grp * g.out_c_g * n, n);
      }
      scatter_output(g, out, nb, pb, yb);
    }
  });
  return y;
}

Tensor conv2d_backward_with(ExecContext& ctx, const Tensor& dy, const Tensor& x,
                            const Tensor& weight, const Conv2dParams& params, const Tensor& dweight,
                            const Tensor& dbias, bool need_dx, Conv2dAlgo algo) {
  constexpr const char* kOp = "conv2d_backward";
  const ConvGeometry g = conv_geometry(kOp, x, weight, params);
  detail::check_float(dy, kOp, "dy");
  detail::check_same_dtype(x, dy, kOp, "x", "dy");
  detail::check_shape(dy, {g.batch, g.out_c, g.out_h, g.out_w}, kOp, "dy");
  if (dweight.defined()) {
    detail::check_float(dweight, kOp, "dweight");
    detail::check_same_dtype(x, dweight, kOp, "x", "dweight");
    detail::check_shape(dweight, weight.shape(), kOp, "dweight");
  }
  if (dbias.defined()) {
    detail::check_float(dbias, kOp, "dbias");
    detail::check_same_dtype(x, dbias, kOp, "x", "dbias");
    detail::check_shape(dbias, {g.out_c}, kOp, "dbias");
  }
  const bool use_winograd = algo == Conv2dAlgo::kAuto && winograd::takes(x, weight, params);
  // col2im adds into dx; the direct and Winograd paths write every element of it.
  Tensor dx;
  if (need_dx) {
    dx = g.direct || use_winograd ? Tensor::empty(x.shape(), x.dtype(), &ctx.allocator())
                                  : Tensor::zeros(x.shape(), x.dtype(), &ctx.allocator());
  }
  if (g.batch == 0) return dx;
  detail::dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = dy.data<T>();
    if (dbias.defined()) accumulate_bias_grad(g, pdy, dbias.data<T>());
    if (!need_dx && !dweight.defined()) return;
    if constexpr (std::is_same_v<T, float>) {
      if (use_winograd) {
        winograd::backward(ctx, dy, x, weight, params,
                           dweight.defined() ? dweight.data<float>() : nullptr,
                           need_dx ? dx.data<float>() : nullptr);
        return;
      }
    }
    const T* px = x.data<T>();
    const T* pw = weight.data<T>();
    T* pdw = dweight.defined() ? dweight.data<T>() : nullptr;
    T* pdx = need_dx ? dx.template data<T>() : nullptr;
    const int64_t col_rows = g.in_c * g.k_h * g.k_w;
    const int64_t nb_max = images_per_chunk(g, (col_rows + g.out_c) * g.out_plane, sizeof(T));
    // cols (C KH KW, nb OH OW), reused for dcols; then dy_g (OC, nb OH OW) for several images.
    const int64_t col_elems = g.direct ? 0 : col_rows * nb_max * g.out_plane;
    const int64_t dy_elems = nb_max > 1 ? g.out_c * nb_max * g.out_plane : 0;
    Tensor buffer = scratch(ctx, col_elems + dy_elems, x.dtype());
    T* col_buf = buffer.defined() ? buffer.template data<T>() : nullptr;
    T* dy_buf = col_buf + col_elems;
    for (int64_t b0 = 0; b0 < g.batch; b0 += nb_max) {
      const int64_t nb = std::min(nb_max, g.batch - b0);
      const int64_t n = nb * g.out_plane;
      const T* xb = px + b0 * g.in_c * g.in_plane;
      const T* dyb = pdy + b0 * g.out_c * g.out_plane;
      const T* dy_mat = dyb;
      if (nb > 1) {
        gather_output_grad(g, dyb, nb, dy_buf);
        dy_mat = dy_buf;
      }
      if (pdw != nullptr) {
        const T* cols = xb;
        if (!g.direct) {
          im2col(g, xb, nb, col_buf);
          cols = col_buf;
        }
        for (int64_t grp = 0; grp < g.groups; ++grp) {
          blas::gemm(ctx, false, true, g.out_c_g, g.rows_g, n, T(1), dy_mat + grp * g.out_c_g * n,
                     n, cols + grp * g.rows_g * n, n, T(1), pdw + grp * g.out_c_g * g.rows_g,
                     g.rows_g);
        }
      }
      if (pdx != nullptr) {
        // The direct path's dcols are dx itself.
        T* dxb = pdx + b0 * g.in_c * g.in_plane;
        T* dcols = g.direct ? dxb : col_buf;
        for (int64_t grp = 0; grp < g.groups; ++grp) {
          blas::gemm(ctx, true, false, g.rows_g, n, g.out_c_g, T(1),
                     pw + grp * g.out_c_g * g.rows_g, g.rows_g, dy_mat + grp * g.out_c_g * n, n,
                     T(0), dcols + grp * g.rows_g * n, n);
        }
        if (!g.direct) col2im_add(g, col_buf, nb, dxb);
      }
    }
  });
  return dx;
}

}  // namespace strata::ops::cpu
