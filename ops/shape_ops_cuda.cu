// Data movement on CUDA, for every dtype: elements are moved as opaque words, widened to 2, 4, 8
// or 16 bytes wherever sizes, strides and pointers allow, and no value changes.
//
// permute_copy drops size-1 dimensions and merges neighbours that are contiguous in the source
// like the CPU. When the source's stride-1 dimension stays innermost (or there is none), every
// thread turns its flat output index into a source offset (a coalesced gather: runs along the
// innermost dimension are contiguous on both sides). When the permute moves the source's stride-1
// dimension away from the innermost place (a transpose), 32 x 32 tiles go through shared memory
// so that both the reads and the writes are coalesced.
// concat and split see each tensor as (outer, size along dim x inner) and copy one strided 2-D
// block per piece (a plain cudaMemcpyAsync when the block is contiguous on both sides).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ops/pointwise_cuda_util.cuh"
#include "ops/shape_ops.h"

namespace strata::ops::cuda {
namespace {

namespace cd = ::strata::ops::cuda_detail;
using ::strata::cuda::CudaExec;

constexpr int kMaxDims = 12;
constexpr int kThreads = 256;

// Calls f(W{}) with W a word type of `bytes` bytes (1, 2, 4, 8 or 16).
template <typename F>
void dispatch_word(size_t bytes, F&& f) {
  switch (bytes) {
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
      f(uint2{});
      return;
    case 16:
      f(uint4{});
      return;
  }
  STRATA_THROW() << "unsupported element size " << bytes;
}

void check_defined_device(const Tensor& t, const ExecContext& ctx, const char* op,
                          const std::string& name) {
  cd::check_on_device(t, ctx, op, name.c_str());
}

// check_cuda for the block copies of concat and split; a tensor without elements has no layout
// to check (as on the CPU).
void check_blocks(const Tensor& t, const ExecContext& ctx, const char* op,
                  const std::string& name) {
  check_defined_device(t, ctx, op, name);
  if (t.numel() > 0) {
    STRATA_CHECK(t.is_contiguous())
        << op << ": " << name << " " << t.str() << " must be contiguous";
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

// ---- permute_copy -------------------------------------------------------------------------------

struct GatherLayout {
  int nd;
  int64_t size[kMaxDims];
  int64_t stride[kMaxDims];  // source strides, in words
};

// dst[i] = src[offset(i)] for the row-major walk over the layout.
template <typename W, typename I>
__global__ void gather_kernel(I n, GatherLayout l, const W* __restrict__ src, W* __restrict__ dst) {
  const I step = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    I rem = i, off = 0;
    for (int d = l.nd - 1; d >= 0; --d) {
      const I s = static_cast<I>(l.size[d]);
      const I q = rem / s;
      off += (rem - q * s) * static_cast<I>(l.stride[d]);
      rem = q;
    }
    dst[i] = src[off];
  }
}

// A batched transpose: dimension `a` has source stride 1, the last dimension `b` has output
// stride 1; the other dimensions form the batch.
struct TransposeLayout {
  int64_t size_a, size_b;
  int64_t src_stride_b;  // source stride of b (a's is 1)
  int64_t dst_stride_a;  // output stride of a (b's is 1)
  int64_t tiles_a, tiles_b, batch;
  int nb;  // batch dimensions
  int64_t bsize[kMaxDims];
  int64_t bsrc[kMaxDims];
  int64_t bdst[kMaxDims];
};

constexpr int kTile = 32;
constexpr int kTileRows = 8;

template <typename W>
__global__ void transpose_kernel(TransposeLayout l, const W* __restrict__ src,
                                 W* __restrict__ dst) {
  __shared__ W tile[kTile][kTile + 1];  // [b][a]
  const int64_t tiles = l.tiles_a * l.tiles_b * l.batch;
  for (int64_t tile_id = blockIdx.x; tile_id < tiles; tile_id += gridDim.x) {
    const int64_t tb = tile_id % l.tiles_b;
    const int64_t rest = tile_id / l.tiles_b;
    const int64_t ta = rest % l.tiles_a;
    int64_t bi = rest / l.tiles_a;
    int64_t src_base = 0, dst_base = 0;
    for (int d = l.nb - 1; d >= 0; --d) {
      const int64_t q = bi / l.bsize[d];
      const int64_t r = bi - q * l.bsize[d];
      src_base += r * l.bsrc[d];
      dst_base += r * l.bdst[d];
      bi = q;
    }
    const int64_t a0 = ta * kTile, b0 = tb * kTile;
    // Read: threadIdx.x along a (source stride 1).
    {
      const int64_t a = a0 + threadIdx.x;
#pragma unroll
      for (int i = 0; i < kTile; i += kTileRows) {
        const int64_t b = b0 + threadIdx.y + i;
        if (a < l.size_a && b < l.size_b) {
          tile[threadIdx.y + i][threadIdx.x] = src[src_base + a + b * l.src_stride_b];
        }
      }
    }
    __syncthreads();
    // Write: threadIdx.x along b (output stride 1).
    {
      const int64_t b = b0 + threadIdx.x;
#pragma unroll
      for (int i = 0; i < kTile; i += kTileRows) {
        const int64_t a = a0 + threadIdx.y + i;
        if (a < l.size_a && b < l.size_b) {
          dst[dst_base + a * l.dst_stride_a + b] = tile[threadIdx.x][threadIdx.y + i];
        }
      }
    }
    __syncthreads();  // the tile is reused by the next iteration
  }
}

// The widest word (up to 16 bytes) that moves whole runs of the innermost dimension: the
// innermost stride must be 1 and every byte size, stride and pointer a multiple of it.
size_t widest_word(size_t es, const Shape& sizes, const Shape& strides, const void* src,
                   const void* dst) {
  if (strides.back() != 1) return es;
  for (size_t v = 16; v > es; v /= 2) {
    bool ok = v % es == 0 && (static_cast<size_t>(sizes.back()) * es) % v == 0 &&
              cd::aligned_to(src, v) && cd::aligned_to(dst, v);
    for (size_t d = 0; ok && d + 1 < sizes.size(); ++d) {
      ok = (static_cast<size_t>(strides[d]) * es) % v == 0;
    }
    if (ok) return v;
  }
  return es;
}

void launch_gather(const CudaExec& ex, Shape sizes, Shape strides, size_t es, const void* src,
                   void* dst, int64_t numel) {
  const size_t word = widest_word(es, sizes, strides, src, dst);
  const int64_t ratio = static_cast<int64_t>(word / es);
  sizes.back() /= ratio;
  for (size_t d = 0; d + 1 < strides.size(); ++d) strides[d] /= ratio;
  const int64_t n = numel / ratio;
  GatherLayout l{};
  l.nd = static_cast<int>(sizes.size());
  int64_t max_offset = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    l.size[d] = sizes[d];
    l.stride[d] = strides[d];
    max_offset += (sizes[d] - 1) * strides[d];
  }
  const bool small = n < (int64_t{1} << 31) && max_offset < (int64_t{1} << 31);
  const unsigned blocks = ::strata::cuda::blocks_for(n, kThreads, ex);
  dispatch_word(word, [&](auto tag) {
    using W = decltype(tag);
    if (small) {
      gather_kernel<W, uint32_t><<<blocks, kThreads, 0, ex.stream()>>>(
          static_cast<uint32_t>(n), l, static_cast<const W*>(src), static_cast<W*>(dst));
    } else {
      gather_kernel<W, int64_t><<<blocks, kThreads, 0, ex.stream()>>>(
          n, l, static_cast<const W*>(src), static_cast<W*>(dst));
    }
    STRATA_CUDA_LAUNCH_CHECK("gather_kernel");
  });
}

void launch_transpose(const CudaExec& ex, const Shape& sizes, const Shape& strides, size_t a,
                      size_t es, const void* src, void* dst) {
  const size_t nd = sizes.size();
  const Shape out_strides = contiguous_strides(sizes);
  TransposeLayout l{};
  l.size_a = sizes[a];
  l.size_b = sizes[nd - 1];
  l.src_stride_b = strides[nd - 1];
  l.dst_stride_a = out_strides[a];
  l.tiles_a = (l.size_a + kTile - 1) / kTile;
  l.tiles_b = (l.size_b + kTile - 1) / kTile;
  l.batch = 1;
  l.nb = 0;
  for (size_t d = 0; d + 1 < nd; ++d) {
    if (d == a) continue;
    l.bsize[l.nb] = sizes[d];
    l.bsrc[l.nb] = strides[d];
    l.bdst[l.nb] = out_strides[d];
    l.batch *= sizes[d];
    ++l.nb;
  }
  const int64_t tiles = l.tiles_a * l.tiles_b * l.batch;
  const int64_t cap = static_cast<int64_t>(std::max(ex.sm_count(), 1)) * 16;
  const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min(tiles, cap)));
  dispatch_word(es, [&](auto tag) {
    using W = decltype(tag);
    transpose_kernel<W><<<blocks, dim3(kTile, kTileRows), 0, ex.stream()>>>(
        l, static_cast<const W*>(src), static_cast<W*>(dst));
    STRATA_CUDA_LAUNCH_CHECK("transpose_kernel");
  });
}

