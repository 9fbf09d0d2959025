// Element-wise arithmetic on CUDA: f32, bf16 and f16, computed in f32.
//
// add/mul with equal shapes, scale and add_ are flat maps with 16-byte vector accesses when every
// pointer allows it. Broadcasting add/mul lay both operands over the output shape like the CPU
// (stride 0 along broadcast dimensions, size-1 dimensions dropped, neighbours contiguous in both
// operands merged) and every thread turns its flat output index into the two operand offsets
// (32-bit arithmetic when the output has fewer than 2^31 elements).
//
// sum_to_shape groups t's dimensions into kept and reduced runs like the CPU and accumulates in
// double. When the innermost dimension is kept (a bias gradient), a block of 32 x 8 threads sums a
// tile of 32 output columns over a range of the reduced positions; when it is reduced, a block
// sums a range of the contiguous runs of one output element. When there are too few outputs to
// fill the GPU, the reduced range is split over blocks that write partial sums to scratch, and a
// second kernel adds the partials in a fixed order: no atomics, deterministic results.
#include <algorithm>
#include <vector>

#include "ops/elementwise.h"
#include "ops/pointwise_cuda_util.cuh"

namespace strata::ops::cuda {
namespace {

namespace cd = ::strata::ops::cuda_detail;
using ::strata::cuda::CudaExec;

constexpr int kMaxDims = 8;

// ---- add / mul ----------------------------------------------------------------------------------

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MulOp {
  __device__ float operator()(float a, float b) const { return a * b; }
};
struct ScaleOp {
  float s;
  __device__ float operator()(float v) const { return s * v; }
};
// dst + src, or dst + s * src rounded like the CPU (no fused multiply-add).
struct AxpyOp {
  float s;
  bool unit;
  __device__ float operator()(float d, float v) const {
    return unit ? __fadd_rn(d, v) : __fadd_rn(d, __fmul_rn(s, v));
  }
};

struct BroadcastLayout {
  int ndim;
  int64_t size[kMaxDims];
  int64_t sa[kMaxDims];
  int64_t sb[kMaxDims];
};

template <typename T, typename Op, typename I>
__global__ void broadcast_kernel(I n, BroadcastLayout l, const T* __restrict__ a,
                                 const T* __restrict__ b, T* __restrict__ y, Op op) {
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    I rem = i, oa = 0, ob = 0;
    for (int d = l.ndim - 1; d >= 0; --d) {
      const I s = static_cast<I>(l.size[d]);
      const I q = rem / s;
      const I r = rem - q * s;
      oa += r * static_cast<I>(l.sa[d]);
      ob += r * static_cast<I>(l.sb[d]);
      rem = q;
    }
    y[i] = cd::from_f32<T>(op(cd::to_f32(a[oa]), cd::to_f32(b[ob])));
  }
}

// Strides of an operand (contiguous, `shape`) seen through the `ndim`-dimensional output.
Shape broadcast_strides(const Shape& shape, size_t ndim) {
  const Shape own = contiguous_strides(shape);
  Shape strides(ndim, 0);
  const size_t lead = ndim - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) strides[lead + d] = shape[d] == 1 ? 0 : own[d];
  return strides;
}

BroadcastLayout broadcast_layout(const Shape& a, const Shape& b, const Shape& out, const char* op) {
  const Shape sa = broadcast_strides(a, out.size()), sb = broadcast_strides(b, out.size());
  Shape shape, as, bs;
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;
    if (!shape.empty() && as.back() == sa[d] * out[d] && bs.back() == sb[d] * out[d]) {
      shape.back() *= out[d];
      as.back() = sa[d];
      bs.back() = sb[d];
      continue;
    }
    shape.push_back(out[d]);
    as.push_back(sa[d]);
    bs.push_back(sb[d]);
  }
  if (shape.empty()) {
    shape = {1};
    as = {1};
    bs = {1};
  }
  STRATA_CHECK_LE(shape.size(), static_cast<size_t>(kMaxDims))
      << op << ": a " << shape_str(a) << " and b " << shape_str(b) << " broadcast over "
      << shape.size() << " dimensions after merging; the CUDA kernel takes at most " << kMaxDims;
  BroadcastLayout l{};
  l.ndim = static_cast<int>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    l.size[d] = shape[d];
    l.sa[d] = as[d];
    l.sb[d] = bs[d];
  }
  return l;
}

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

