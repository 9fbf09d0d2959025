// Each linear case is timed against an sgemm of its matrix shape, each convolution (the path
// conv2d picks by shape: Winograd or im2col) against the im2col path, the two calls alternating
// until 2 x min_seconds have passed (after one warm-up call each); the medians are compared. FLOPs
// count a multiply-add as 2 (a convolution's are those of the direct method, whatever the
// algorithm). Backward FLOPs are those of the two products it computes (input and weight
// gradients): twice the forward's.
#include "tools/bench/op_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "engine/exec_context.h"
#include "io/metrics.h"
#include "ops/blas.h"
#include "ops/conv2d.h"
#include "ops/matmul.h"
#include "tools/bench/bench_random.h"

namespace strata::tools {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Median call times of `op` and `reference`, measured alternately (op, reference, op, ...) so
// that both see the same machine: on a shared machine, measuring one after the other lets a
// burst of load from elsewhere fall on only one of them.
std::pair<double, double> paired_median_seconds(const std::function<void()>& op,
                                                const std::function<void()>& reference,
                                                double min_seconds) {
  op();  // warm-up: first touch of buffers, thread start
  reference();
  std::vector<double> op_times, ref_times;
  const auto start = Clock::now();
  do {
    auto t0 = Clock::now();
    op();
    op_times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    t0 = Clock::now();
    reference();
    ref_times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  } while (std::chrono::duration<double>(Clock::now() - start).count() < 2 * min_seconds ||
           op_times.size() < 5);
  return {median(op_times), median(ref_times)};
}

// sgemm C(m, n) = A(m, k) B(k, n) on fresh operands, as a callable.
struct Sgemm {
  Sgemm(int64_t m, int64_t n, int64_t k)
      : m(m),
        n(n),
        k(k),
        a(bench_random({m, k}, 1)),
        b(bench_random({k, n}, 2)),
        c(Tensor::empty({m, n})) {}
  void operator()(ExecContext& ctx) const {
    ops::blas::gemm(ctx, false, false, m, n, k, 1.0f, a.data<float>(), k, b.data<float>(), n, 0.0f,
                    c.data<float>(), n);
  }
  int64_t m, n, k;
  Tensor a, b, c;
};

struct Row {
  std::string name;
  std::string shape;
  double flops;
  double seconds;
  double sgemm_gflops;
};

void print_row(const Row& r) {
  const double gflops = r.flops / r.seconds / 1e9;
  std::printf("%-22s %-40s %9.3f %9.1f %10.1f %7.2f\n", r.name.c_str(), r.shape.c_str(),
              r.seconds * 1e3, gflops, r.sgemm_gflops, gflops / r.sgemm_gflops);
  std::fflush(stdout);
}

}  // namespace

