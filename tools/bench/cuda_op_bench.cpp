// CUDA op benchmarks on the shapes of GPT-2 124M (B=8, T=1024, C=768, H=12, D=64, V=50257: N = B T
// = 8192 rows) and ResNet-50 (batch 64, 224 px), each timed with CUDA events on the context's
// stream and compared with the GPU's roofline.
//
// Timing: two warm-up calls (plan caches, the caching allocator), then repeats of a burst of calls
// between two events (the burst sized to about 2 ms so that short kernels are not dominated by
// the event resolution) until --min-seconds have passed and at least 5 repeats are in; the time
// per call is the median over the repeats. Outputs allocated by the op are freed and reused
// between calls, as in training.
//
// FLOPs: a multiply-add counts 2. Products (linear, conv, attention) count their products exactly;
// attention counts only the causal pairs (T (T + 1) / 2 per head) and, in backward, the four
// products dV, dP, dQ, dK (the fused kernel's recomputation of Q K^T is not counted).
// Pointwise and reduction ops count a nominal few FLOPs per element (given per op below); they are
// memory-bound by orders of magnitude, so the count does not move their roofline.
// Bytes: the minimum traffic: every input read once and every output written once (f32 4 bytes,
// i32 ids 4, i64 targets and indices 8); a gradient that is accumulated into (dweight, dbias,
// dgamma, dbeta) is read and written. The embedding counts the N gathered (forward) or updated
// (backward) rows, not the whole table.
// Roofline: bound = max(FLOPs / peak FLOP/s, bytes / peak bandwidth); "roof" = bound / measured.
// The FLOP peak is the precision's for the products that use tensor cores under TF32 (linear and
// conv: cuBLASLt, cuDNN) and the fp32 CUDA-core peak for everything else (the fused f32 attention
// kernel runs FMA, not tensor cores).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "engine/check.h"
#include "engine/exec_context.h"
#include "io/metrics.h"
#include "tools/bench/op_bench.h"
#include "tools/bench/roofline.h"

#ifdef STRATA_WITH_CUDA
#include "engine/cuda_exec.h"
#include "engine/cuda_runtime.h"
#include "engine/philox.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/batch_norm.h"
#include "ops/conv2d.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/layer_norm.h"
#include "ops/matmul.h"
#include "ops/optimizer.h"
#include "ops/pooling.h"
#include "ops/softmax.h"
#include "tools/bench/bench_random.h"
#endif