template <typename Op>
Tensor binary(ExecContext& ctx, const Tensor& a, const Tensor& b, const char* op_name, Op op) {
  CudaExec& x = ::strata::cuda::exec(ctx, op_name);
  cd::check_float(a, ctx, op_name, "a");
  cd::check_float(b, ctx, op_name, "b");
  cd::check_same_dtype(a, b, op_name, "a", "b");
  const Shape out_shape = broadcast_checked(a, b, op_name);
  Tensor y = Tensor::empty(out_shape, a.dtype(), &ctx.allocator());
  const int64_t n = y.numel();
  if (n == 0) return y;
  cd::dispatch_float(a.dtype(), op_name, [&](auto tag) {
    using T = decltype(tag);
    const T* pa = static_cast<const T*>(a.raw_data());
    const T* pb = static_cast<const T*>(b.raw_data());
    T* py = static_cast<T*>(y.raw_data());
    if (a.shape() == b.shape()) {
      cd::launch_binary_map(x, n, pa, pb, py, op);
      return;
    }
    const BroadcastLayout l = broadcast_layout(a.shape(), b.shape(), out_shape, op_name);
    constexpr int kThreads = 256;
    const unsigned blocks = ::strata::cuda::blocks_for(n, kThreads, x);
    if (n < (int64_t{1} << 31)) {
      broadcast_kernel<T, Op, uint32_t>
          <<<blocks, kThreads, 0, x.stream()>>>(static_cast<uint32_t>(n), l, pa, pb, py, op);
    } else {
      broadcast_kernel<T, Op, int64_t><<<blocks, kThreads, 0, x.stream()>>>(n, l, pa, pb, py, op);
    }
    STRATA_CUDA_LAUNCH_CHECK("broadcast_kernel");
  });
  return y;
}

// ---- sum_to_shape -------------------------------------------------------------------------------

// Row-major walk over `nd` dimensions: flat index -> element offset.
struct Walk {
  int nd;
  int64_t size[kMaxDims];
  int64_t stride[kMaxDims];

  __device__ __forceinline__ int64_t offset(int64_t idx) const {
    if (nd == 0) return 0;
    if (nd == 1) return idx * stride[0];
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; --d) {
      const int64_t q = idx / size[d];
      off += (idx - q * size[d]) * stride[d];
      idx = q;
    }
    return off;
  }
};

Walk make_walk(const Shape& sizes, const Shape& strides, const Tensor& t) {
  STRATA_CHECK_LE(sizes.size(), static_cast<size_t>(kMaxDims))
      << "sum_to_shape: t " << t.shape_str() << " has " << sizes.size()
      << " alternating kept/reduced dimension groups; the CUDA kernel takes at most " << kMaxDims;
  Walk w{};
  w.nd = static_cast<int>(sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) {
    w.size[d] = sizes[d];
    w.stride[d] = strides[d];
  }
  return w;
}

constexpr int kColTile = 32;  // output columns per block (threadIdx.x)
constexpr int kColRows = 8;   // reduced positions in flight per block (threadIdx.y)

// out[k, c] (or partial[s, k, c]) = sum over r in split s of t[kept(k) + reduced(r) + c].
template <typename T>
__global__ void sum_cols_kernel(const T* __restrict__ t, Walk kept, Walk reduced, int64_t n_kept,
                                int64_t n_reduced, int64_t inner, int64_t chunk,
                                T* __restrict__ out, double* __restrict__ partial) {
  __shared__ double tile[kColRows][kColTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.z) * chunk;
  const int64_t r1 = min(n_reduced, r0 + chunk);
  for (int64_t k = blockIdx.y; k < n_kept; k += gridDim.y) {
    const T* base = t + kept.offset(k);
    double acc = 0.0;
    if (c < inner) {
      for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) {
        acc += static_cast<double>(cd::to_f32(base[reduced.offset(r) + c]));
      }
    }
    tile[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < inner) {
      double sum = 0.0;
#pragma unroll
      for (int i = 0; i < kColRows; ++i) sum += tile[i][threadIdx.x];
      if (partial == nullptr) {
        out[k * inner + c] = cd::from_f32<T>(static_cast<float>(sum));
      } else {
        partial[(static_cast<int64_t>(blockIdx.z) * n_kept + k) * inner + c] = sum;
      }
    }
    __syncthreads();  // the tile is reused by the next k
  }
}

