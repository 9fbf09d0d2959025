// CUDA op benchmarks on the shapes of GPT-2 124M (B=8, T=1024, C=768, H=12, D=64, V=50257: N = B T
// = 8192 rows) and ResNet-50 (batch 64, 224 px), each timed with CUDA events on the context's
// stream and compared with the GPU's roofline.
//
// Precision: fp32 and tf32 run every case on f32 tensors (tf32: linear and conv on TF32 tensor
// cores). bf16 and fp16 run them as a mixed-precision training step does (`strata train
// --precision`, graph/param_store.h): activations, weights, their gradients (dweight, dbias,
// dgamma, dbeta: the 16-bit working gradients) in 16 bits; what the ops keep in f32 stays f32
// (attention's log-sum-exp, the cross-entropy loss, the normalization statistics: layer norm mean
// and rstd, batch norm save_mean, save_invstd and running statistics), ids, targets and
// pooling indices stay integers, and AdamW updates f32 master weights with f32 gradients and state
// in every precision. Under bf16/fp16 two more cases time the mixed-precision bookkeeping of a
// step over the GPT-2 124M parameters: ops::cast_copy_ of the f32 masters into the 16-bit working
// weights, and ops::move_add_ of the 16-bit gradients into the f32 master gradients. A case whose
// op refuses it (an Error: a dtype or a configuration its kernel or library does not take) is
// skipped with a printed note, and the other cases run.
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
// Bytes: the minimum traffic: every input read once and every output written once, each at the
// size of its dtype (f32 4 bytes, bf16 and f16 2, i32 ids 4, i64 targets and indices 8); a
// gradient that is accumulated into (dweight, dbias, dgamma, dbeta, the master gradients of
// move_add_) is read and written. The embedding counts the N gathered (forward) or updated
// (backward) rows, not the whole table. Scratch buffers of an op's own (the f32 dQ accumulator of
// attention backward and the f32 gradient of max-pool backward under bf16/fp16) are not counted.
// Roofline: bound = max(FLOPs / peak FLOP/s, bytes / peak bandwidth); "roof" = bound / measured.
// The FLOP peak of the products on tensor cores (linear, linear + GELU and conv: cuBLASLt, cuDNN)
// is the precision's: fp32 CUDA cores for fp32, TF32 for tf32, the dense bf16 tensor-core peak for
// bf16 and fp16 (the same on these GPUs); everything else is held to the fp32 CUDA-core peak (the
// fused attention kernel runs f32 FMA, not tensor cores, for f32, bf16 and f16 inputs alike).
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
#include "ops/layout.h"
#include "ops/matmul.h"
#include "ops/optimizer.h"
#include "ops/pooling.h"
#include "ops/precision.h"
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
  bool tensor_cores = false;  // a product on tensor cores under tf32, bf16 and fp16
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

