// The dispatch table: every op that has a per-device kernel, listed by hand, one row each.
//
// A row names the op and its kernel per device; a public op function in `strata::ops` routes to
// the row's kernel for the ExecContext's device. A device whose column is empty fails with an
// error naming the op and the device. Ops built from other ops (add_backward, clip_grad_norm, ...)
// live in their op's .cpp and need no row.
//
// 16-bit tensors on the CPU (mixed precision, --precision bf16|fp16): the CPU kernels compute in
// f32 (or f64), so a call whose tensors include bf16 or f16 ones runs the kernel on f32 copies of
// them, writes the copies back into the 16-bit tensors afterwards (what the kernel accumulated in
// place: parameter gradients, running statistics) and rounds the f32 results to the call's 16-bit
// dtype. That is what the CUDA kernels do (load 16 bits, compute in f32, round once at the
// store), so the CPU stays the reference of the 16-bit paths; it is not fast.
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/check.h"
#include "engine/cuda_runtime.h"
#include "engine/element.h"
#include "ops/accuracy.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/batch_norm.h"
#include "ops/conv2d.h"
#include "ops/cross_entropy.h"
#include "ops/dispatch.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/layer_norm.h"
#include "ops/layout.h"
#include "ops/linear_padded.h"
#include "ops/matmul.h"
#include "ops/optimizer.h"
#include "ops/pooling.h"
#include "ops/precision.h"
#include "ops/shape_ops.h"
#include "ops/softmax.h"

namespace strata::ops {
namespace {

// What the CPU does with 16-bit tensors (see the top of this file).
enum class Widen {
  kNarrowResults,  // run on f32 copies; floating f32 results rounded to the call's 16-bit dtype
  kKeepResults,    // run on f32 copies; results stay f32 (the loss of cross-entropy)
  kNone,           // the kernel takes 16-bit tensors itself (the conversions)
};

template <typename Fn>
struct OpRow {
  const char* name;
  Fn* cpu;
  Fn* cuda;
  Widen widen;
  // The CUDA kernel takes channels-last (NHWC) tensors itself (ops/layout.h); every other kernel
  // gets NCHW copies of channels-last arguments.
  bool cuda_channels_last = false;
};

template <typename Fn>
constexpr OpRow<Fn> takes_channels_last_on_cuda(OpRow<Fn> r) {
  r.cuda_channels_last = true;
  return r;
}

template <typename T>
struct NoDeduce {
  using type = T;
};

// The CUDA column: the op's cuda:: kernel in a CUDA build, nullptr otherwise.
#ifdef STRATA_WITH_CUDA
#define STRATA_CUDA_KERNEL(fn) cuda::fn
#else
#define STRATA_CUDA_KERNEL(fn) nullptr
#endif

// The CUDA column does not take part in deducing the kernel type, so it may be nullptr.
template <typename Fn>
constexpr OpRow<Fn> row(const char* name, Fn* cpu, typename NoDeduce<Fn>::type* cuda,
                        Widen widen = Widen::kNarrowResults) {
  return OpRow<Fn>{name, cpu, cuda, widen, false};
}

// ---- 16-bit tensors on the CPU
// -------------------------------------------------------------------

bool is_16bit(DType d) { return d == DType::kBF16 || d == DType::kF16; }

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

template <typename T>
bool has_16bit(const T&) {
  return false;
}
bool has_16bit(const Tensor& t) { return t.defined() && is_16bit(t.dtype()); }
bool has_16bit(const TensorList& ts) {
  for (const Tensor& t : ts) {
    if (has_16bit(t)) return true;
  }
  return false;
}
bool has_16bit(const AttentionResult& r) {
  return has_16bit(r.out) || has_16bit(r.probs) || has_16bit(r.lse);
}

template <typename T>
struct IsTensorArg
    : std::bool_constant<std::is_same_v<T, Tensor> || std::is_same_v<T, TensorList> ||
                         std::is_same_v<T, AttentionResult>> {};

// One call's f32 copies of its 16-bit tensors.
class Widening {
 public:
  explicit Widening(ExecContext& ctx) : ctx_(ctx) {}

  // Anything but a tensor passes through.
  template <typename T, typename = std::enable_if_t<!IsTensorArg<std::decay_t<T>>::value>>
  T&& arg(T&& x) {
    return std::forward<T>(x);
  }
  Tensor arg(const Tensor& t) {
    if (!has_16bit(t)) return t;
    narrow_ = t.dtype();
    for (const auto& [original, copy] : copies_) {  // the same tensor twice: one copy
      if (original.shares_storage(t) && original.raw_data() == t.raw_data() &&
          original.shape() == t.shape() && original.strides() == t.strides()) {
        return copy;
      }
    }
    Tensor copy = Tensor::empty(t.shape(), DType::kF32, &ctx_.allocator());
    copy.copy_from(t);
    copies_.emplace_back(t, copy);
    return copy;
  }
  TensorList arg(const TensorList& ts) {
    TensorList out;
    out.reserve(ts.size());
    for (const Tensor& t : ts) out.push_back(arg(t));
    return out;
  }
  AttentionResult arg(const AttentionResult& r) {
    return AttentionResult{arg(r.out), arg(r.probs), arg(r.lse)};
  }