constexpr int kRunThreads = 256;

// out[k] (or partial[s, k]) = sum over j in split s of t[kept(k) + reduced(j / inner) + j % inner].
template <typename T>
__global__ void sum_runs_kernel(const T* __restrict__ t, Walk kept, Walk reduced, int64_t n_kept,
                                int64_t total, int64_t inner, int64_t chunk, T* __restrict__ out,
                                double* __restrict__ partial) {
  __shared__ double warp_sums[kRunThreads / 32];
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t j1 = min(total, j0 + chunk);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t k = blockIdx.y; k < n_kept; k += gridDim.y) {
    const T* base = t + kept.offset(k);
    double acc = 0.0;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += kRunThreads) {
      const int64_t r = j / inner;
      acc += static_cast<double>(cd::to_f32(base[reduced.offset(r) + (j - r * inner)]));
    }
    acc = cd::warp_sum(acc);
    if (lane == 0) warp_sums[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      double sum = 0.0;
#pragma unroll
      for (int i = 0; i < kRunThreads / 32; ++i) sum += warp_sums[i];
      if (partial == nullptr) {
        out[k] = cd::from_f32<T>(static_cast<float>(sum));
      } else {
        partial[static_cast<int64_t>(blockIdx.x) * n_kept + k] = sum;
      }
    }
    __syncthreads();
  }
}

// out[i] = sum over s of partial[s, i], in order of s.
template <typename T>
__global__ void sum_partials_kernel(const double* __restrict__ partial, int64_t n, int splits,
                                    T* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    double sum = 0.0;
    for (int s = 0; s < splits; ++s) sum += partial[static_cast<int64_t>(s) * n + i];
    out[i] = cd::from_f32<T>(static_cast<float>(sum));
  }
}

int64_t product(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

}  // namespace

Tensor add(ExecContext& ctx, const Tensor& a, const Tensor& b) {
  return binary(ctx, a, b, "add", AddOp{});
}

Tensor mul(ExecContext& ctx, const Tensor& a, const Tensor& b) {
  return binary(ctx, a, b, "mul", MulOp{});
}

Tensor scale(ExecContext& ctx, const Tensor& x, double alpha) {
  constexpr const char* kOp = "scale";
  CudaExec& ex = ::strata::cuda::exec(ctx, kOp);
  cd::check_float(x, ctx, kOp, "x");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  cd::dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    cd::launch_unary_map(ex, x.numel(), static_cast<const T*>(x.raw_data()),
                         static_cast<T*>(y.raw_data()), ScaleOp{static_cast<float>(alpha)});
  });
  return y;
}

void add_(ExecContext& ctx, const Tensor& dst, const Tensor& src, double alpha) {
  constexpr const char* kOp = "add_";
  CudaExec& ex = ::strata::cuda::exec(ctx, kOp);
  cd::check_float(dst, ctx, kOp, "dst");
  cd::check_float(src, ctx, kOp, "src");
  cd::check_same_dtype(dst, src, kOp, "dst", "src");
  cd::check_shape(src, dst.shape(), kOp, "src");
  cd::dispatch_float(dst.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    T* pd = static_cast<T*>(dst.raw_data());
    // src may alias dst: every element is read and written by the same thread.
    cd::launch_binary_map(ex, dst.numel(), static_cast<const T*>(pd),
                          static_cast<const T*>(src.raw_data()), pd,
                          AxpyOp{static_cast<float>(alpha), alpha == 1.0});
  });
}