int run_op_bench(const OpBenchOptions& options) {
  ExecContext ctx(Device::cpu(), nullptr, options.threads);
  io::JsonlWriter json(options.json);
  std::printf("CPU op benchmark (%s)\n", ops::blas::library_info());
  auto emit = [&](const Row& r) {
    print_row(r);
    json.write({{"case", r.name},
                {"shape", r.shape},
                {"ms", r.seconds * 1e3},
                {"gflops", r.flops / r.seconds / 1e9},
                {"sgemm_gflops", r.sgemm_gflops},
                {"ratio", r.flops / r.seconds / 1e9 / r.sgemm_gflops}});
  };
  auto wanted = [&](const std::string& name) {
    return options.filter.empty() || name.find(options.filter) != std::string::npos;
  };

  struct ConvCase {
    const char* name;
    int64_t b, c, h, w, oc, k, stride, pad;
  };
  // The default job's convolutions, the 56 px ResNet case, and those of `strata bench`'s
  // ResNet-18 (small stem) and VGG-11-BN-small at 32 px, batch 32.
  const ConvCase convs[] = {
      {"conv_cnn1", 64, 1, 28, 28, 32, 3, 1, 1},   // the default job's first conv
      {"conv_cnn2", 64, 32, 14, 14, 64, 3, 1, 1},  // ... and its second
      {"conv_resnet3x3", 8, 64, 56, 56, 64, 3, 1, 1},
      {"conv_resnet1x1", 8, 256, 56, 56, 64, 1, 1, 0},
      {"conv_stride2", 8, 128, 28, 28, 256, 3, 2, 1},
      {"conv_r18_stem", 32, 3, 32, 32, 64, 3, 1, 1},
      {"conv_r18_l1", 32, 64, 32, 32, 64, 3, 1, 1},
      {"conv_r18_l2", 32, 128, 16, 16, 128, 3, 1, 1},
      {"conv_r18_l2_s2", 32, 64, 32, 32, 128, 3, 2, 1},
      {"conv_r18_l3", 32, 256, 8, 8, 256, 3, 1, 1},
      {"conv_r18_l4", 32, 512, 4, 4, 512, 3, 1, 1},
      {"conv_vgg_64_128", 32, 64, 16, 16, 128, 3, 1, 1},
      {"conv_vgg_128_256", 32, 128, 8, 8, 256, 3, 1, 1},
      {"conv_vgg_256_512", 32, 256, 4, 4, 512, 3, 1, 1},
      {"conv_vgg_512_2px", 32, 512, 2, 2, 512, 3, 1, 1},
  };
  bool conv_header = false;
  for (const ConvCase& cc : convs) {
    const bool fwd = wanted(std::string(cc.name) + "_fwd");
    const bool bwd = wanted(std::string(cc.name) + "_bwd");
    if (!fwd && !bwd) continue;
    if (!conv_header) {
      // Convolutions: the path conv2d takes (by shape) beside the im2col path, alternating.
      std::printf("%-22s %-40s %9s %9s %9s %8s\n", "conv case", "shape", "ms", "im2col ms",
                  "GFLOP/s", "speedup");
      conv_header = true;
    }
    ops::Conv2dParams p;
    p.stride_h = p.stride_w = cc.stride;
    p.pad_h = p.pad_w = cc.pad;
    Tensor x = bench_random({cc.b, cc.c, cc.h, cc.w}, 3);
    Tensor w = bench_random({cc.oc, cc.c, cc.k, cc.k}, 4);
    Tensor bias = bench_random({cc.oc}, 5);
    const int64_t oh = ops::conv2d_output_size(cc.h, cc.k, cc.stride, cc.pad, 1);
    const int64_t ow = ops::conv2d_output_size(cc.w, cc.k, cc.stride, cc.pad, 1);
    const double flops = 2.0 * cc.oc * cc.b * oh * ow * cc.c * cc.k * cc.k;
    char shape[96];
    std::snprintf(shape, sizeof(shape), "x(%lld,%lld,%lld,%lld) w(%lld,%lld,%lld,%lld) s%lld",
                  (long long)cc.b, (long long)cc.c, (long long)cc.h, (long long)cc.w,
                  (long long)cc.oc, (long long)cc.c, (long long)cc.k, (long long)cc.k,
                  (long long)cc.stride);
    auto emit_conv = [&](const std::string& name, double f, double t, double t_im2col) {
      std::printf("%-22s %-40s %9.3f %9.3f %9.1f %8.2f\n", name.c_str(), shape, t * 1e3,
                  t_im2col * 1e3, f / t / 1e9, t_im2col / t);
      std::fflush(stdout);
      json.write({{"case", name},
                  {"shape", std::string(shape)},
                  {"ms", t * 1e3},
                  {"im2col_ms", t_im2col * 1e3},
                  {"gflops", f / t / 1e9}});
    };
    using ops::cpu::Conv2dAlgo;
    if (fwd) {
      const auto [t, ti] = paired_median_seconds(
          [&] { ops::cpu::conv2d_forward_with(ctx, x, w, bias, p, Conv2dAlgo::kAuto); },
          [&] { ops::cpu::conv2d_forward_with(ctx, x, w, bias, p, Conv2dAlgo::kIm2col); },
          options.min_seconds);
      emit_conv(std::string(cc.name) + "_fwd", flops, t, ti);
    }
    if (bwd) {
      Tensor y = ops::conv2d_forward(ctx, x, w, bias, p);
      Tensor dy = bench_random(y.shape(), 6);
      Tensor dw = Tensor::zeros(w.shape()), db = Tensor::zeros(bias.shape());
      auto backward = [&](Conv2dAlgo algo) {
        ops::cpu::conv2d_backward_with(ctx, dy, x, w, p, dw, db, true, algo);
      };
      const auto [t, ti] =
          paired_median_seconds([&] { backward(Conv2dAlgo::kAuto); },
                                [&] { backward(Conv2dAlgo::kIm2col); }, options.min_seconds);
      emit_conv(std::string(cc.name) + "_bwd", 2 * flops, t, ti);
    }
  }

  struct MatmulCase {
    const char* name;
    int64_t n, k, m;  // x (n, k) @ w (m, k)^T
  };
  std::printf("%-22s %-40s %9s %9s %10s %7s\n", "case", "shape", "ms", "GFLOP/s", "sgemm GF/s",
              "ratio");
  const MatmulCase linears[] = {
      {"linear_fc1", 64, 3136, 128},  // the default job's first linear layer
      {"linear_gpt2_mlp", 1024, 768, 3072},
      {"linear_square", 1024, 1024, 1024},
  };
  for (const MatmulCase& mc : linears) {
    const bool fwd = wanted(std::string(mc.name) + "_fwd");
    const bool bwd = wanted(std::string(mc.name) + "_bwd");
    if (!fwd && !bwd) continue;
    Tensor x = bench_random({mc.n, mc.k}, 7), w = bench_random({mc.m, mc.k}, 8);
    Tensor b = bench_random({mc.m}, 9);
    const double flops = 2.0 * mc.n * mc.k * mc.m;
    const Sgemm sgemm(mc.n, mc.m, mc.k);
    char shape[96];
    std::snprintf(shape, sizeof(shape), "x(%lld,%lld) w(%lld,%lld)", (long long)mc.n,
                  (long long)mc.k, (long long)mc.m, (long long)mc.k);
    if (fwd) {
      const auto [t, ts] = paired_median_seconds([&] { ops::linear_forward(ctx, x, w, b); },
                                                 [&] { sgemm(ctx); }, options.min_seconds);
      emit({std::string(mc.name) + "_fwd", shape, flops, t, flops / ts / 1e9});
    }
    if (bwd) {
      Tensor dy = bench_random({mc.n, mc.m}, 10);
      Tensor dw = Tensor::zeros(w.shape()), db = Tensor::zeros(b.shape());
      const auto [t, ts] =
          paired_median_seconds([&] { ops::linear_backward(ctx, dy, x, w, dw, db, true); },
                                [&] { sgemm(ctx); }, options.min_seconds);
      emit({std::string(mc.name) + "_bwd", shape, 2 * flops, t, flops / ts / 1e9});
    }
  }
  std::printf(
      "ratio = op GFLOP/s / sgemm GFLOP/s on the op's matrix shape; speedup = im2col ms / ms\n");
  return 0;
}

}  // namespace strata::tools