  // Whatever the kernel wrote into its inputs (accumulated gradients, running statistics) goes
  // back into the 16-bit tensors. Only the elements that changed are written: an input the kernel
  // only read is not written at all (another thread may be reading it: a tensor being sent).
  void write_back() const {
    for (const auto& [original, copy] : copies_) {
      if (!original.is_contiguous()) {  // not seen from the layers; converts back exactly
        original.copy_from(copy);
        continue;
      }
      const float* c = copy.data<float>();
      dispatch_dtype(original.dtype(), [&](auto tag) {
        using T = decltype(tag);
        T* o = static_cast<T*>(original.raw_data());
        for (int64_t i = 0; i < copy.numel(); ++i) {
          if (!same_bits(c[i], static_cast<float>(load_as_double(o[i])))) {
            o[i] = store_from_double<T>(c[i]);
          }
        }
      });
    }
  }

  // Floating f32 results in the call's 16-bit dtype.
  void narrow(Tensor& t) const {
    if (t.defined() && t.dtype() == DType::kF32) t = t.to(narrow_);
  }
  void narrow(TensorList& ts) const {
    for (Tensor& t : ts) narrow(t);
  }
  void narrow(MatmulGrads& g) const {
    narrow(g.da);
    narrow(g.db);
  }
  void narrow(LinearGeluResult& r) const {
    narrow(r.y);
    narrow(r.pre);
  }
  void narrow(MaxPool2dResult& r) const { narrow(r.y); }
  // Normalization statistics stay f32, as on CUDA (batch_norm_stat_dtype, ops/layer_norm.h).
  void narrow(BatchNormTrainResult& r) const { narrow(r.y); }
  void narrow(LayerNormResult& r) const { narrow(r.y); }
  void narrow(DropoutResult& r) const { narrow(r.y); }
  void narrow(AttentionResult& r) const {  // lse stays f32, as on CUDA
    narrow(r.out);
    narrow(r.probs);
  }
  void narrow(AttentionGrads& g) const {
    narrow(g.dq);
    narrow(g.dk);
    narrow(g.dv);
  }
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
  void narrow(T&) const {}