Tensor sum_to_shape(ExecContext& ctx, const Tensor& t, const Shape& shape) {
  constexpr const char* kOp = "sum_to_shape";
  CudaExec& ex = ::strata::cuda::exec(ctx, kOp);
  cd::check_float(t, ctx, kOp, "t");
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
  Tensor out = Tensor::empty(shape, t.dtype(), &ctx.allocator());
  if (t.numel() == 0) {
    if (out.nbytes() > 0) {
      STRATA_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), ex.stream()));
    }
    return out;
  }

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
  const Walk kept_walk = make_walk(kept_sizes, kept_strides, t);
  const Walk reduced_walk = make_walk(reduced_sizes, reduced_strides, t);
  const int64_t n_kept = product(kept_sizes);
  const int64_t n_reduced = product(reduced_sizes);
  const int64_t inner = sizes.back();
  const int64_t n_out = out.numel();  // n_kept * inner or n_kept
  const int64_t target_blocks = static_cast<int64_t>(std::max(ex.sm_count(), 1)) * 4;
  const unsigned grid_k = static_cast<unsigned>(std::min<int64_t>(n_kept, 65535));

  cd::dispatch_float(t.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* pt = static_cast<const T*>(t.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    int64_t splits = 1, chunk = 0;
    if (kept.back()) {
      const int64_t col_blocks = (inner + kColTile - 1) / kColTile;
      const int64_t base = col_blocks * grid_k;
      // Split the reduced positions when the outputs alone give too few blocks, keeping at least
      // 64 positions per split.
      if (base < target_blocks) {
        splits = std::min<int64_t>((target_blocks + base - 1) / base,
                                   std::max<int64_t>(1, n_reduced / 64));
        splits = std::min<int64_t>(splits, 1024);
      }
      chunk = (n_reduced + splits - 1) / splits;
      splits = (n_reduced + chunk - 1) / chunk;  // no empty split
      Tensor partial_sums;
      if (splits > 1) {
        partial_sums = ::strata::cuda::scratch(
            ctx, static_cast<size_t>(splits * n_out) * sizeof(double), "sum_to_shape partial sums");
      }
      double* partial = splits > 1 ? static_cast<double*>(partial_sums.raw_data()) : nullptr;
      const dim3 grid(static_cast<unsigned>(col_blocks), grid_k, static_cast<unsigned>(splits));
      sum_cols_kernel<T><<<grid, dim3(kColTile, kColRows), 0, ex.stream()>>>(
          pt, kept_walk, reduced_walk, n_kept, n_reduced, inner, chunk, po, partial);
      STRATA_CUDA_LAUNCH_CHECK("sum_cols_kernel");
      if (splits > 1) {
        sum_partials_kernel<T><<<::strata::cuda::blocks_for(n_out, 256, ex), 256, 0, ex.stream()>>>(
            partial, n_out, static_cast<int>(splits), po);
        STRATA_CUDA_LAUNCH_CHECK("sum_partials_kernel");
      }
    } else {
      const int64_t total = n_reduced * inner;  // elements summed into each output
      const int64_t base = grid_k;
      if (base < target_blocks) {
        splits = std::min<int64_t>((target_blocks + base - 1) / base,
                                   std::max<int64_t>(1, total / (kRunThreads * 8)));
        splits = std::min<int64_t>(splits, 65535);
      }
      chunk = (total + splits - 1) / splits;
      splits = (total + chunk - 1) / chunk;
      Tensor partial_sums;
      if (splits > 1) {
        partial_sums = ::strata::cuda::scratch(
            ctx, static_cast<size_t>(splits * n_out) * sizeof(double), "sum_to_shape partial sums");
      }
      double* partial = splits > 1 ? static_cast<double*>(partial_sums.raw_data()) : nullptr;
      const dim3 grid(static_cast<unsigned>(splits), grid_k);
      sum_runs_kernel<T><<<grid, kRunThreads, 0, ex.stream()>>>(pt, kept_walk, reduced_walk, n_kept,
                                                                total, inner, chunk, po, partial);
      STRATA_CUDA_LAUNCH_CHECK("sum_runs_kernel");
      if (splits > 1) {
        sum_partials_kernel<T><<<::strata::cuda::blocks_for(n_out, 256, ex), 256, 0, ex.stream()>>>(
            partial, n_out, static_cast<int>(splits), po);
        STRATA_CUDA_LAUNCH_CHECK("sum_partials_kernel");
      }
    }
  });
  return out;
}

}  // namespace strata::ops::cuda
