// Matrix products and the linear layer on CUDA, through cuBLASLt.
//
// Tensors are row-major and cuBLASLt is column-major: a row-major C (M, N) = op(A) op(B) is the
// column-major C^T (N, M) = op(B)^T op(A)^T, so every product is handed to cuBLASLt with the
// operands swapped (its "A" is our B, its "B" is our A) and the transposes kept. A bias of the
// linear layer (one value per output feature, i.e. per row of the column-major D) is then exactly
// cuBLASLt's BIAS epilogue, and the pre-activation of linear_gelu_forward its GELU aux output.
//
// Descriptors, layouts and the algorithm chosen by the heuristic are cached per problem (dtypes,
// compute type, shapes, leading dimensions, batch strides, transposes, epilogue, beta, pointer
// alignments and device) in a small per-thread cache, so repeated calls (every training step)
// neither rebuild descriptors nor query the heuristic again. Per thread: the descriptors carry
// the per-call bias/aux pointers, and no lock is needed.
//
// Batched products use strided batches; a 2-D b shared by the batch folds the batch into the rows
// when a is not transposed (one large product), else uses a batch stride of 0. The shared
// operand's gradient sums over the batch by the same folding, or by products accumulating with
// beta = 1. Parameter gradients accumulate with beta = 1 in the same product (dweight), or with a
// small column-sum kernel that adds into dbias (cuBLASLt's BGRADB epilogue overwrites).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>

#include "engine/check.h"
#include "engine/cuda_exec.h"
#include "ops/cuda_common.cuh"
#include "ops/matmul.h"

namespace strata::ops::cuda {
namespace {

using strata::cuda::CudaExec;
using strata::cuda::MathMode;

constexpr const char* kMatmul = "matmul";

using ::strata::ops::cuda_detail::check_float;
using ::strata::ops::cuda_detail::check_same_dtype;
using ::strata::ops::cuda_detail::check_shape;
using ::strata::ops::cuda_detail::dispatch_float;
using ::strata::ops::cuda_detail::from_f32;
using ::strata::ops::cuda_detail::to_f32;

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

void check_matmul_operands(const Tensor& a, const Tensor& b, const ExecContext& ctx,
                           const char* op) {
  check_float(a, ctx, op, "a");
  check_float(b, ctx, op, "b");
  check_same_dtype(a, b, op, "a", "b");
}

// Checks of linear_forward / linear_gelu_forward; returns the number of rows (product of x's
// leading dimensions) and sets y's shape.
int64_t check_linear(const ExecContext& ctx, const Tensor& x, const Tensor& weight,
                     const Tensor& bias, const char* op, Shape* y_shape) {
  check_float(x, ctx, op, "x");
  check_float(weight, ctx, op, "weight");
  check_same_dtype(x, weight, op, "x", "weight");
  STRATA_CHECK(x.dim() >= 1 && weight.dim() == 2)
      << op << ": x must be (..., K) and weight (M, K), got " << x.shape_str() << " and "
      << weight.shape_str();
  const int64_t k = x.size(-1), m = weight.size(0);
  STRATA_CHECK_EQ(weight.size(1), k)
      << op << ": x " << x.shape_str() << " and weight " << weight.shape_str() << " disagree on K";
  if (bias.defined()) {
    check_float(bias, ctx, op, "bias");
    check_shape(bias, {m}, op, "bias");
    check_same_dtype(x, bias, op, "x", "bias");
  }
  *y_shape = x.shape();
  y_shape->back() = m;
  return shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
}

// ---- element types -----------------------------------------------------------------------------

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      STRATA_THROW() << "matmul: no cuBLASLt type for " << dtype_name(dtype);
  }
}

// ---- small kernels -----------------------------------------------------------------------------

constexpr int kThreads = 256;

// y[r, j] = bias[j] for every row r of a (rows, cols) matrix.
template <typename T>
__global__ void broadcast_rows_kernel(const T* __restrict__ bias, int64_t rows, int64_t cols,
                                      T* __restrict__ y) {
  const int64_t total = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    y[i] = bias[i % cols];
  }
}