 private:
  ExecContext& ctx_;
  DType narrow_ = DType::kF32;
  std::vector<std::pair<Tensor, Tensor>> copies_;  // (16-bit tensor, its f32 copy)
};

template <typename Fn, typename... Args>
decltype(auto) call_widened(const OpRow<Fn>& r, ExecContext& ctx, Args&&... args) {
  Widening w(ctx);
  using R = decltype(r.cpu(ctx, std::forward<Args>(args)...));
  if constexpr (std::is_void_v<R>) {
    r.cpu(ctx, w.arg(std::forward<Args>(args))...);
    w.write_back();
  } else {
    R result = r.cpu(ctx, w.arg(std::forward<Args>(args))...);
    w.write_back();
    if (r.widen == Widen::kNarrowResults) w.narrow(result);
    return result;
  }
}

// ---- channels-last arguments (ops/layout.h)
// ------------------------------------------------------

bool channels_last_arg(const Tensor& t) { return is_channels_last(t); }
template <typename T, typename = std::enable_if_t<!std::is_same_v<std::decay_t<T>, Tensor>>>
bool channels_last_arg(const T&) {
  return false;
}
Tensor nchw_arg(const Tensor& t) { return detail::nchw(t); }
template <typename T, typename = std::enable_if_t<!std::is_same_v<std::decay_t<T>, Tensor>>>
T&& nchw_arg(T&& x) {
  return std::forward<T>(x);
}

template <typename Fn, typename... Args>
decltype(auto) call_kernel(const OpRow<Fn>& r, ExecContext& ctx, Args&&... args) {
  Fn* kernel = nullptr;
  switch (ctx.device().type) {
    case DeviceType::kCPU:
      kernel = r.cpu;
      break;
    case DeviceType::kCUDA:
      kernel = r.cuda;
      break;
  }
  STRATA_CHECK(kernel != nullptr) << "op " << r.name << " has no kernel for " << ctx.device().str()
                                  << " in this build";
  if (ctx.device().is_cpu() && r.widen != Widen::kNone && (has_16bit(args) || ...)) {
    return call_widened(r, ctx, std::forward<Args>(args)...);
  }
  if (ctx.device().is_cuda()) {
    // An NVTX range per op on CUDA (Nsight Systems shows the op names on the stream's timeline).
    struct Range {
      explicit Range(const char* name) { ::strata::cuda::range_push(name); }
      ~Range() { ::strata::cuda::range_pop(); }
    } range(r.name);
    return kernel(ctx, std::forward<Args>(args)...);
  }
  return kernel(ctx, std::forward<Args>(args)...);
}

template <typename Fn, typename... Args>
decltype(auto) call(const OpRow<Fn>& r, ExecContext& ctx, Args&&... args) {
  // Channels-last tensors reach only the kernels that take them: the others get NCHW copies
  // (only activations are ever channels-last, and these kernels only read them).
  if (!(ctx.device().is_cuda() && r.cuda_channels_last) && (channels_last_arg(args) || ...)) {
    return call_kernel(r, ctx, nchw_arg(std::forward<Args>(args))...);
  }
  return call_kernel(r, ctx, std::forward<Args>(args)...);
}

// ---- the table ---------------------------------------------------------------------------------
//                         name                            cpu                               cuda
const auto kMatmul = row("matmul", cpu::matmul, STRATA_CUDA_KERNEL(matmul));
const auto kMatmulBackward =
    row("matmul_backward", cpu::matmul_backward, STRATA_CUDA_KERNEL(matmul_backward));
const auto kLinearForward =
    row("linear_forward", cpu::linear_forward, STRATA_CUDA_KERNEL(linear_forward));
const auto kLinearBackward =
    row("linear_backward", cpu::linear_backward, STRATA_CUDA_KERNEL(linear_backward));
const auto kLinearGeluForward =
    row("linear_gelu_forward", cpu::linear_gelu_forward, STRATA_CUDA_KERNEL(linear_gelu_forward));
const auto kLinearPaddedForward = row("linear_padded_forward", cpu::linear_padded_forward,
                                      STRATA_CUDA_KERNEL(linear_padded_forward));
const auto kLinearPaddedBackward = row("linear_padded_backward", cpu::linear_padded_backward,
                                       STRATA_CUDA_KERNEL(linear_padded_backward));
const auto kConv2dForward = takes_channels_last_on_cuda(
    row("conv2d_forward", cpu::conv2d_forward, STRATA_CUDA_KERNEL(conv2d_forward)));
const auto kConv2dBackward = takes_channels_last_on_cuda(
    row("conv2d_backward", cpu::conv2d_backward, STRATA_CUDA_KERNEL(conv2d_backward)));
const auto kMaxPool2dForward =
    row("max_pool2d_forward", cpu::max_pool2d_forward, STRATA_CUDA_KERNEL(max_pool2d_forward));
const auto kMaxPool2dBackward =
    row("max_pool2d_backward", cpu::max_pool2d_backward, STRATA_CUDA_KERNEL(max_pool2d_backward));
const auto kAvgPool2dForward =
    row("avg_pool2d_forward", cpu::avg_pool2d_forward, STRATA_CUDA_KERNEL(avg_pool2d_forward));
const auto kAvgPool2dBackward =
    row("avg_pool2d_backward", cpu::avg_pool2d_backward, STRATA_CUDA_KERNEL(avg_pool2d_backward));
const auto kAdaptiveAvgPool2dForward =
    row("adaptive_avg_pool2d_forward", cpu::adaptive_avg_pool2d_forward,
        STRATA_CUDA_KERNEL(adaptive_avg_pool2d_forward));
const auto kAdaptiveAvgPool2dBackward =
    row("adaptive_avg_pool2d_backward", cpu::adaptive_avg_pool2d_backward,
        STRATA_CUDA_KERNEL(adaptive_avg_pool2d_backward));
const auto kBatchNormForwardTrain = row("batch_norm_forward_train", cpu::batch_norm_forward_train,
                                        STRATA_CUDA_KERNEL(batch_norm_forward_train));
const auto kBatchNormForwardEval = row("batch_norm_forward_eval", cpu::batch_norm_forward_eval,
                                       STRATA_CUDA_KERNEL(batch_norm_forward_eval));
const auto kBatchNormBackward =
    row("batch_norm_backward", cpu::batch_norm_backward, STRATA_CUDA_KERNEL(batch_norm_backward));
const auto kLayerNormForward =
    row("layer_norm_forward", cpu::layer_norm_forward, STRATA_CUDA_KERNEL(layer_norm_forward));
const auto kLayerNormBackward =
    row("layer_norm_backward", cpu::layer_norm_backward, STRATA_CUDA_KERNEL(layer_norm_backward));
const auto kReluForward = row("relu_forward", cpu::relu_forward, STRATA_CUDA_KERNEL(relu_forward));
const auto kReluBackward =
    row("relu_backward", cpu::relu_backward, STRATA_CUDA_KERNEL(relu_backward));
const auto kGeluForward = row("gelu_forward", cpu::gelu_forward, STRATA_CUDA_KERNEL(gelu_forward));
const auto kGeluBackward =
    row("gelu_backward", cpu::gelu_backward, STRATA_CUDA_KERNEL(gelu_backward));
const auto kDropoutForward =
    row("dropout_forward", cpu::dropout_forward, STRATA_CUDA_KERNEL(dropout_forward));
const auto kDropoutBackward =
    row("dropout_backward", cpu::dropout_backward, STRATA_CUDA_KERNEL(dropout_backward));
const auto kSoftmaxForward =
    row("softmax_forward", cpu::softmax_forward, STRATA_CUDA_KERNEL(softmax_forward));
const auto kSoftmaxBackward =
    row("softmax_backward", cpu::softmax_backward, STRATA_CUDA_KERNEL(softmax_backward));
const auto kAttentionForward =
    row("attention_forward", cpu::attention_forward, STRATA_CUDA_KERNEL(attention_forward));
const auto kAttentionBackward =
    row("attention_backward", cpu::attention_backward, STRATA_CUDA_KERNEL(attention_backward));
const auto kEmbeddingForward =
    row("embedding_forward", cpu::embedding_forward, STRATA_CUDA_KERNEL(embedding_forward));
const auto kEmbeddingBackward =
    row("embedding_backward", cpu::embedding_backward, STRATA_CUDA_KERNEL(embedding_backward));
const auto kAdd = row("add", cpu::add, STRATA_CUDA_KERNEL(add));
const auto kMul = row("mul", cpu::mul, STRATA_CUDA_KERNEL(mul));
const auto kScale = row("scale", cpu::scale, STRATA_CUDA_KERNEL(scale));
const auto kAddInplace = row("add_", cpu::add_, STRATA_CUDA_KERNEL(add_));
const auto kSumToShape = row("sum_to_shape", cpu::sum_to_shape, STRATA_CUDA_KERNEL(sum_to_shape));
const auto kPermuteCopy = row("permute_copy", cpu::permute_copy, STRATA_CUDA_KERNEL(permute_copy));
const auto kConcat = row("concat", cpu::concat, STRATA_CUDA_KERNEL(concat));
const auto kSplit = row("split", cpu::split, STRATA_CUDA_KERNEL(split));
const auto kCrossEntropyForward =
    row("cross_entropy_forward", cpu::cross_entropy_forward,
        STRATA_CUDA_KERNEL(cross_entropy_forward), Widen::kKeepResults);
const auto kCrossEntropyBackward = row("cross_entropy_backward", cpu::cross_entropy_backward,
                                       STRATA_CUDA_KERNEL(cross_entropy_backward));
const auto kTopkCorrect = row("topk_correct", cpu::topk_correct, STRATA_CUDA_KERNEL(topk_correct));
const auto kSgdStep = row("sgd_step", cpu::sgd_step, STRATA_CUDA_KERNEL(sgd_step));
const auto kAdamWStep = row("adamw_step", cpu::adamw_step, STRATA_CUDA_KERNEL(adamw_step));
// CPU only: on other devices sgd_step_sq/adamw_step_sq are sum_of_squares, then the update.
const auto kSgdStepSq = row("sgd_step_sq", cpu::sgd_step_sq, nullptr);
const auto kAdamWStepSq = row("adamw_step_sq", cpu::adamw_step_sq, nullptr);
const auto kAdamWVrStep =
    row("adamw_vr_step", cpu::adamw_vr_step, STRATA_CUDA_KERNEL(adamw_vr_step));
const auto kSumOfSquares =
    row("sum_of_squares", cpu::sum_of_squares, STRATA_CUDA_KERNEL(sum_of_squares));
const auto kCastCopy =
    row("cast_copy_", cpu::cast_copy_, STRATA_CUDA_KERNEL(cast_copy_), Widen::kNone);
const auto kMoveAdd = row("move_add_", cpu::move_add_, STRATA_CUDA_KERNEL(move_add_), Widen::kNone);

// Which devices each row covers, for has_kernels_for().
struct RowCoverage {
  const char* name;
  bool cpu;
  bool cuda;
};

template <typename Fn>
constexpr RowCoverage coverage(const OpRow<Fn>& r) {
  return RowCoverage{r.name, r.cpu != nullptr, r.cuda != nullptr};
}

const RowCoverage kCoverage[] = {
    coverage(kMatmul),
    coverage(kMatmulBackward),
    coverage(kLinearForward),
    coverage(kLinearBackward),
    coverage(kLinearGeluForward),
    coverage(kConv2dForward),
    coverage(kConv2dBackward),
    coverage(kMaxPool2dForward),
    coverage(kMaxPool2dBackward),
    coverage(kAvgPool2dForward),
    coverage(kAvgPool2dBackward),
    coverage(kAdaptiveAvgPool2dForward),
    coverage(kAdaptiveAvgPool2dBackward),
    coverage(kBatchNormForwardTrain),
    coverage(kBatchNormForwardEval),
    coverage(kBatchNormBackward),
    coverage(kLayerNormForward),
    coverage(kLayerNormBackward),
    coverage(kReluForward),
    coverage(kReluBackward),
    coverage(kGeluForward),
    coverage(kGeluBackward),
    coverage(kDropoutForward),
    coverage(kDropoutBackward),
    coverage(kSoftmaxForward),
    coverage(kSoftmaxBackward),
    coverage(kAttentionForward),
    coverage(kAttentionBackward),
    coverage(kEmbeddingForward),
    coverage(kEmbeddingBackward),
    coverage(kAdd),
    coverage(kMul),
    coverage(kScale),
    coverage(kAddInplace),
    coverage(kSumToShape),
    coverage(kPermuteCopy),
    coverage(kConcat),
    coverage(kSplit),
    coverage(kCrossEntropyForward),
    coverage(kCrossEntropyBackward),
    coverage(kTopkCorrect),
    coverage(kSgdStep),
    coverage(kAdamWStep),
    coverage(kAdamWVrStep),
    coverage(kSumOfSquares),
    coverage(kCastCopy),
    coverage(kMoveAdd),
};

}  // namespace

bool has_kernels_for(DeviceType type) { return ops_without_kernels(type).empty(); }

std::vector<std::string> ops_without_kernels(DeviceType type) {
  std::vector<std::string> missing;
  for (const RowCoverage& c : kCoverage) {
    if (!(type == DeviceType::kCPU ? c.cpu : c.cuda)) missing.push_back(c.name);
  }
  return missing;
}

// ---- public entry points -----------------------------------------------------------------------

Tensor matmul(ExecContext& ctx, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  return call(kMatmul, ctx, a, b, trans_a, trans_b);
}
MatmulGrads matmul_backward(ExecContext& ctx, const Tensor& dc, const Tensor& a, const Tensor& b,
                            bool trans_a, bool trans_b, bool need_da, bool need_db) {
  return call(kMatmulBackward, ctx, dc, a, b, trans_a, trans_b, need_da, need_db);
}
Tensor linear_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return call(kLinearForward, ctx, x, weight, bias);
}
Tensor linear_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight,
                       const Tensor& dweight, const Tensor& dbias, bool need_dx) {
  return call(kLinearBackward, ctx, dy, x, weight, dweight, dbias, need_dx);
}
LinearGeluResult linear_gelu_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight,
                                     const Tensor& bias) {
  return call(kLinearGeluForward, ctx, x, weight, bias);
}