// ---- concat / split -----------------------------------------------------------------------------

// Copies `height` rows of `width` words from src (row pitch spitch) to dst (row pitch dpitch).
template <typename W>
__global__ void copy2d_kernel(int64_t height, int64_t width, const W* __restrict__ src,
                              int64_t spitch, W* __restrict__ dst, int64_t dpitch) {
  const int64_t n = height * width;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t row = i / width;
    const int64_t col = i - row * width;
    dst[row * dpitch + col] = src[row * spitch + col];
  }
}

// A 2-D block copy in bytes on the stream.
void copy2d(const CudaExec& ex, int64_t height, int64_t width, const char* src, int64_t spitch,
            char* dst, int64_t dpitch) {
  if (height == 0 || width == 0) return;
  if (height == 1 || (width == spitch && width == dpitch)) {
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(height * width),
                                      cudaMemcpyDeviceToDevice, ex.stream()));
    return;
  }
  size_t word = 16;
  while (word > 1 &&
         !(width % static_cast<int64_t>(word) == 0 && spitch % static_cast<int64_t>(word) == 0 &&
           dpitch % static_cast<int64_t>(word) == 0 && cd::aligned_to(src, word) &&
           cd::aligned_to(dst, word))) {
    word /= 2;
  }
  const int64_t w = static_cast<int64_t>(word);
  const unsigned blocks = ::strata::cuda::blocks_for(height * (width / w), kThreads, ex);
  dispatch_word(word, [&](auto tag) {
    using W = decltype(tag);
    copy2d_kernel<W>
        <<<blocks, kThreads, 0, ex.stream()>>>(height, width / w, reinterpret_cast<const W*>(src),
                                               spitch / w, reinterpret_cast<W*>(dst), dpitch / w);
    STRATA_CUDA_LAUNCH_CHECK("copy2d_kernel");
  });
}

}  // namespace