// y = gelu(x), tanh form (ops/activation.h), computed in f32.
template <typename T>
__global__ void gelu_kernel(const T* __restrict__ x, int64_t n, T* __restrict__ y) {
  constexpr float kK = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kA = 0.044715f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = to_f32(x[i]);
    const float u = kK * (v + kA * v * v * v);
    y[i] = from_f32<T>(0.5f * v * (1.0f + tanhf(u)));
  }
}

// Column sums of a (rows, cols) matrix. Block (kColTile, kRowThreads) covers kColTile columns of
// the rows [blockIdx.y rows_per_split, +rows_per_split): a warp reads kColTile consecutive
// elements of a row (coalesced), the kRowThreads warps stride over the rows, and shared memory
// sums the warps. With one split (gridDim.y == 1) the sums are added into out; else each split
// writes its partial sums (partial[split * cols + c]) for column_sums_finish_kernel. Sums in
// double, like the CPU reference.
constexpr int kColTile = 32;
constexpr int kRowThreads = 8;

template <typename T>
__global__ void column_sums_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                   int64_t rows_per_split, double* __restrict__ partial,
                                   T* __restrict__ out) {
  __shared__ double tile[kRowThreads][kColTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_split;
  const int64_t r1 = r0 + rows_per_split < rows ? r0 + rows_per_split : rows;
  double acc = 0.0;
  if (c < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreads) acc += to_f32(x[r * cols + c]);
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < kRowThreads; ++i) s += tile[i][threadIdx.x];
    if (gridDim.y == 1) {
      out[c] = from_f32<T>(static_cast<float>(to_f32(out[c]) + s));
    } else {
      partial[static_cast<int64_t>(blockIdx.y) * cols + c] = s;
    }
  }
}

// out[c] += sum over splits of partial[split * cols + c].
template <typename T>
__global__ void column_sums_finish_kernel(const double* __restrict__ partial, int splits,
                                          int64_t cols, T* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
       c += stride) {
    double s = 0.0;
    for (int i = 0; i < splits; ++i) s += partial[static_cast<int64_t>(i) * cols + c];
    out[c] = from_f32<T>(static_cast<float>(to_f32(out[c]) + s));
  }
}

// out (cols) += column sums of x (rows, cols); both of x's dtype.
void accumulate_column_sums(ExecContext& ctx, CudaExec& ex, const Tensor& x, int64_t rows,
                            int64_t cols, const Tensor& out, const char* op) {
  if (rows == 0 || cols == 0) return;
  const int64_t col_blocks = (cols + kColTile - 1) / kColTile;
  STRATA_CHECK_LE(col_blocks, int64_t{INT_MAX}) << op << ": too many columns for the bias sum";
  // Enough blocks to fill the device a few times over, each with at least 64 rows of work.
  const int64_t target_blocks = static_cast<int64_t>(std::max(ex.sm_count(), 1)) * 8;
  int64_t splits = std::max<int64_t>(1, target_blocks / col_blocks);
  splits = std::min<int64_t>(splits, (rows + 63) / 64);
  splits = std::min<int64_t>(splits, 65535);
  splits = std::max<int64_t>(splits, 1);
  const int64_t rows_per_split = (rows + splits - 1) / splits;
  splits = (rows + rows_per_split - 1) / rows_per_split;  // no empty split
  Tensor partial;
  if (splits > 1) partial = Tensor::empty({splits, cols}, DType::kF64, &ctx.allocator());
  double* pp = splits > 1 ? static_cast<double*>(partial.raw_data()) : nullptr;
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits));
    const dim3 block(kColTile, kRowThreads);
    column_sums_kernel<T><<<grid, block, 0, ex.stream()>>>(px, rows, cols, rows_per_split, pp, po);
    STRATA_CUDA_LAUNCH_CHECK("column_sums_kernel");
    if (splits > 1) {
      column_sums_finish_kernel<T>
          <<<strata::cuda::blocks_for(cols, kThreads, ex), kThreads, 0, ex.stream()>>>(
              pp, static_cast<int>(splits), cols, po);
      STRATA_CUDA_LAUNCH_CHECK("column_sums_finish_kernel");
    }
  });
  // `partial` goes back to the caching allocator here; its reuse is ordered after the kernels on
  // the same stream.
}