Tensor conv2d_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const Conv2dParams& params) {
  return call(kConv2dForward, ctx, x, weight, bias, params);
}
Tensor conv2d_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight,
                       const Conv2dParams& params, const Tensor& dweight, const Tensor& dbias,
                       bool need_dx) {
  return call(kConv2dBackward, ctx, dy, x, weight, params, dweight, dbias, need_dx);
}

MaxPool2dResult max_pool2d_forward(ExecContext& ctx, const Tensor& x, const Pool2dParams& params) {
  return call(kMaxPool2dForward, ctx, x, params);
}
Tensor max_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Tensor& indices,
                           const Shape& x_shape) {
  return call(kMaxPool2dBackward, ctx, dy, indices, x_shape);
}
Tensor avg_pool2d_forward(ExecContext& ctx, const Tensor& x, const Pool2dParams& params) {
  return call(kAvgPool2dForward, ctx, x, params);
}
Tensor avg_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Shape& x_shape,
                           const Pool2dParams& params) {
  return call(kAvgPool2dBackward, ctx, dy, x_shape, params);
}
Tensor adaptive_avg_pool2d_forward(ExecContext& ctx, const Tensor& x, int64_t out_h,
                                   int64_t out_w) {
  return call(kAdaptiveAvgPool2dForward, ctx, x, out_h, out_w);
}
Tensor adaptive_avg_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Shape& x_shape) {
  return call(kAdaptiveAvgPool2dBackward, ctx, dy, x_shape);
}