namespace strata::tools {

#ifndef STRATA_WITH_CUDA

int run_cuda_op_bench(const OpBenchOptions&, const Device& device, const std::string&) {
  STRATA_THROW() << "strata bench --device " << device.str()
                 << ": this build has no CUDA (configure with -DSTRATA_WITH_CUDA=ON)";
}

#else

namespace {

using Clock = std::chrono::steady_clock;

struct Case {
  std::string name;
  std::string shape;
  double flops = 0;
  double bytes = 0;
  bool tensor_cores = false;  // a product that TF32 puts on tensor cores
  std::function<void()> run;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Seconds per call of `run` on the context's stream (see the file comment).
double time_case(ExecContext& ctx, const std::function<void()>& run, double min_seconds) {
  const cudaStream_t stream = cuda::exec(ctx).stream();
  run();
  run();
  cuda::Event begin(true), end(true);
  begin.record(stream);
  run();
  end.record(stream);
  end.synchronize();
  const double once = std::max(1e-7, end.elapsed_ms_since(begin) * 1e-3);
  const int burst = static_cast<int>(std::clamp(std::ceil(2e-3 / once), 1.0, 1000.0));
  std::vector<double> per_call;
  const auto start = Clock::now();
  do {
    begin.record(stream);
    for (int i = 0; i < burst; ++i) run();
    end.record(stream);
    end.synchronize();
    per_call.push_back(end.elapsed_ms_since(begin) * 1e-3 / burst);
  } while ((std::chrono::duration<double>(Clock::now() - start).count() < min_seconds ||
            per_call.size() < 5) &&
           per_call.size() < 2000);
  return median(per_call);
}

// Uniform [-1, 1) f32 on the device.
Tensor dev_random(ExecContext& ctx, const Shape& shape, uint64_t seed) {
  return to_allocator(bench_random(shape, seed), ctx.allocator());
}
Tensor dev_zeros(ExecContext& ctx, const Shape& shape) {
  return to_allocator(Tensor::zeros(shape), ctx.allocator());
}
Tensor dev_ones(ExecContext& ctx, const Shape& shape) {
  return to_allocator(Tensor::full(shape, 1.0), ctx.allocator());
}
// Ids uniform in [0, n) of `dtype` (i32 or i64) on the device.
Tensor dev_ids(ExecContext& ctx, const Shape& shape, int64_t n, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  PhiloxStream rng(seed, 0x1d5);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t id = std::min<int64_t>(n - 1, static_cast<int64_t>(rng.next_uniform() * n));
    if (dtype == DType::kI32) {
      t.data<int32_t>()[i] = static_cast<int32_t>(id);
    } else {
      t.data<int64_t>()[i] = id;
    }
  }
  return to_allocator(t, ctx.allocator());
}

std::string dims(std::initializer_list<int64_t> d) {
  std::string s = "(";
  for (int64_t v : d) s += (s.size() > 1 ? "," : "") + std::to_string(v);
  return s + ")";
}

class Runner {
 public:
  Runner(ExecContext& ctx, const OpBenchOptions& o, const std::string& precision,
         const DevicePeaks& peaks)
      : ctx_(ctx), o_(o), json_(o.json), peaks_(peaks) {
    tc_peak_ = peak_flops(peaks, precision);
    fp32_peak_ = peak_flops(peaks, "fp32");
    bandwidth_ = peak_bytes_per_second(peaks);
  }

  bool wanted(const std::string& name) const {
    return o_.filter.empty() || name.find(o_.filter) != std::string::npos;
  }

  void header() const {
    std::printf("%-24s %-34s %9s %8s %8s %9s %6s %s\n", "case", "shape", "ms", "TFLOP/s", "GB/s",
                "bound ms", "roof", "bound by");
  }

  void run(const Case& c) {
    if (!wanted(c.name)) return;
    const double t = time_case(ctx_, c.run, o_.min_seconds);
    const double peak = c.tensor_cores ? tc_peak_ : fp32_peak_;
    const double bound = roofline_seconds(c.flops, c.bytes, peak, bandwidth_);
    const bool compute = peak > 0 && bandwidth_ > 0 && c.flops / peak >= c.bytes / bandwidth_;
    const double tflops = c.flops / t / 1e12, gbps = c.bytes / t / 1e9;
    if (bound > 0) {
      std::printf("%-24s %-34s %9.3f %8.2f %8.1f %9.3f %5.1f%% %s\n", c.name.c_str(),
                  c.shape.c_str(), t * 1e3, tflops, gbps, bound * 1e3, 100.0 * bound / t,
                  compute ? "compute" : "memory");
    } else {
      std::printf("%-24s %-34s %9.3f %8.2f %8.1f %9s %6s %s\n", c.name.c_str(), c.shape.c_str(),
                  t * 1e3, tflops, gbps, "-", "-", "peak unknown");
    }
    std::fflush(stdout);
    nlohmann::json r = {
        {"case", c.name},   {"shape", c.shape}, {"ms", t * 1e3}, {"flops", c.flops},
        {"bytes", c.bytes}, {"tflops", tflops}, {"gbps", gbps},  {"tensor_cores", c.tensor_cores}};
    if (bound > 0) {
      r["bound_ms"] = bound * 1e3;
      r["roofline_fraction"] = bound / t;
      r["bound_by"] = compute ? "compute" : "memory";
    }
    json_.write(r);
  }