void broadcast_rows(CudaExec& ex, const Tensor& bias, int64_t rows, int64_t cols, const Tensor& y,
                    const char* op) {
  if (rows == 0 || cols == 0) return;
  dispatch_float(y.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    broadcast_rows_kernel<T>
        <<<strata::cuda::blocks_for(rows * cols, kThreads, ex), kThreads, 0, ex.stream()>>>(
            static_cast<const T*>(bias.raw_data()), rows, cols, static_cast<T*>(y.raw_data()));
    STRATA_CUDA_LAUNCH_CHECK("broadcast_rows_kernel");
  });
}

void gelu(CudaExec& ex, const Tensor& x, const Tensor& y, const char* op) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    gelu_kernel<T><<<strata::cuda::blocks_for(n, kThreads, ex), kThreads, 0, ex.stream()>>>(
        static_cast<const T*>(x.raw_data()), n, static_cast<T*>(y.raw_data()));
    STRATA_CUDA_LAUNCH_CHECK("gelu_kernel");
  });
}

// ---- cuBLASLt products -------------------------------------------------------------------------

// A row-major product C (M, N) = alpha op(A) (M, K) op(B) (K, N) + beta C, `batch` times with the
// given element strides between batch entries (0: the same matrix for every entry). lda, ldb and
// ldc are the row lengths of the stored matrices (A is (M, K), or (K, M) when trans_a).
struct Gemm {
  DType dtype = DType::kF32;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  int64_t aux_ld = 0;  // GELU_AUX: leading dimension of the aux (pre-activation) matrix
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  const void* bias = nullptr;  // BIAS epilogues: one value per column of the row-major C
  void* aux = nullptr;         // GELU_AUX epilogues: the pre-activation, like C
  float beta = 0.0f;
};

// Largest power of two (at most 256) dividing the address: what the heuristic may assume.
uint32_t alignment_of(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && (v % align) != 0) align /= 2;
  return align;
}

using PlanKey = std::array<int64_t, 24>;

struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int64_t v : key) {
      h ^= static_cast<uint64_t>(v);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

// The descriptors of one problem and the heuristic's algorithm (found == false: none).
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr;  // cuBLASLt's A: our B
  cublasLtMatrixLayout_t layout_b = nullptr;  // cuBLASLt's B: our A
  cublasLtMatrixLayout_t layout_c = nullptr;  // C and D
  cublasLtMatmulAlgo_t algo{};
  bool found = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (layout_c != nullptr) cublasLtMatrixLayoutDestroy(layout_c);
    if (layout_b != nullptr) cublasLtMatrixLayoutDestroy(layout_b);
    if (layout_a != nullptr) cublasLtMatrixLayoutDestroy(layout_a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

// Per thread (the descriptors get each call's bias/aux pointers), emptied when it grows past
// kMaxPlans (shapes that keep changing).
constexpr size_t kMaxPlans = 1024;
thread_local std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> t_plans;

cublasComputeType_t compute_type(const Gemm& g, const CudaExec& ex) {
  if (g.dtype == DType::kF32 && ex.math_mode() == MathMode::kTf32) {
    return CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  return CUBLAS_COMPUTE_32F;
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                                   int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows),
                                                 static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                         &count, sizeof(count)));
    STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return layout;
}

void set_pointers(const Plan& plan, const Gemm& g) {
  if (g.bias != nullptr) {
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &g.bias, sizeof(g.bias)));
  }
  if (g.aux != nullptr) {
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux)));
  }
}

std::unique_ptr<Plan> make_plan(const Gemm& g, CudaExec& ex, cublasComputeType_t compute) {
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t type = cuda_type(g.dtype);
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, compute, CUDA_R_32F));
  const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A = our B
  const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B = our A
  STRATA_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  STRATA_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (g.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                       &g.epilogue, sizeof(g.epilogue)));
  }
  if (g.aux != nullptr) {
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.aux_ld, sizeof(g.aux_ld)));
  }
  set_pointers(*plan, g);  // the heuristic reads their alignment
  // Column-major views: our B (K, N) row-major is (N, K) column-major, our A (M, K) is (K, M),
  // C (M, N) is (N, M); a transposed operand is stored the other way round.
  plan->layout_a =
      make_layout(type, g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, g.ldb, g.batch, g.stride_b);
  plan->layout_b =
      make_layout(type, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.lda, g.batch, g.stride_a);
  plan->layout_c = make_layout(type, g.n, g.m, g.ldc, g.batch, g.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } guard{pref};
  const uint64_t workspace = CudaExec::kBlasLtWorkspaceBytes;
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  const uint32_t align_a = alignment_of(g.b), align_b = alignment_of(g.a),
                 align_c = alignment_of(g.c);
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));

  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(ex.blas_lt(), plan->op, plan->layout_a, plan->layout_b,
                                     plan->layout_c, plan->layout_c, pref, 1, &result, &count);
  if (status == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan->algo = result.algo;
    plan->found = true;
  } else if (status != CUBLAS_STATUS_NOT_SUPPORTED && status != CUBLAS_STATUS_SUCCESS) {
    STRATA_CUBLAS_CHECK(status);  // a real error (not "no algorithm for this problem")
  }
  return plan;
}