DType batch_norm_stat_dtype(DType x) { return is_16bit(x) ? DType::kF32 : x; }

namespace {

// A channels-last x (N, C, H, W) as the (N H W, C) rows of its memory, and such rows back as a
// channels-last tensor shaped like x.
Tensor nhwc_rows(const Tensor& x) { return detail::nhwc_view(x).view({-1, x.size(1)}); }
Tensor from_nhwc_rows(const Tensor& rows, const Tensor& x) {
  return detail::from_nhwc(rows.view({x.size(0), x.size(2), x.size(3), x.size(1)}));
}

// The statistics of a batch norm call are in batch_norm_stat_dtype(x) on every device.
void check_stat_dtype(const char* op, const Tensor& x, const Tensor& stat, const char* name) {
  if (!x.defined() || !stat.defined()) return;
  STRATA_CHECK(stat.dtype() == batch_norm_stat_dtype(x.dtype()))
      << op << ": " << name << " is " << dtype_name(stat.dtype()) << " for a "
      << dtype_name(x.dtype()) << " x; batch-norm statistics are "
      << dtype_name(batch_norm_stat_dtype(x.dtype())) << " (f32 under bf16/f16)";
}

}  // namespace

BatchNormTrainResult batch_norm_forward_train(ExecContext& ctx, const Tensor& x,
                                              const Tensor& gamma, const Tensor& beta,
                                              const Tensor& running_mean, const Tensor& running_var,
                                              double momentum, double eps) {
  check_stat_dtype("batch_norm_forward_train", x, running_mean, "running_mean");
  check_stat_dtype("batch_norm_forward_train", x, running_var, "running_var");
  if (is_channels_last(x)) {  // NHWC memory is (N H W, C): the same per-channel statistics
    BatchNormTrainResult r = call(kBatchNormForwardTrain, ctx, nhwc_rows(x), gamma, beta,
                                  running_mean, running_var, momentum, eps);
    r.y = from_nhwc_rows(r.y, x);
    return r;
  }
  return call(kBatchNormForwardTrain, ctx, x, gamma, beta, running_mean, running_var, momentum,
              eps);
}
Tensor batch_norm_forward_eval(ExecContext& ctx, const Tensor& x, const Tensor& gamma,
                               const Tensor& beta, const Tensor& running_mean,
                               const Tensor& running_var, double eps) {
  check_stat_dtype("batch_norm_forward_eval", x, running_mean, "running_mean");
  check_stat_dtype("batch_norm_forward_eval", x, running_var, "running_var");
  if (is_channels_last(x)) {
    return from_nhwc_rows(
        call(kBatchNormForwardEval, ctx, nhwc_rows(x), gamma, beta, running_mean, running_var, eps),
        x);
  }
  return call(kBatchNormForwardEval, ctx, x, gamma, beta, running_mean, running_var, eps);
}
Tensor batch_norm_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                           const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dgamma,
                           const Tensor& dbeta) {
  check_stat_dtype("batch_norm_backward", x, save_mean, "save_mean");
  check_stat_dtype("batch_norm_backward", x, save_invstd, "save_invstd");
  if (is_channels_last(x)) {
    const Tensor dy_rows = detail::nhwc_operand(dy).view({-1, x.size(1)});
    return from_nhwc_rows(call(kBatchNormBackward, ctx, dy_rows, nhwc_rows(x), gamma, save_mean,
                               save_invstd, dgamma, dbeta),
                          x);
  }
  return call(kBatchNormBackward, ctx, dy, x, gamma, save_mean, save_invstd, dgamma, dbeta);
}