 private:
  ExecContext& ctx_;
  const OpBenchOptions& o_;
  io::JsonlWriter json_;
  DevicePeaks peaks_;
  double tc_peak_ = 0, fp32_peak_ = 0, bandwidth_ = 0;
};

constexpr double kF = 4.0;  // bytes of an f32

void gpt2_cases(ExecContext& ctx, Runner& r) {
  const int64_t B = 8, T = 1024, C = 768, H = 12, D = C / H, V = 50257, N = B * T;
  const double n = static_cast<double>(N);

  // Linear layers of a block: x (N, K) @ w (M, K)^T + b.
  struct Linear {
    const char* name;
    int64_t k, m;
  };
  for (const Linear& l :
       {Linear{"gpt2_linear_qkv", C, 3 * C}, Linear{"gpt2_linear_proj", C, C},
        Linear{"gpt2_linear_fc", C, 4 * C}, Linear{"gpt2_linear_fcproj", 4 * C, C}}) {
    const std::string fwd = std::string(l.name) + "_fwd", bwd = std::string(l.name) + "_bwd";
    if (!r.wanted(fwd) && !r.wanted(bwd)) continue;
    const double k = static_cast<double>(l.k), m = static_cast<double>(l.m);
    Tensor x = dev_random(ctx, {N, l.k}, 1), w = dev_random(ctx, {l.m, l.k}, 2);
    Tensor b = dev_random(ctx, {l.m}, 3), dy = dev_random(ctx, {N, l.m}, 4);
    Tensor dw = dev_zeros(ctx, {l.m, l.k}), db = dev_zeros(ctx, {l.m});
    const std::string shape = "x" + dims({N, l.k}) + " w" + dims({l.m, l.k});
    r.run({fwd, shape, 2 * n * k * m, kF * (n * k + m * k + m + n * m), true,
           [&] { ops::linear_forward(ctx, x, w, b); }});
    r.run({bwd, shape, 4 * n * k * m + n * m,
           kF * (n * m + n * k + m * k + n * k + 2 * (m * k + m)), true,
           [&] { ops::linear_backward(ctx, dy, x, w, dw, db, true); }});
  }

  if (r.wanted("gpt2_attention")) {
    const Shape qs{B, H, T, D};
    Tensor q = dev_random(ctx, qs, 5), k = dev_random(ctx, qs, 6), v = dev_random(ctx, qs, 7);
    Tensor dout = dev_random(ctx, qs, 8);
    ops::AttentionOptions ao;
    ao.causal = true;
    const ops::AttentionResult saved = ops::attention_forward(ctx, q, k, v, Tensor(), ao);
    const double pairs = static_cast<double>(B * H) * T * (T + 1) / 2.0;
    const double bhtd = static_cast<double>(B * H * T * D), bht = static_cast<double>(B * H * T);
    const std::string shape = "q,k,v" + dims({B, H, T, D}) + " causal";
    r.run({"gpt2_attention_fwd", shape, 2 * 2 * pairs * D, kF * (4 * bhtd + bht), false,
           [&] { ops::attention_forward(ctx, q, k, v, Tensor(), ao); }});
    r.run({"gpt2_attention_bwd", shape, 4 * 2 * pairs * D, kF * (8 * bhtd + bht), false,
           [&] { ops::attention_backward(ctx, dout, q, k, v, saved, Tensor(), ao); }});
  }

  if (r.wanted("gpt2_layernorm")) {
    Tensor x = dev_random(ctx, {N, C}, 9), dy = dev_random(ctx, {N, C}, 10);
    Tensor g = dev_ones(ctx, {C}), b = dev_zeros(ctx, {C});
    Tensor dg = dev_zeros(ctx, {C}), dbeta = dev_zeros(ctx, {C});
    const ops::LayerNormResult res = ops::layer_norm_forward(ctx, x, g, b, 1e-5);
    const double e = n * C;
    const std::string shape = "x" + dims({N, C});
    // Nominal FLOPs: 8 per element forward (mean, variance, normalize, affine), 12 backward.
    r.run({"gpt2_layernorm_fwd", shape, 8 * e, kF * (2 * e + 2 * C + 2 * n), false,
           [&] { ops::layer_norm_forward(ctx, x, g, b, 1e-5); }});
    r.run({"gpt2_layernorm_bwd", shape, 12 * e, kF * (3 * e + C + 2 * n + 4 * C), false,
           [&] { ops::layer_norm_backward(ctx, dy, x, g, res.mean, res.rstd, dg, dbeta); }});
  }

  if (r.wanted("gpt2_gelu")) {
    Tensor x = dev_random(ctx, {N, 4 * C}, 11), dy = dev_random(ctx, {N, 4 * C}, 12);
    const double e = n * 4 * C;
    const std::string shape = "x" + dims({N, 4 * C});
    // Nominal FLOPs (tanh form): 10 per element forward, 20 backward.
    r.run({"gpt2_gelu_fwd", shape, 10 * e, kF * 2 * e, false, [&] { ops::gelu_forward(ctx, x); }});
    r.run({"gpt2_gelu_bwd", shape, 20 * e, kF * 3 * e, false,
           [&] { ops::gelu_backward(ctx, dy, x); }});
  }

  if (r.wanted("gpt2_cross_entropy")) {
    Tensor logits = dev_random(ctx, {N, V}, 13);
    Tensor targets = dev_ids(ctx, {N}, V, DType::kI64, 14);
    const ops::CrossEntropyOptions co;
    const double e = n * V;
    const std::string shape = "logits" + dims({N, V});
    // Nominal FLOPs: 4 per logit (max, subtract, exp, sum) either way.
    r.run({"gpt2_cross_entropy_fwd", shape, 4 * e, kF * e + 8 * n + kF, false,
           [&] { ops::cross_entropy_forward(ctx, logits, targets, co); }});
    r.run({"gpt2_cross_entropy_bwd", shape, 4 * e, 2 * kF * e + 8 * n, false,
           [&] { ops::cross_entropy_backward(ctx, logits, targets, co, 1.0); }});
  }

  if (r.wanted("gpt2_embedding")) {
    Tensor ids = dev_ids(ctx, {B, T}, V, DType::kI32, 15);
    Tensor wte = dev_random(ctx, {V, C}, 16), dwte = dev_zeros(ctx, {V, C});
    Tensor dy = dev_random(ctx, {B, T, C}, 17);
    const double e = n * C;
    const std::string shape = "ids" + dims({B, T}) + " wte" + dims({V, C});
    r.run({"gpt2_embedding_fwd", shape, 0, 4 * n + 2 * kF * e, false,
           [&] { ops::embedding_forward(ctx, ids, wte); }});
    r.run({"gpt2_embedding_bwd", shape, e, 4 * n + 3 * kF * e, false,
           [&] { ops::embedding_backward(ctx, dy, ids, dwte); }});
  }

  if (r.wanted("gpt2_adamw")) {
    const int64_t P = 124439808;  // GPT-2 124M (V = 50257, tied embedding once)
    Tensor host = bench_random({P}, 18);
    Tensor p = to_allocator(host, ctx.allocator()), g = to_allocator(host, ctx.allocator());
    Tensor m = to_allocator(host, ctx.allocator()), v = dev_zeros(ctx, {P});
    host = Tensor();
    ops::AdamWOptions ao;
    ao.lr = 1e-4;
    int64_t step = 0;
    // Nominal FLOPs: 12 per parameter. Bytes: read p, g, m, v; write p, m, v.
    r.run({"gpt2_adamw", "params" + dims({P}), 12.0 * P, 7 * kF * P, false,
           [&] { ops::adamw_step(ctx, p, g, m, v, ao, ++step); }});
  }

  if (r.wanted("gpt2_softmax")) {
    const Shape s{B, H, T, T};
    Tensor x = dev_random(ctx, s, 19), dy = dev_random(ctx, s, 20);
    const Tensor y = ops::softmax_forward(ctx, x);
    const double e = static_cast<double>(shape_numel(s));
    const std::string shape = "scores" + dims({B, H, T, T});
    // Nominal FLOPs: 4 per element forward (max, exp, sum, divide), 4 backward.
    r.run({"gpt2_softmax_fwd", shape, 4 * e, 2 * kF * e, false,
           [&] { ops::softmax_forward(ctx, x); }});
    r.run({"gpt2_softmax_bwd", shape, 4 * e, 3 * kF * e, false,
           [&] { ops::softmax_backward(ctx, dy, y); }});
  }
}

void resnet50_cases(ExecContext& ctx, Runner& r) {
  const int64_t B = 64;
  struct Conv {
    const char* name;
    int64_t c, h, oc, k, stride, pad;
  };
  for (const Conv& cv : {Conv{"resnet50_conv1_7x7s2", 3, 224, 64, 7, 2, 3},
                         Conv{"resnet50_layer1_3x3", 64, 56, 64, 3, 1, 1},
                         Conv{"resnet50_layer1_1x1", 64, 56, 256, 1, 1, 0},
                         Conv{"resnet50_layer3_3x3", 256, 14, 256, 3, 1, 1},
                         Conv{"resnet50_layer4_3x3s2", 512, 14, 512, 3, 2, 1}}) {
    const std::string fwd = std::string(cv.name) + "_fwd", bwd = std::string(cv.name) + "_bwd";
    if (!r.wanted(fwd) && !r.wanted(bwd)) continue;
    ops::Conv2dParams p;
    p.stride_h = p.stride_w = cv.stride;
    p.pad_h = p.pad_w = cv.pad;
    const int64_t oh = ops::conv2d_output_size(cv.h, cv.k, cv.stride, cv.pad, 1);
    Tensor x = dev_random(ctx, {B, cv.c, cv.h, cv.h}, 21);
    Tensor w = dev_random(ctx, {cv.oc, cv.c, cv.k, cv.k}, 22);
    Tensor dy = dev_random(ctx, {B, cv.oc, oh, oh}, 23);
    Tensor dw = dev_zeros(ctx, {cv.oc, cv.c, cv.k, cv.k});
    const double xs = static_cast<double>(B * cv.c * cv.h * cv.h);
    const double ws = static_cast<double>(cv.oc * cv.c * cv.k * cv.k);
    const double ys = static_cast<double>(B * cv.oc * oh * oh);
    const double flops = 2.0 * ys * cv.c * cv.k * cv.k;
    const std::string shape = "x" + dims({B, cv.c, cv.h, cv.h}) + " w" +
                              dims({cv.oc, cv.c, cv.k, cv.k}) + " s" + std::to_string(cv.stride);
    r.run({fwd, shape, flops, kF * (xs + ws + ys), true,
           [&] { ops::conv2d_forward(ctx, x, w, Tensor(), p); }});
    r.run({bwd, shape, 2 * flops, kF * (ys + xs + ws + xs + 2 * ws), true,
           [&] { ops::conv2d_backward(ctx, dy, x, w, p, dw, Tensor(), true); }});
  }

  struct Norm {
    const char* name;
    int64_t c, h;
  };
  for (const Norm& nm : {Norm{"resnet50_bn_stem", 64, 112}, Norm{"resnet50_bn_layer1", 256, 56}}) {
    const std::string fwd = std::string(nm.name) + "_fwd", bwd = std::string(nm.name) + "_bwd";
    if (!r.wanted(fwd) && !r.wanted(bwd)) continue;
    const Shape s{B, nm.c, nm.h, nm.h};
    Tensor x = dev_random(ctx, s, 24), dy = dev_random(ctx, s, 25);
    Tensor g = dev_ones(ctx, {nm.c}), b = dev_zeros(ctx, {nm.c});
    Tensor rm = dev_zeros(ctx, {nm.c}), rv = dev_ones(ctx, {nm.c});
    Tensor dg = dev_zeros(ctx, {nm.c}), db = dev_zeros(ctx, {nm.c});
    const ops::BatchNormTrainResult res =
        ops::batch_norm_forward_train(ctx, x, g, b, rm, rv, 0.1, 1e-5);
    const double e = static_cast<double>(shape_numel(s)), c = static_cast<double>(nm.c);
    const std::string shape = "x" + dims({B, nm.c, nm.h, nm.h});
    // Nominal FLOPs: 8 per element forward (statistics, normalize, affine), 12 backward.
    r.run({fwd, shape, 8 * e, kF * (2 * e + 8 * c), false,
           [&] { ops::batch_norm_forward_train(ctx, x, g, b, rm, rv, 0.1, 1e-5); }});
    r.run({bwd, shape, 12 * e, kF * (3 * e + 7 * c), false, [&] {
             ops::batch_norm_backward(ctx, dy, x, g, res.save_mean, res.save_invstd, dg, db);
           }});
  }

  if (r.wanted("resnet50_maxpool")) {
    const Shape s{B, 64, 112, 112};
    ops::Pool2dParams p;
    p.kernel_h = p.kernel_w = 3;
    p.stride_h = p.stride_w = 2;
    p.pad_h = p.pad_w = 1;
    Tensor x = dev_random(ctx, s, 26);
    const ops::MaxPool2dResult res = ops::max_pool2d_forward(ctx, x, p);
    Tensor dy = dev_random(ctx, res.y.shape(), 27);
    const double in = static_cast<double>(shape_numel(s));
    const double out = static_cast<double>(res.y.numel());
    const std::string shape = "x" + dims({B, 64, 112, 112}) + " 3x3 s2";
    // Nominal FLOPs: 9 comparisons per output. The i64 indices are an output (8 bytes each).
    r.run({"resnet50_maxpool_fwd", shape, 9 * out, kF * (in + out) + 8 * out, false,
           [&] { ops::max_pool2d_forward(ctx, x, p); }});
    r.run({"resnet50_maxpool_bwd", shape, out, kF * (out + in) + 8 * out, false,
           [&] { ops::max_pool2d_backward(ctx, dy, res.indices, s); }});
  }

  if (r.wanted("resnet50_relu")) {
    const Shape s{B, 256, 56, 56};
    Tensor x = dev_random(ctx, s, 28), dy = dev_random(ctx, s, 29);
    const Tensor y = ops::relu_forward(ctx, x);
    const double e = static_cast<double>(shape_numel(s));
    const std::string shape = "x" + dims({B, 256, 56, 56});
    r.run({"resnet50_relu_fwd", shape, e, 2 * kF * e, false, [&] { ops::relu_forward(ctx, x); }});
    r.run({"resnet50_relu_bwd", shape, e, 3 * kF * e, false,
           [&] { ops::relu_backward(ctx, dy, y); }});
  }
}

}  // namespace

int run_cuda_op_bench(const OpBenchOptions& options, const Device& device,
                      const std::string& precision) {
  check_precision(precision);
  STRATA_CHECK(device.is_cuda()) << "run_cuda_op_bench needs a cuda:N device, got " << device;
  ExecContext ctx(device);
  cuda::set_tf32(ctx.cuda(), precision == "tf32");
  const std::string name = cuda_device_name(device.index);
  const DevicePeaks peaks = device_peaks(name);
  std::printf("CUDA op benchmark on %s (%s), %s\n", device.str().c_str(), name.c_str(),
              precision.c_str());
  if (peaks.known) {
    std::printf(
        "roofline: %s, %.1f TFLOP/s %s for linear/conv, %.1f TFLOP/s fp32 for the rest, %.2f "
        "TB/s\n",
        peaks.name.c_str(), peak_flops(peaks, precision) / 1e12, precision.c_str(),
        peaks.fp32_tflops, peaks.hbm_tbytes_per_s);
  } else {
    std::printf("roofline: peak unknown for %s (no bound)\n", name.c_str());
  }
  Runner runner(ctx, options, precision, peaks);
  runner.header();
  gpt2_cases(ctx, runner);
  resnet50_cases(ctx, runner);
  std::printf(
      "ms = median time per call (CUDA events); roof = bound / measured, bound = max(FLOPs / peak, "
      "bytes / bandwidth); bytes = inputs read once + outputs written once\n");
  return 0;
}

#endif  // STRATA_WITH_CUDA

}  // namespace strata::tools