std::string describe(const Gemm& g) {
  std::ostringstream s;
  s << dtype_name(g.dtype) << " (" << g.m << " x " << g.k << (g.trans_a ? ", a^T" : "") << ") @ ("
    << g.k << " x " << g.n << (g.trans_b ? ", b^T" : "") << ")";
  if (g.batch > 1) s << " x " << g.batch << " batches";
  if (g.epilogue != CUBLASLT_EPILOGUE_DEFAULT) s << ", epilogue " << static_cast<int>(g.epilogue);
  return s.str();
}

// Runs the product; returns false, having done nothing, when cuBLASLt has no algorithm for it
// (only possible with an epilogue, or in a batch, which the callers and gemm() fall back from).
bool try_gemm(CudaExec& ex, const Gemm& g) {
  const cublasComputeType_t compute = compute_type(g, ex);
  const PlanKey key = {static_cast<int64_t>(g.dtype),
                       static_cast<int64_t>(compute),
                       g.trans_a,
                       g.trans_b,
                       g.m,
                       g.n,
                       g.k,
                       g.lda,
                       g.ldb,
                       g.ldc,
                       g.batch,
                       g.batch > 1 ? g.stride_a : 0,  // strides matter in a batch only
                       g.batch > 1 ? g.stride_b : 0,
                       g.batch > 1 ? g.stride_c : 0,
                       static_cast<int64_t>(g.epilogue),
                       g.aux_ld,
                       g.beta != 0.0f,
                       alignment_of(g.a),
                       alignment_of(g.b),
                       alignment_of(g.c),
                       g.bias != nullptr ? alignment_of(g.bias) : 0,
                       g.aux != nullptr ? alignment_of(g.aux) : 0,
                       ex.device(),
                       0};
  auto it = t_plans.find(key);
  if (it == t_plans.end()) {
    if (t_plans.size() >= kMaxPlans) t_plans.clear();
    it = t_plans.emplace(key, make_plan(g, ex, compute)).first;
  }
  const Plan& plan = *it->second;
  if (!plan.found) return false;
  set_pointers(plan, g);
  const float alpha = 1.0f;
  STRATA_CUBLAS_CHECK(cublasLtMatmul(ex.blas_lt(), plan.op, &alpha, g.b, plan.layout_a, g.a,
                                     plan.layout_b, &g.beta, g.c, plan.layout_c, g.c, plan.layout_c,
                                     &plan.algo, ex.blas_lt_workspace(),
                                     CudaExec::kBlasLtWorkspaceBytes, ex.stream()));
  return true;
}

// Zero-sized products: nothing to do when C is empty; C = beta C = 0 or unchanged when K = 0.
// Returns true when handled.
bool trivial_gemm(CudaExec& ex, const Gemm& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return true;
  if (g.k != 0) return false;
  if (g.beta == 0.0f) {
    const int64_t elements = (g.batch - 1) * g.stride_c + (g.m - 1) * g.ldc + g.n;
    STRATA_CUDA_CHECK(
        cudaMemsetAsync(g.c, 0, static_cast<size_t>(elements) * dtype_size(g.dtype), ex.stream()));
  }
  return true;
}