LayerNormResult layer_norm_forward(ExecContext& ctx, const Tensor& x, const Tensor& gamma,
                                   const Tensor& beta, double eps) {
  return call(kLayerNormForward, ctx, x, gamma, beta, eps);
}
Tensor layer_norm_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                           const Tensor& mean, const Tensor& rstd, const Tensor& dgamma,
                           const Tensor& dbeta) {
  for (const auto& [t, name] : {std::pair{&mean, "mean"}, std::pair{&rstd, "rstd"}}) {
    STRATA_CHECK(!x.defined() || !t->defined() || t->dtype() == batch_norm_stat_dtype(x.dtype()))
        << "layer_norm_backward: " << name << " is " << dtype_name(t->dtype()) << " for a "
        << dtype_name(x.dtype()) << " x; the saved statistics are "
        << dtype_name(batch_norm_stat_dtype(x.dtype())) << " (f32 under bf16/f16)";
  }
  return call(kLayerNormBackward, ctx, dy, x, gamma, mean, rstd, dgamma, dbeta);
}

// Element-wise ops keep a channels-last activation channels-last: they run on its NHWC memory.
Tensor relu_forward(ExecContext& ctx, const Tensor& x) {
  if (is_channels_last(x)) return detail::from_nhwc(call(kReluForward, ctx, detail::nhwc_view(x)));
  return call(kReluForward, ctx, x);
}
Tensor relu_backward(ExecContext& ctx, const Tensor& dy, const Tensor& y) {
  if (is_channels_last(y)) {
    return detail::from_nhwc(
        call(kReluBackward, ctx, detail::nhwc_operand(dy), detail::nhwc_view(y)));
  }
  return call(kReluBackward, ctx, dy, y);
}
Tensor gelu_forward(ExecContext& ctx, const Tensor& x) {
  if (is_channels_last(x)) return detail::from_nhwc(call(kGeluForward, ctx, detail::nhwc_view(x)));
  return call(kGeluForward, ctx, x);
}
Tensor gelu_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x) {
  if (is_channels_last(x)) {
    return detail::from_nhwc(
        call(kGeluBackward, ctx, detail::nhwc_operand(dy), detail::nhwc_view(x)));
  }
  return call(kGeluBackward, ctx, dy, x);
}

