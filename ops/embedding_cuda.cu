// Embedding lookup on CUDA (embedding_cpu.cpp is the specification).
//
// Forward: a warp per id copies the weight row with the widest word (16, 8, 4 or 2 bytes) that
// the row size and both pointers allow; the copy is dtype-agnostic.
//
// Backward, deterministic and without floating-point atomics: the ids are validated and paired
// with their positions, the pairs are sorted by id with CUB's (stable) radix sort over only the
// bits V needs, and a block per distinct id (the first position of each run of equal ids) sums
// the dy rows of that id in f32, in position order, column-parallel, then adds the sum into
// dweight once (one rounding for bf16/f16 tables). Each dweight row is written by one block, so
// the result does not depend on scheduling. Costs: the sort (a few passes over 8 bytes per id),
// one read of dy and one read-modify-write of the touched dweight rows.
//
// Ids are checked on the device, without synchronizing: an id outside [0, V) prints the op, its
// flat position and V, and traps (the context is unusable afterwards, as after PyTorch's
// device-side asserts).
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cstdio>

#include "ops/embedding.h"
#include "ops/loss_cuda_common.cuh"

namespace strata::ops::cuda {
namespace {

using namespace ::strata::ops::cuda_detail;

constexpr const char* kForward = "embedding_forward";
constexpr const char* kBackward = "embedding_backward";

__device__ __noinline__ void report_bad_id(bool forward, int64_t id, int64_t pos, int64_t vocab) {
  printf("%s: id %lld at flat position %lld of ids is outside [0, V) with V = %lld\n",
         forward ? "embedding_forward" : "embedding_backward", static_cast<long long>(id),
         static_cast<long long>(pos), static_cast<long long>(vocab));
  __trap();
}

void check_table(const Tensor& w, const ExecContext& ctx, const char* op, const char* name) {
  check_float(w, ctx, op, name);
  STRATA_CHECK(w.dim() == 2) << op << ": " << name << " must be (V, C), got " << w.shape_str();
}

// y[i, :] = weight[ids[i], :], rows of `words` words of type W; a warp per row.
template <typename W>
__global__ void __launch_bounds__(256)
    embedding_forward_kernel(const void* __restrict__ ids, bool ids64, int64_t n, int64_t vocab,
                             const W* __restrict__ weight, W* __restrict__ y, int64_t words) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t i = warp; i < n; i += warps) {
    const int64_t id = load_index(ids, ids64, i);
    if (id < 0 || id >= vocab) {
      if (lane == 0) report_bad_id(true, id, i, vocab);
      continue;
    }
    const W* src = weight + id * words;
    W* dst = y + i * words;
    for (int64_t q = lane; q < words; q += 32) dst[q] = src[q];
  }
}

template <typename W>
void launch_forward(const ::strata::cuda::CudaExec& x, const Tensor& ids, int64_t vocab,
                    const Tensor& weight, const Tensor& y, int64_t row_bytes) {
  const int64_t n = ids.numel();
  const int64_t words = row_bytes / static_cast<int64_t>(sizeof(W));
  const int threads = 256;
  const unsigned blocks = ::strata::cuda::blocks_for(n * 32, threads, x);
  embedding_forward_kernel<W><<<blocks, threads, 0, x.stream()>>>(
      ids.raw_data(), ids.dtype() == DType::kI64, n, vocab,
      static_cast<const W*>(weight.raw_data()), static_cast<W*>(y.raw_data()), words);
  STRATA_CUDA_LAUNCH_CHECK("embedding_forward_kernel");
}

// keys[i] = ids[i] (checked to be in [0, V)), pos[i] = i.
__global__ void embedding_keys_kernel(const void* __restrict__ ids, bool ids64, int64_t n,
                                      int64_t vocab, uint32_t* __restrict__ keys,
                                      uint32_t* __restrict__ pos) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t id = load_index(ids, ids64, i);
    if (id < 0 || id >= vocab) report_bad_id(false, id, i, vocab);
    keys[i] = static_cast<uint32_t>(id);
    pos[i] = static_cast<uint32_t>(i);
  }
}

// For each run of equal sorted keys (taken by the block that owns its first element):
// dweight[key, :] += sum over the run, in order, of dy[pos, :].
template <typename T>
__global__ void __launch_bounds__(256)
    embedding_backward_kernel(const uint32_t* __restrict__ keys, const uint32_t* __restrict__ pos,
                              int64_t n, const T* __restrict__ dy, T* __restrict__ dweight,
                              int64_t c) {
  for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    const uint32_t id = keys[k];
    if (k > 0 && keys[k - 1] == id) continue;  // not the first of its run (uniform per block)
    int64_t end = k + 1;
    while (end < n && keys[end] == id) ++end;
    T* dst = dweight + static_cast<int64_t>(id) * c;
    for (int64_t col = threadIdx.x; col < c; col += blockDim.x) {
      float acc = 0.0f;
#pragma unroll 4
      for (int64_t s = k; s < end; ++s) acc += to_f32(dy[static_cast<int64_t>(pos[s]) * c + col]);
      dst[col] = from_f32<T>(to_f32(dst[col]) + acc);
    }
  }
}

size_t align_up(size_t bytes) { return (bytes + 255) & ~size_t{255}; }

}  // namespace