// A product without epilogue: one cuBLASLt call, or one per batch entry if cuBLASLt has no
// algorithm for the batched problem; an error naming the op if it has none at all.
void gemm(CudaExec& ex, const Gemm& g, const char* op) {
  STRATA_CHECK(g.epilogue == CUBLASLT_EPILOGUE_DEFAULT) << op << ": gemm() takes no epilogue";
  if (trivial_gemm(ex, g)) return;
  STRATA_CHECK_LE(g.batch, int64_t{INT32_MAX}) << op << ": too many batch entries for cuBLASLt";
  if (try_gemm(ex, g)) return;
  bool done = g.batch > 1;
  if (done) {
    const size_t es = dtype_size(g.dtype);
    Gemm one = g;
    one.batch = 1;
    one.stride_a = one.stride_b = one.stride_c = 0;
    for (int64_t i = 0; i < g.batch && done; ++i) {
      one.a = static_cast<const char*>(g.a) + static_cast<size_t>(i * g.stride_a) * es;
      one.b = static_cast<const char*>(g.b) + static_cast<size_t>(i * g.stride_b) * es;
      one.c = static_cast<char*>(g.c) + static_cast<size_t>(i * g.stride_c) * es;
      done = try_gemm(ex, one);
    }
  }
  STRATA_CHECK(done) << op << ": cuBLASLt has no algorithm for " << describe(g);
}

// The row-major product y (rows, m) = x (rows, k) @ weight (m, k)^T (+ bias), into y.
void linear_into(CudaExec& ex, const Tensor& x, const Tensor& weight, const Tensor& bias,
                 int64_t rows, const Tensor& y, const char* op) {
  Gemm g;
  g.dtype = x.dtype();
  g.trans_a = false;
  g.trans_b = true;
  g.m = rows;
  g.n = weight.size(0);
  g.k = weight.size(1);
  g.lda = g.k;
  g.ldb = g.k;
  g.ldc = g.n;
  g.a = x.raw_data();
  g.b = weight.raw_data();
  g.c = y.raw_data();
  if (g.m == 0 || g.n == 0) return;
  if (bias.defined()) {
    Gemm fused = g;
    fused.epilogue = CUBLASLT_EPILOGUE_BIAS;
    fused.bias = bias.raw_data();
    if (g.k > 0 && try_gemm(ex, fused)) return;
    // No algorithm with the bias epilogue (or K = 0): start from the bias rows, then accumulate.
    broadcast_rows(ex, bias, g.m, g.n, y, op);
    g.beta = 1.0f;
  }
  gemm(ex, g, op);
}

}  // namespace

// ---- ops ---------------------------------------------------------------------------------------

Tensor matmul(ExecContext& ctx, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  CudaExec& ex = strata::cuda::exec(ctx, kMatmul);
  check_matmul_operands(a, b, ctx, kMatmul);
  const MatmulDims d = matmul_dims(a, b, trans_a, trans_b);
  Tensor c = Tensor::empty(d.out_shape, a.dtype(), &ctx.allocator());
  Gemm g;
  g.dtype = a.dtype();
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = d.m;
  g.n = d.n;
  g.k = d.k;
  g.lda = a.size(-1);
  g.ldb = b.size(-1);
  g.ldc = d.n;
  g.a = a.raw_data();
  g.b = b.raw_data();
  g.c = c.raw_data();
  if (d.b_shared && !trans_a) {  // the batch folds into the rows of a and c
    g.m = d.batch * d.m;
  } else {
    g.batch = d.batch;
    g.stride_a = d.m * d.k;
    g.stride_b = d.b_shared ? 0 : d.k * d.n;
    g.stride_c = d.m * d.n;
  }
  gemm(ex, g, kMatmul);
  return c;
}