DropoutResult dropout_forward(ExecContext& ctx, const Tensor& x, double p, const RngOffsets& rng) {
  return call(kDropoutForward, ctx, x, p, rng);
}
Tensor dropout_backward(ExecContext& ctx, const Tensor& dy, const Tensor& mask, double p) {
  return call(kDropoutBackward, ctx, dy, mask, p);
}

Tensor softmax_forward(ExecContext& ctx, const Tensor& x) { return call(kSoftmaxForward, ctx, x); }
Tensor softmax_backward(ExecContext& ctx, const Tensor& dy, const Tensor& y) {
  return call(kSoftmaxBackward, ctx, dy, y);
}

AttentionResult attention_forward(ExecContext& ctx, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& key_padding_mask,
                                  const AttentionOptions& options) {
  return call(kAttentionForward, ctx, q, k, v, key_padding_mask, options);
}
AttentionGrads attention_backward(ExecContext& ctx, const Tensor& dout, const Tensor& q,
                                  const Tensor& k, const Tensor& v, const AttentionResult& saved,
                                  const Tensor& key_padding_mask, const AttentionOptions& options) {
  return call(kAttentionBackward, ctx, dout, q, k, v, saved, key_padding_mask, options);
}

Tensor embedding_forward(ExecContext& ctx, const Tensor& ids, const Tensor& weight) {
  return call(kEmbeddingForward, ctx, ids, weight);
}
void embedding_backward(ExecContext& ctx, const Tensor& dy, const Tensor& ids,
                        const Tensor& dweight) {
  call(kEmbeddingBackward, ctx, dy, ids, dweight);
}

namespace {
// A binary element-wise op with a channels-last operand and image-sized (at most 4-D) operands:
// on NHWC memory (the other operand converted or broadcast in NHWC order).
bool nhwc_binary(const Tensor& a, const Tensor& b) {
  return (is_channels_last(a) || is_channels_last(b)) && a.dim() <= 4 && b.dim() <= 4;
}
}  // namespace

Tensor add(ExecContext& ctx, const Tensor& a, const Tensor& b) {
  if (nhwc_binary(a, b)) {
    return detail::from_nhwc(call(kAdd, ctx, detail::nhwc_operand(a), detail::nhwc_operand(b)));
  }
  return call(kAdd, ctx, a, b);
}
Tensor mul(ExecContext& ctx, const Tensor& a, const Tensor& b) {
  if (nhwc_binary(a, b)) {
    return detail::from_nhwc(call(kMul, ctx, detail::nhwc_operand(a), detail::nhwc_operand(b)));
  }
  return call(kMul, ctx, a, b);
}
Tensor scale(ExecContext& ctx, const Tensor& x, double alpha) {
  if (is_channels_last(x)) {
    return detail::from_nhwc(call(kScale, ctx, detail::nhwc_view(x), alpha));
  }
  return call(kScale, ctx, x, alpha);
}
void add_(ExecContext& ctx, const Tensor& dst, const Tensor& src, double alpha) {
  if (is_channels_last(dst) && src.dim() <= 4) {  // written through the view of dst's memory
    call(kAddInplace, ctx, detail::nhwc_view(dst), detail::nhwc_operand(src), alpha);
    return;
  }
  call(kAddInplace, ctx, dst, src, alpha);
}
Tensor sum_to_shape(ExecContext& ctx, const Tensor& t, const Shape& shape) {
  return call(kSumToShape, ctx, t, shape);
}

Tensor permute_copy(ExecContext& ctx, const Tensor& x, const std::vector<int64_t>& dims) {
  return call(kPermuteCopy, ctx, x, dims);
}
Tensor concat(ExecContext& ctx, const TensorList& xs, int64_t dim) {
  return call(kConcat, ctx, xs, dim);
}
TensorList split(ExecContext& ctx, const Tensor& x, const std::vector<int64_t>& sizes,
                 int64_t dim) {
  return call(kSplit, ctx, x, sizes, dim);
}

Tensor linear_padded_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight,
                             const Tensor& bias, int64_t n) {
  return call(kLinearPaddedForward, ctx, x, weight, bias, n);
}
Tensor linear_padded_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x,
                              const Tensor& weight, const Tensor& dweight, const Tensor& dbias,
                              int64_t n, bool need_dx) {
  return call(kLinearPaddedBackward, ctx, dy, x, weight, dweight, dbias, n, need_dx);
}