// Uniform [-1, 1) values of `dtype` (rounded from f32) on the device.
Tensor dev_random(ExecContext& ctx, const Shape& shape, uint64_t seed, DType dtype = DType::kF32) {
  return to_allocator(bench_random(shape, seed).to(dtype), ctx.allocator());
}
Tensor dev_zeros(ExecContext& ctx, const Shape& shape, DType dtype = DType::kF32) {
  return to_allocator(Tensor::zeros(shape, dtype), ctx.allocator());
}
Tensor dev_ones(ExecContext& ctx, const Shape& shape, DType dtype = DType::kF32) {
  return to_allocator(Tensor::full(shape, 1.0, dtype), ctx.allocator());
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

// The first line of an error's message.
std::string first_line(const std::string& what) { return what.substr(0, what.find('\n')); }

// The dtype of the cases' 16-bit-capable tensors for --precision: f32 for fp32 and tf32.
DType tensor_dtype(const std::string& precision) {
  if (precision == "bf16") return DType::kBF16;
  if (precision == "fp16") return DType::kF16;
  return DType::kF32;
}

class Runner {
 public:
  Runner(ExecContext& ctx, const OpBenchOptions& o, const std::string& precision,
         const DevicePeaks& peaks)
      : ctx_(ctx), o_(o), json_(o.json), peaks_(peaks), precision_(precision) {
    tc_peak_ = peak_flops(peaks, precision);
    fp32_peak_ = peak_flops(peaks, "fp32");
    bandwidth_ = peak_bytes_per_second(peaks);
  }

  bool wanted(const std::string& name) const {
    return o_.filter.empty() || name.find(o_.filter) != std::string::npos;
  }

  // Runs a group of cases (its setup and its run() calls); an Error from the setup (an op that
  // refuses the precision's dtype) skips the rest of the group with a note.
  void group(const std::string& name, const std::function<void()>& body) {
    try {
      body();
    } catch (const Error& e) {
      skipped(name, e.what());
    }
  }

  void header() const {
    std::printf("%-24s %-34s %9s %8s %8s %9s %6s %s\n", "case", "shape", "ms", "TFLOP/s", "GB/s",
                "bound ms", "roof", "bound by");
  }

  void run(const Case& c) {
    if (!wanted(c.name)) return;
    double t = 0;
    try {
      t = time_case(ctx_, c.run, o_.min_seconds);
    } catch (const Error& e) {  // e.g. a kernel or library that does not take 16-bit tensors
      skipped(c.name, e.what());
      return;
    }
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
  void skipped(const std::string& name, const std::string& what) {
    const std::string why = first_line(what);
    std::printf("%-24s skipped under %s: %s\n", name.c_str(), precision_.c_str(), why.c_str());
    std::fflush(stdout);
    json_.write({{"case", name}, {"skipped", why}});
  }

  ExecContext& ctx_;
  const OpBenchOptions& o_;
  io::JsonlWriter json_;
  DevicePeaks peaks_;
  std::string precision_;
  double tc_peak_ = 0, fp32_peak_ = 0, bandwidth_ = 0;
};

constexpr double kF = 4.0;  // bytes of an f32

// The dtype of the tensors that run in 16 bits under bf16/fp16 (f32 otherwise) and its size.
struct Precision {
  DType dtype = DType::kF32;
  double a = kF;  // bytes per element of such a tensor
  bool mixed() const { return dtype != DType::kF32; }
};

void gpt2_cases(ExecContext& ctx, Runner& r, const Precision& pr) {
  const int64_t B = 8, T = 1024, C = 768, H = 12, D = C / H, V = 50257, N = B * T;
  const double n = static_cast<double>(N), a = pr.a;
  const DType dt = pr.dtype;

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
    r.group(l.name, [&] {
      const double k = static_cast<double>(l.k), m = static_cast<double>(l.m);
      Tensor x = dev_random(ctx, {N, l.k}, 1, dt), w = dev_random(ctx, {l.m, l.k}, 2, dt);
      Tensor b = dev_random(ctx, {l.m}, 3, dt), dy = dev_random(ctx, {N, l.m}, 4, dt);
      Tensor dw = dev_zeros(ctx, {l.m, l.k}, dt), db = dev_zeros(ctx, {l.m}, dt);
      const std::string shape = "x" + dims({N, l.k}) + " w" + dims({l.m, l.k});
      r.run({fwd, shape, 2 * n * k * m, a * (n * k + m * k + m + n * m), true,
             [&] { ops::linear_forward(ctx, x, w, b); }});
      r.run({bwd, shape, 4 * n * k * m + n * m,
             a * (n * m + n * k + m * k + n * k + 2 * (m * k + m)), true,
             [&] { ops::linear_backward(ctx, dy, x, w, dw, db, true); }});
    });
  }

  // The MLP's first linear layer and its GELU as one op (cuBLASLt's GELU_AUX_BIAS epilogue): y and
  // the pre-activation written.
  if (r.wanted("gpt2_linear_fc_gelu_fwd")) {
    r.group("gpt2_linear_fc_gelu_fwd", [&] {
      const double k = C, m = 4 * C;
      Tensor x = dev_random(ctx, {N, C}, 1, dt), w = dev_random(ctx, {4 * C, C}, 2, dt);
      Tensor b = dev_random(ctx, {4 * C}, 3, dt);
      const std::string shape = "x" + dims({N, C}) + " w" + dims({4 * C, C});
      r.run({"gpt2_linear_fc_gelu_fwd", shape, 2 * n * k * m + 10 * n * m,
             a * (n * k + m * k + m + 2 * n * m), true,
             [&] { ops::linear_gelu_forward(ctx, x, w, b); }});
    });
  }

  if (r.wanted("gpt2_attention")) {
    r.group("gpt2_attention", [&] {
      const Shape qs{B, H, T, D};
      Tensor q = dev_random(ctx, qs, 5, dt), k = dev_random(ctx, qs, 6, dt);
      Tensor v = dev_random(ctx, qs, 7, dt), dout = dev_random(ctx, qs, 8, dt);
      ops::AttentionOptions ao;
      ao.causal = true;
      const ops::AttentionResult saved = ops::attention_forward(ctx, q, k, v, Tensor(), ao);
      const double pairs = static_cast<double>(B * H) * T * (T + 1) / 2.0;
      const double bhtd = static_cast<double>(B * H * T * D);
      const double bht = static_cast<double>(B * H * T);
      const std::string shape = "q,k,v" + dims({B, H, T, D}) + " causal";
      // Forward reads q, k, v and writes out (a bytes each) and the f32 log-sum-exp; backward
      // reads dout, q, k, v, out, lse and writes dq, dk, dv.
      r.run({"gpt2_attention_fwd", shape, 2 * 2 * pairs * D, a * 4 * bhtd + kF * bht, false,
             [&] { ops::attention_forward(ctx, q, k, v, Tensor(), ao); }});
      r.run({"gpt2_attention_bwd", shape, 4 * 2 * pairs * D, a * 8 * bhtd + kF * bht, false,
             [&] { ops::attention_backward(ctx, dout, q, k, v, saved, Tensor(), ao); }});
    });
  }

  if (r.wanted("gpt2_layernorm")) {
    r.group("gpt2_layernorm", [&] {
      Tensor x = dev_random(ctx, {N, C}, 9, dt), dy = dev_random(ctx, {N, C}, 10, dt);
      Tensor g = dev_ones(ctx, {C}, dt), b = dev_zeros(ctx, {C}, dt);
      Tensor dg = dev_zeros(ctx, {C}, dt), dbeta = dev_zeros(ctx, {C}, dt);
      const ops::LayerNormResult res = ops::layer_norm_forward(ctx, x, g, b, 1e-5);
      const double e = n * C;
      const std::string shape = "x" + dims({N, C});
      // Nominal FLOPs: 8 per element forward (mean, variance, normalize, affine), 12 backward.
      // mean and rstd have x's dtype.
      r.run({"gpt2_layernorm_fwd", shape, 8 * e, a * (2 * e + 2 * C + 2 * n), false,
             [&] { ops::layer_norm_forward(ctx, x, g, b, 1e-5); }});
      r.run({"gpt2_layernorm_bwd", shape, 12 * e, a * (3 * e + C + 2 * n + 4 * C), false,
             [&] { ops::layer_norm_backward(ctx, dy, x, g, res.mean, res.rstd, dg, dbeta); }});
    });
  }

  if (r.wanted("gpt2_gelu")) {
    r.group("gpt2_gelu", [&] {
      Tensor x = dev_random(ctx, {N, 4 * C}, 11, dt), dy = dev_random(ctx, {N, 4 * C}, 12, dt);
      const double e = n * 4 * C;
      const std::string shape = "x" + dims({N, 4 * C});
      // Nominal FLOPs (tanh form): 10 per element forward, 20 backward.
      r.run({"gpt2_gelu_fwd", shape, 10 * e, a * 2 * e, false, [&] { ops::gelu_forward(ctx, x); }});
      r.run({"gpt2_gelu_bwd", shape, 20 * e, a * 3 * e, false,
             [&] { ops::gelu_backward(ctx, dy, x); }});
    });
  }

  if (r.wanted("gpt2_cross_entropy")) {
    r.group("gpt2_cross_entropy", [&] {
      // The logits of the padded vocabulary, as the model makes them (graph/transformer.h): V
      // classes counted in rows of Vp.
      const int64_t Vp = (V + 127) / 128 * 128;
      Tensor logits = dev_random(ctx, {N, Vp}, 13, dt);
      Tensor targets = dev_ids(ctx, {N}, V, DType::kI64, 14);
      ops::CrossEntropyOptions co;
      co.num_classes = V;
      const double e = n * V;
      const std::string shape = "logits" + dims({N, Vp}) + " (" + std::to_string(V) + " counted)";
      // Nominal FLOPs: 4 per logit (max, subtract, exp, sum) either way. The loss is f32 in
      // every precision; dlogits has the logits' dtype.
      r.run({"gpt2_cross_entropy_fwd", shape, 4 * e, a * e + 8 * n + kF, false,
             [&] { ops::cross_entropy_forward(ctx, logits, targets, co); }});
      r.run({"gpt2_cross_entropy_bwd", shape, 4 * e, 2 * a * e + 8 * n, false,
             [&] { ops::cross_entropy_backward(ctx, logits, targets, co, 1.0); }});
    });
  }

  if (r.wanted("gpt2_embedding")) {
    r.group("gpt2_embedding", [&] {
      Tensor ids = dev_ids(ctx, {B, T}, V, DType::kI32, 15);
      Tensor wte = dev_random(ctx, {V, C}, 16, dt), dwte = dev_zeros(ctx, {V, C}, dt);
      Tensor dy = dev_random(ctx, {B, T, C}, 17, dt);
      const double e = n * C;
      const std::string shape = "ids" + dims({B, T}) + " wte" + dims({V, C});
      r.run({"gpt2_embedding_fwd", shape, 0, 4 * n + 2 * a * e, false,
             [&] { ops::embedding_forward(ctx, ids, wte); }});
      r.run({"gpt2_embedding_bwd", shape, e, 4 * n + 3 * a * e, false,
             [&] { ops::embedding_backward(ctx, dy, ids, dwte); }});
    });
  }

  const int64_t P = 124439808;  // GPT-2 124M (V = 50257, tied embedding once)
  if (r.wanted("gpt2_adamw")) {
    r.group("gpt2_adamw", [&] {
      // f32 in every precision: under bf16/fp16 AdamW updates the f32 masters.
      Tensor host = bench_random({P}, 18);
      Tensor p = to_allocator(host, ctx.allocator()), g = to_allocator(host, ctx.allocator());
      Tensor m = to_allocator(host, ctx.allocator()), v = dev_zeros(ctx, {P});
      host = Tensor();
      ops::AdamWOptions ao;
      ao.lr = 1e-4;
      int64_t step = 0;
      // Nominal FLOPs: 12 per parameter. Bytes: read p, g, m, v; write p, m, v.
      r.run({"gpt2_adamw", "params" + dims({P}) + " f32", 12.0 * P, 7 * kF * P, false,
             [&] { ops::adamw_step(ctx, p, g, m, v, ao, ++step); }});
    });
  }

  // Mixed precision's bookkeeping per step over every parameter: the working weights from the
  // masters (ParamStore::load_working) and the gradients into the masters (flush_grads).
  if (pr.mixed()) {
    const std::string half = dtype_name(dt);
    const std::string cast_name = "gpt2_cast_f32_to_" + half;
    const std::string move_name = "gpt2_move_add_" + half + "_to_f32";
    if (r.wanted(cast_name)) {
      r.group(cast_name, [&] {
        Tensor master = dev_random(ctx, {P}, 30), working = dev_zeros(ctx, {P}, dt);
        // Nominal FLOPs: 1 per element (the rounding). Bytes: read f32, write 16 bits.
        r.run({cast_name, "params" + dims({P}) + " f32 -> " + half, 1.0 * P, (kF + a) * P, false,
               [&] { ops::cast_copy_(ctx, working, master); }});
      });
    }
    if (r.wanted(move_name)) {
      r.group(move_name, [&] {
        Tensor master = dev_zeros(ctx, {P}), working = dev_random(ctx, {P}, 31, dt);
        // Nominal FLOPs: 1 per element (the add). Bytes: the f32 gradient read and written, the
        // 16-bit one read and zeroed (after the first call it moves zeros: the same traffic).
        r.run({move_name, "grads" + dims({P}) + " " + half + " -> f32", 1.0 * P,
               (2 * kF + 2 * a) * P, false, [&] { ops::move_add_(ctx, master, working); }});
      });
    }
  }

  if (r.wanted("gpt2_softmax")) {
    r.group("gpt2_softmax", [&] {
      const Shape s{B, H, T, T};
      Tensor x = dev_random(ctx, s, 19, dt), dy = dev_random(ctx, s, 20, dt);
      const Tensor y = ops::softmax_forward(ctx, x);
      const double e = static_cast<double>(shape_numel(s));
      const std::string shape = "scores" + dims({B, H, T, T});
      // Nominal FLOPs: 4 per element forward (max, exp, sum, divide), 4 backward.
      r.run({"gpt2_softmax_fwd", shape, 4 * e, 2 * a * e, false,
             [&] { ops::softmax_forward(ctx, x); }});
      r.run({"gpt2_softmax_bwd", shape, 4 * e, 3 * a * e, false,
             [&] { ops::softmax_backward(ctx, dy, y); }});
    });
  }
}

void resnet50_cases(ExecContext& ctx, Runner& r, const Precision& pr) {
  const int64_t B = 64;
  const double a = pr.a;
  const DType dt = pr.dtype;
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
    r.group(cv.name, [&] {
      ops::Conv2dParams p;
      p.stride_h = p.stride_w = cv.stride;
      p.pad_h = p.pad_w = cv.pad;
      const int64_t oh = ops::conv2d_output_size(cv.h, cv.k, cv.stride, cv.pad, 1);
      // Activations in channels-last memory, as the convolutions pass them along in training
      // (ops/layout.h); the weight (OC, C, KH, KW), as stored.
      Tensor x = ops::to_channels_last(ctx, dev_random(ctx, {B, cv.c, cv.h, cv.h}, 21, dt));
      Tensor w = dev_random(ctx, {cv.oc, cv.c, cv.k, cv.k}, 22, dt);
      Tensor dy = ops::to_channels_last(ctx, dev_random(ctx, {B, cv.oc, oh, oh}, 23, dt));
      Tensor dw = dev_zeros(ctx, {cv.oc, cv.c, cv.k, cv.k}, dt);
      const double xs = static_cast<double>(B * cv.c * cv.h * cv.h);
      const double ws = static_cast<double>(cv.oc * cv.c * cv.k * cv.k);
      const double ys = static_cast<double>(B * cv.oc * oh * oh);
      const double flops = 2.0 * ys * cv.c * cv.k * cv.k;
      const std::string shape = "x" + dims({B, cv.c, cv.h, cv.h}) + " w" +
                                dims({cv.oc, cv.c, cv.k, cv.k}) + " s" + std::to_string(cv.stride);
      r.run({fwd, shape, flops, a * (xs + ws + ys), true,
             [&] { ops::conv2d_forward(ctx, x, w, Tensor(), p); }});
      r.run({bwd, shape, 2 * flops, a * (ys + xs + ws + xs + 2 * ws), true,
             [&] { ops::conv2d_backward(ctx, dy, x, w, p, dw, Tensor(), true); }});
    });
  }

  struct Norm {
    const char* name;
    int64_t c, h;
  };
  for (const Norm& nm : {Norm{"resnet50_bn_stem", 64, 112}, Norm{"resnet50_bn_layer1", 256, 56}}) {
    const std::string fwd = std::string(nm.name) + "_fwd", bwd = std::string(nm.name) + "_bwd";
    if (!r.wanted(fwd) && !r.wanted(bwd)) continue;
    r.group(nm.name, [&] {
      const Shape s{B, nm.c, nm.h, nm.h};
      Tensor x = ops::to_channels_last(ctx, dev_random(ctx, s, 24, dt));
      Tensor dy = ops::to_channels_last(ctx, dev_random(ctx, s, 25, dt));
      Tensor g = dev_ones(ctx, {nm.c}, dt), b = dev_zeros(ctx, {nm.c}, dt);
      const DType st = ops::batch_norm_stat_dtype(dt);  // f32 under bf16/fp16
      Tensor rm = dev_zeros(ctx, {nm.c}, st), rv = dev_ones(ctx, {nm.c}, st);
      Tensor dg = dev_zeros(ctx, {nm.c}, dt), db = dev_zeros(ctx, {nm.c}, dt);
      const ops::BatchNormTrainResult res =
          ops::batch_norm_forward_train(ctx, x, g, b, rm, rv, 0.1, 1e-5);
      const double e = static_cast<double>(shape_numel(s)), c = static_cast<double>(nm.c);
      const std::string shape = "x" + dims({B, nm.c, nm.h, nm.h});
      // Nominal FLOPs: 8 per element forward (statistics, normalize, affine), 12 backward. The
      // per-channel tensors are counted at x's dtype (the f32 statistics are a few bytes more).
      r.run({fwd, shape, 8 * e, a * (2 * e + 8 * c), false,
             [&] { ops::batch_norm_forward_train(ctx, x, g, b, rm, rv, 0.1, 1e-5); }});
      r.run({bwd, shape, 12 * e, a * (3 * e + 7 * c), false, [&] {
               ops::batch_norm_backward(ctx, dy, x, g, res.save_mean, res.save_invstd, dg, db);
             }});
    });
  }

  if (r.wanted("resnet50_maxpool")) {
    r.group("resnet50_maxpool", [&] {
      const Shape s{B, 64, 112, 112};
      ops::Pool2dParams p;
      p.kernel_h = p.kernel_w = 3;
      p.stride_h = p.stride_w = 2;
      p.pad_h = p.pad_w = 1;
      Tensor x = dev_random(ctx, s, 26, dt);
      const ops::MaxPool2dResult res = ops::max_pool2d_forward(ctx, x, p);
      Tensor dy = dev_random(ctx, res.y.shape(), 27, dt);
      const double in = static_cast<double>(shape_numel(s));
      const double out = static_cast<double>(res.y.numel());
      const std::string shape = "x" + dims({B, 64, 112, 112}) + " 3x3 s2";
      // Nominal FLOPs: 9 comparisons per output. The i64 indices are an output (8 bytes each).
      r.run({"resnet50_maxpool_fwd", shape, 9 * out, a * (in + out) + 8 * out, false,
             [&] { ops::max_pool2d_forward(ctx, x, p); }});
      r.run({"resnet50_maxpool_bwd", shape, out, a * (out + in) + 8 * out, false,
             [&] { ops::max_pool2d_backward(ctx, dy, res.indices, s); }});
    });
  }

  if (r.wanted("resnet50_relu")) {
    r.group("resnet50_relu", [&] {
      const Shape s{B, 256, 56, 56};
      Tensor x = dev_random(ctx, s, 28, dt), dy = dev_random(ctx, s, 29, dt);
      const Tensor y = ops::relu_forward(ctx, x);
      const double e = static_cast<double>(shape_numel(s));
      const std::string shape = "x" + dims({B, 256, 56, 56});
      r.run({"resnet50_relu_fwd", shape, e, 2 * a * e, false, [&] { ops::relu_forward(ctx, x); }});
      r.run({"resnet50_relu_bwd", shape, e, 3 * a * e, false,
             [&] { ops::relu_backward(ctx, dy, y); }});
    });
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
  Precision pr;
  pr.dtype = tensor_dtype(precision);
  pr.a = static_cast<double>(dtype_size(pr.dtype));
  std::printf("CUDA op benchmark on %s (%s), %s\n", device.str().c_str(), name.c_str(),
              precision.c_str());
  if (pr.mixed()) {
    std::printf(
        "tensors: %s (activations, weights, gradients, statistics); AdamW on f32 master weights, "
        "gradients and state; cross-entropy loss and attention log-sum-exp f32\n",
        dtype_name(pr.dtype));
  }
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
  gpt2_cases(ctx, runner, pr);
  resnet50_cases(ctx, runner, pr);
  std::printf(
      "ms = median time per call (CUDA events); roof = bound / measured, bound = max(FLOPs / peak, "
      "bytes / bandwidth); bytes = inputs read once + outputs written once (%s tensors %g bytes "
      "per element)\n",
      dtype_name(pr.dtype), pr.a);
  return 0;
}

#endif  // STRATA_WITH_CUDA

}  // namespace strata::tools