MatmulGrads matmul_backward(ExecContext& ctx, const Tensor& dc, const Tensor& a, const Tensor& b,
                            bool trans_a, bool trans_b, bool need_da, bool need_db) {
  constexpr const char* kOp = "matmul_backward";
  CudaExec& ex = strata::cuda::exec(ctx, kOp);
  check_matmul_operands(a, b, ctx, kOp);
  const MatmulDims d = matmul_dims(a, b, trans_a, trans_b);
  check_float(dc, ctx, kOp, "dc");
  check_same_dtype(dc, a, kOp, "dc", "a");
  check_shape(dc, d.out_shape, kOp, "dc");
  MatmulGrads grads;
  if (need_da) grads.da = Tensor::empty(a.shape(), a.dtype(), &ctx.allocator());
  if (need_db) grads.db = Tensor::empty(b.shape(), b.dtype(), &ctx.allocator());
  const int64_t lda = a.size(-1), ldb = b.size(-1), ldc = d.n;
  const int64_t a_step = d.m * d.k, b_step = d.b_shared ? 0 : d.k * d.n, c_step = d.m * d.n;
  const bool fold = d.b_shared && !trans_a;  // batch folded into the rows of a and c
  const int64_t rows = fold ? d.batch * d.m : d.m;
  const int64_t batch = fold ? 1 : d.batch;
  if (need_da) {
    Gemm g;
    g.dtype = a.dtype();
    g.c = grads.da.raw_data();
    g.ldc = lda;
    g.batch = batch;
    g.stride_c = a_step;
    if (!trans_a) {  // da (m, k) = dc (m, n) @ op(b)^T
      g.trans_a = false;
      g.trans_b = !trans_b;
      g.m = rows;
      g.n = d.k;
      g.k = d.n;
      g.a = dc.raw_data();
      g.lda = ldc;
      g.stride_a = c_step;
      g.b = b.raw_data();
      g.ldb = ldb;
      g.stride_b = b_step;
    } else {  // da (k, m) = op(b) (k, n) @ dc^T
      g.trans_a = trans_b;
      g.trans_b = true;
      g.m = d.k;
      g.n = d.m;
      g.k = d.n;
      g.a = b.raw_data();
      g.lda = ldb;
      g.stride_a = b_step;
      g.b = dc.raw_data();
      g.ldb = ldc;
      g.stride_b = c_step;
    }
    gemm(ex, g, kOp);
  }
  if (need_db) {
    Gemm g;
    g.dtype = a.dtype();
    g.c = grads.db.raw_data();
    g.ldc = ldb;
    if (!trans_b) {  // db (k, n) = op(a)^T (k, m) @ dc (m, n)
      g.trans_a = !trans_a;
      g.trans_b = false;
      g.m = d.k;
      g.n = d.n;
      g.k = rows;
      g.a = a.raw_data();
      g.lda = lda;
      g.stride_a = a_step;
      g.b = dc.raw_data();
      g.ldb = ldc;
      g.stride_b = c_step;
    } else {  // db (n, k) = dc^T (n, m) @ op(a) (m, k)
      g.trans_a = true;
      g.trans_b = trans_a;
      g.m = d.n;
      g.n = d.k;
      g.k = rows;
      g.a = dc.raw_data();
      g.lda = ldc;
      g.stride_a = c_step;
      g.b = a.raw_data();
      g.ldb = lda;
      g.stride_b = a_step;
    }
    if (!d.b_shared || fold) {  // one product per db entry (strided batch), or one folded product
      g.batch = batch;
      g.stride_c = b_step;
      gemm(ex, g, kOp);
    } else if (d.batch == 0) {  // a shared b (with a transposed) of an empty batch: db = 0
      STRATA_CUDA_CHECK(cudaMemsetAsync(grads.db.raw_data(), 0, grads.db.nbytes(), ex.stream()));
    } else {  // shared b, a transposed: sum over the batch with beta = 1 after the first entry
      // g.a and g.b step through a and dc (in the order trans_b gave them); db stays.
      const size_t es = a.element_size();
      for (int64_t i = 0; i < d.batch; ++i) {
        Gemm one = g;
        one.batch = 1;
        one.stride_a = one.stride_b = one.stride_c = 0;
        one.a = static_cast<const char*>(g.a) + static_cast<size_t>(i * g.stride_a) * es;
        one.b = static_cast<const char*>(g.b) + static_cast<size_t>(i * g.stride_b) * es;
        one.beta = i > 0 ? 1.0f : 0.0f;
        gemm(ex, one, kOp);
      }
    }
  }
  return grads;
}

Tensor linear_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  constexpr const char* kOp = "linear_forward";
  CudaExec& ex = strata::cuda::exec(ctx, kOp);
  Shape y_shape;
  const int64_t rows = check_linear(ctx, x, weight, bias, kOp, &y_shape);
  Tensor y = Tensor::empty(y_shape, x.dtype(), &ctx.allocator());
  linear_into(ex, x, weight, bias, rows, y, kOp);
  return y;
}