namespace {

// A padded vocabulary on the CPU (CrossEntropyOptions::num_classes below the logits' columns):
// the kernel runs on a contiguous copy of the counted columns, so the loss and their gradient are
// bit for bit those of the unpadded logits. 0 when the call is not padded (or not on the CPU: the
// CUDA kernels take the padding themselves).
int64_t cpu_counted_classes(const ExecContext& ctx, const Tensor& logits,
                            const CrossEntropyOptions& options, const char* op) {
  if (!logits.defined() || logits.dim() != 2) return 0;
  STRATA_CHECK(options.num_classes >= 0 && options.num_classes <= logits.size(1))
      << op << ": options.num_classes " << options.num_classes << " must be in [0, "
      << logits.size(1) << "] for logits " << logits.shape_str();
  const bool padded = options.num_classes > 0 && options.num_classes < logits.size(1);
  return ctx.device().is_cpu() && padded ? options.num_classes : 0;
}

Tensor counted_columns(ExecContext& ctx, const Tensor& logits, int64_t n) {
  Tensor c = Tensor::empty({logits.size(0), n}, logits.dtype(), &ctx.allocator());
  c.copy_from(logits.narrow(1, 0, n));
  return c;
}

}  // namespace

Tensor cross_entropy_forward(ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                             const CrossEntropyOptions& options) {
  const int64_t n = cpu_counted_classes(ctx, logits, options, "cross_entropy_forward");
  if (n == 0) return call(kCrossEntropyForward, ctx, logits, targets, options);
  CrossEntropyOptions all = options;
  all.num_classes = 0;
  return call(kCrossEntropyForward, ctx, counted_columns(ctx, logits, n), targets, all);
}
Tensor cross_entropy_backward(ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                              const CrossEntropyOptions& options, double dloss) {
  const int64_t n = cpu_counted_classes(ctx, logits, options, "cross_entropy_backward");
  if (n == 0) return call(kCrossEntropyBackward, ctx, logits, targets, options, dloss);
  CrossEntropyOptions all = options;
  all.num_classes = 0;
  const Tensor counted =
      call(kCrossEntropyBackward, ctx, counted_columns(ctx, logits, n), targets, all, dloss);
  Tensor dlogits = Tensor::zeros(logits.shape(), counted.dtype(), &ctx.allocator());
  dlogits.narrow(1, 0, n).copy_from(counted);
  return dlogits;
}
int64_t topk_correct(ExecContext& ctx, const Tensor& logits, const Tensor& targets, int64_t k,
                     int64_t ignore_index) {
  return call(kTopkCorrect, ctx, logits, targets, k, ignore_index);
}

// The CUDA kernels read the gradient as it is: a grad_scale other than 1 scales it in place first.
template <typename Options>
Options scaled_first(ExecContext& ctx, const Tensor& grad, const Options& options) {
  if (ctx.device().is_cpu() || options.grad_scale == 1.0) return options;
  scale_gradients(ctx, {grad}, options.grad_scale);
  Options o = options;
  o.grad_scale = 1.0;
  return o;
}

void sgd_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
              const SgdOptions& options, int64_t step) {
  call(kSgdStep, ctx, param, grad, momentum_buf, scaled_first(ctx, grad, options), step);
}
void adamw_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                const Tensor& v, const AdamWOptions& options, int64_t step) {
  call(kAdamWStep, ctx, param, grad, m, v, scaled_first(ctx, grad, options), step);
}
double sgd_step_sq(ExecContext& ctx, const Tensor& param, const Tensor& grad,
                   const Tensor& momentum_buf, const SgdOptions& options, int64_t step) {
  if (ctx.device().is_cpu()) return call(kSgdStepSq, ctx, param, grad, momentum_buf, options, step);
  const double sq = sum_of_squares(ctx, grad);
  sgd_step(ctx, param, grad, momentum_buf, options, step);
  return sq;
}
double adamw_step_sq(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                     const Tensor& v, const AdamWOptions& options, int64_t step) {
  if (ctx.device().is_cpu()) return call(kAdamWStepSq, ctx, param, grad, m, v, options, step);
  const double sq = sum_of_squares(ctx, grad);
  adamw_step(ctx, param, grad, m, v, options, step);
  return sq;
}
void adamw_vr_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                   const Tensor& v, const Tensor& m2, const AdamWVrOptions& options, int64_t step) {
  call(kAdamWVrStep, ctx, param, grad, m, v, m2, options, step);
}
double sum_of_squares(ExecContext& ctx, const Tensor& t) { return call(kSumOfSquares, ctx, t); }

void cast_copy_(ExecContext& ctx, const Tensor& dst, const Tensor& src) {
  call(kCastCopy, ctx, dst, src);
}
Tensor cast(ExecContext& ctx, const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor y = Tensor::empty(x.shape(), dtype, &ctx.allocator());
  cast_copy_(ctx, y, x.contiguous());
  return y;
}
void move_add_(ExecContext& ctx, const Tensor& dst, const Tensor& src) {
  call(kMoveAdd, ctx, dst, src);
}

}  // namespace strata::ops