Tensor embedding_forward(ExecContext& ctx, const Tensor& ids, const Tensor& weight) {
  check_index(ids, ctx, kForward, "ids");
  check_table(weight, ctx, kForward, "weight");
  const int64_t vocab = weight.size(0), c = weight.size(1);
  Shape out_shape = ids.shape();
  out_shape.push_back(c);
  const ::strata::cuda::CudaExec& x = ::strata::cuda::exec(ctx, kForward);
  Tensor y = Tensor::empty(out_shape, weight.dtype(), &ctx.allocator());
  const int64_t n = ids.numel();
  if (n == 0 || c == 0) return y;
  const int64_t row_bytes = c * static_cast<int64_t>(weight.element_size());
  const auto fits = [&](int64_t word) {
    return row_bytes % word == 0 && reinterpret_cast<uintptr_t>(weight.raw_data()) % word == 0 &&
           reinterpret_cast<uintptr_t>(y.raw_data()) % word == 0;
  };
  if (fits(16)) {
    launch_forward<uint4>(x, ids, vocab, weight, y, row_bytes);
  } else if (fits(8)) {
    launch_forward<uint2>(x, ids, vocab, weight, y, row_bytes);
  } else if (fits(4)) {
    launch_forward<uint32_t>(x, ids, vocab, weight, y, row_bytes);
  } else {
    launch_forward<uint16_t>(x, ids, vocab, weight, y, row_bytes);
  }
  return y;
}

void embedding_backward(ExecContext& ctx, const Tensor& dy, const Tensor& ids,
                        const Tensor& dweight) {
  check_index(ids, ctx, kBackward, "ids");
  check_table(dweight, ctx, kBackward, "dweight");
  check_float(dy, ctx, kBackward, "dy");
  check_same_dtype(dy, dweight, kBackward, "dy", "dweight");
  const int64_t vocab = dweight.size(0), c = dweight.size(1);
  Shape dy_shape = ids.shape();
  dy_shape.push_back(c);
  check_shape(dy, dy_shape, kBackward, "dy");
  const int64_t n = ids.numel();
  STRATA_CHECK(n <= INT_MAX) << kBackward << ": ids " << ids.shape_str() << " has " << n
                             << " elements; the CUDA kernel takes at most " << INT_MAX;
  STRATA_CHECK(vocab <= INT_MAX) << kBackward << ": dweight " << dweight.shape_str()
                                 << " has more than " << INT_MAX << " rows";
  const ::strata::cuda::CudaExec& x = ::strata::cuda::exec(ctx, kBackward);
  const cudaStream_t stream = x.stream();
  if (n == 0 || c == 0) return;

  int end_bit = 1;  // bits that hold every id in [0, V)
  while (end_bit < 32 && (int64_t{1} << end_bit) < vocab) ++end_bit;

  // One temporary: keys and positions (two buffers each, for the sort) and CUB's storage.
  const size_t array_bytes = align_up(static_cast<size_t>(n) * sizeof(uint32_t));
  size_t sort_bytes = 0;
  {
    cub::DoubleBuffer<uint32_t> k0(nullptr, nullptr), v0(nullptr, nullptr);
    STRATA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, k0, v0,
                                                      static_cast<int>(n), 0, end_bit, stream));
  }
  const Tensor temp = Tensor::empty({static_cast<int64_t>(4 * array_bytes + align_up(sort_bytes))},
                                    DType::kU8, &ctx.allocator());
  char* base = static_cast<char*>(temp.raw_data());
  uint32_t* keys0 = reinterpret_cast<uint32_t*>(base);
  uint32_t* keys1 = reinterpret_cast<uint32_t*>(base + array_bytes);
  uint32_t* pos0 = reinterpret_cast<uint32_t*>(base + 2 * array_bytes);
  uint32_t* pos1 = reinterpret_cast<uint32_t*>(base + 3 * array_bytes);
  void* sort_storage = base + 4 * array_bytes;

  embedding_keys_kernel<<<::strata::cuda::blocks_for(n, 256, x), 256, 0, stream>>>(
      ids.raw_data(), ids.dtype() == DType::kI64, n, vocab, keys0, pos0);
  STRATA_CUDA_LAUNCH_CHECK("embedding_keys_kernel");

  cub::DoubleBuffer<uint32_t> keys(keys0, keys1), pos(pos0, pos1);
  STRATA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_storage, sort_bytes, keys, pos,
                                                    static_cast<int>(n), 0, end_bit, stream));
  STRATA_CUDA_LAUNCH_CHECK("cub::DeviceRadixSort::SortPairs");

  const int threads = static_cast<int>(c >= 256 ? 256 : ((c + 31) / 32) * 32);
  const int64_t cap = static_cast<int64_t>(x.sm_count() > 0 ? x.sm_count() : 80) * 16;
  const unsigned blocks = static_cast<unsigned>(n < cap ? n : cap);
  dispatch_float(dy.dtype(), kBackward, [&](auto tag) {
    using T = decltype(tag);
    embedding_backward_kernel<T><<<blocks, threads, 0, stream>>>(
        keys.Current(), pos.Current(), n, static_cast<const T*>(dy.raw_data()),
        static_cast<T*>(dweight.raw_data()), c);
    STRATA_CUDA_LAUNCH_CHECK("embedding_backward_kernel");
  });
}

}  // namespace strata::ops::cuda