Tensor linear_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight,
                       const Tensor& dweight, const Tensor& dbias, bool need_dx) {
  constexpr const char* kOp = "linear_backward";
  CudaExec& ex = strata::cuda::exec(ctx, kOp);
  check_float(dy, ctx, kOp, "dy");
  check_float(x, ctx, kOp, "x");
  check_float(weight, ctx, kOp, "weight");
  check_same_dtype(x, weight, kOp, "x", "weight");
  check_same_dtype(x, dy, kOp, "x", "dy");
  STRATA_CHECK(x.dim() >= 1 && weight.dim() == 2)
      << kOp << ": x must be (..., K) and weight (M, K), got " << x.shape_str() << " and "
      << weight.shape_str();
  const int64_t k = x.size(-1), m = weight.size(0);
  STRATA_CHECK_EQ(weight.size(1), k)
      << kOp << ": x " << x.shape_str() << " and weight " << weight.shape_str() << " disagree on K";
  const int64_t n = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  Shape y_shape = x.shape();
  y_shape.back() = m;
  check_shape(dy, y_shape, kOp, "dy");
  if (dweight.defined()) {
    check_float(dweight, ctx, kOp, "dweight");
    check_shape(dweight, weight.shape(), kOp, "dweight");
    check_same_dtype(x, dweight, kOp, "x", "dweight");
  }
  if (dbias.defined()) {
    check_float(dbias, ctx, kOp, "dbias");
    check_shape(dbias, {m}, kOp, "dbias");
    check_same_dtype(x, dbias, kOp, "x", "dbias");
  }
  Tensor dx;
  if (need_dx) {  // dx (n, k) = dy (n, m) @ weight (m, k)
    dx = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
    Gemm g;
    g.dtype = x.dtype();
    g.m = n;
    g.n = k;
    g.k = m;
    g.lda = m;
    g.ldb = k;
    g.ldc = k;
    g.a = dy.raw_data();
    g.b = weight.raw_data();
    g.c = dx.raw_data();
    gemm(ex, g, kOp);
  }
  if (dweight.defined()) {  // dweight (m, k) += dy^T (m, n) @ x (n, k), in the same product
    Gemm g;
    g.dtype = x.dtype();
    g.trans_a = true;
    g.m = m;
    g.n = k;
    g.k = n;
    g.lda = m;
    g.ldb = k;
    g.ldc = k;
    g.a = dy.raw_data();
    g.b = x.raw_data();
    g.c = dweight.raw_data();
    g.beta = 1.0f;
    gemm(ex, g, kOp);
  }
  if (dbias.defined()) accumulate_column_sums(ctx, ex, dy, n, m, dbias, kOp);
  return dx;
}

LinearGeluResult linear_gelu_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight,
                                     const Tensor& bias) {
  constexpr const char* kOp = "linear_gelu_forward";
  CudaExec& ex = strata::cuda::exec(ctx, kOp);
  Shape y_shape;
  const int64_t rows = check_linear(ctx, x, weight, bias, kOp, &y_shape);
  LinearGeluResult r;
  r.pre = Tensor::empty(y_shape, x.dtype(), &ctx.allocator());
  r.y = Tensor::empty(y_shape, x.dtype(), &ctx.allocator());
  const int64_t m = weight.size(0), k = weight.size(1);
  if (rows == 0 || m == 0) return r;
  // The aux matrix's leading dimension (m) must be a multiple of 8 for cuBLASLt.
  if (k > 0 && m % 8 == 0) {
    Gemm g;
    g.dtype = x.dtype();
    g.trans_b = true;
    g.m = rows;
    g.n = m;
    g.k = k;
    g.lda = k;
    g.ldb = k;
    g.ldc = m;
    g.a = x.raw_data();
    g.b = weight.raw_data();
    g.c = r.y.raw_data();
    g.epilogue = bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    g.bias = bias.defined() ? bias.raw_data() : nullptr;
    g.aux = r.pre.raw_data();
    g.aux_ld = m;
    if (try_gemm(ex, g)) return r;
  }
  // Unfused: pre = x weight^T + bias, then y = gelu(pre).
  linear_into(ex, x, weight, bias, rows, r.pre, kOp);
  gelu(ex, r.pre, r.y, kOp);
  return r;
}

}  // namespace strata::ops::cuda