Tensor permute_copy(ExecContext& ctx, const Tensor& x, const std::vector<int64_t>& dims) {
  constexpr const char* kOp = "permute_copy";
  CudaExec& ex = ::strata::cuda::exec(ctx, kOp);
  check_defined_device(x, ctx, kOp, "x");
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
  STRATA_CHECK_LE(sizes.size(), static_cast<size_t>(kMaxDims))
      << kOp << ": x " << x.str() << " permuted by dims has " << sizes.size()
      << " dimensions after merging; the CUDA kernel takes at most " << kMaxDims;
  const size_t es = x.element_size();
  const void* src = x.raw_data();
  void* dst = y.raw_data();
  if (sizes.size() == 1 && steps[0] == 1) {  // a plain copy
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, y.nbytes(), cudaMemcpyDeviceToDevice, ex.stream()));
    return y;
  }
  // The source's stride-1 dimension, when it is not already innermost: a transpose.
  size_t unit = sizes.size();
  for (size_t d = 0; d + 1 < sizes.size(); ++d) {
    if (steps[d] == 1) unit = d;
  }
  if (unit < sizes.size() && steps.back() != 1 && sizes[unit] > 1) {
    launch_transpose(ex, sizes, steps, unit, es, src, dst);
  } else {
    launch_gather(ex, sizes, steps, es, src, dst, y.numel());
  }
  return y;
}

Tensor concat(ExecContext& ctx, const TensorList& xs, int64_t dim) {
  constexpr const char* kOp = "concat";
  CudaExec& ex = ::strata::cuda::exec(ctx, kOp);
  STRATA_CHECK(!xs.empty()) << kOp << ": needs at least one tensor";
  const Tensor& first = xs[0];
  check_blocks(first, ctx, kOp, "xs[0]");
  STRATA_CHECK_GE(first.dim(), 1) << kOp << ": xs[0] is a scalar; concat needs dimensions";
  const int64_t d = wrap_dim(dim, first.dim(), kOp, first, "xs[0]");
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const std::string name = "xs[" + std::to_string(i) + "]";
    check_blocks(xs[i], ctx, kOp, name);
    cd::check_same_dtype(xs[i], first, kOp, name.c_str(), "xs[0]");
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
  int64_t column = 0;  // bytes into an output row
  for (const Tensor& x : xs) {
    const int64_t bytes = x.size(d) * inner * es;
    if (bytes == 0) continue;
    copy2d(ex, outer, bytes, static_cast<const char*>(x.raw_data()), bytes, out + column,
           row_bytes);
    column += bytes;
  }
  return y;
}

TensorList split(ExecContext& ctx, const Tensor& x, const std::vector<int64_t>& sizes,
                 int64_t dim) {
  constexpr const char* kOp = "split";
  CudaExec& ex = ::strata::cuda::exec(ctx, kOp);
  check_blocks(x, ctx, kOp, "x");
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
  int64_t column = 0;
  for (const Tensor& p : pieces) {
    const int64_t bytes = p.size(d) * inner * es;
    if (bytes == 0) continue;
    copy2d(ex, outer, bytes, in + column, row_bytes, static_cast<char*>(p.raw_data()), bytes);
    column += bytes;
  }
  return pieces;
}

}  // namespace strata::ops::cuda
