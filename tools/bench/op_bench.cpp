// Each case is timed by repeating it until min_seconds have passed (after one warm-up call) and
// taking the median call time. FLOPs count a multiply-add as 2. Backward FLOPs are those of the
// two products it computes (input and weight gradients): twice the forward's.
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

double median_seconds(const std::function<void()>& fn, double min_seconds) {
  fn();  // warm-up: first-touch of buffers, BLAS thread start
  std::vector<double> times;
  const auto start = Clock::now();
  do {
    const auto t0 = Clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  } while (std::chrono::duration<double>(Clock::now() - start).count() < min_seconds ||
           times.size() < 3);
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

// Time of one sgemm C(m, n) = A(m, k) B(k, n) with fresh operands.
double sgemm_seconds(ExecContext& ctx, int64_t m, int64_t n, int64_t k, double min_seconds) {
  Tensor a = bench_random({m, k}, 1), b = bench_random({k, n}, 2);
  Tensor c = Tensor::empty({m, n});
  return median_seconds(
      [&] {
        ops::blas::gemm(ctx, false, false, m, n, k, 1.0f, a.data<float>(), k, b.data<float>(), n,
                        0.0f, c.data<float>(), n);
      },
      min_seconds);
}

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
  std::printf("%-22s %-40s %9s %9s %10s %7s\n", "case", "shape", "ms", "GFLOP/s", "sgemm GF/s",
              "ratio");
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
  const ConvCase convs[] = {
      {"conv_cnn1", 64, 1, 28, 28, 32, 3, 1, 1},   // the default job's first conv
      {"conv_cnn2", 64, 32, 14, 14, 64, 3, 1, 1},  // ... and its second
      {"conv_resnet3x3", 8, 64, 56, 56, 64, 3, 1, 1},
      {"conv_resnet1x1", 8, 256, 56, 56, 64, 1, 1, 0},
      {"conv_stride2", 8, 128, 28, 28, 256, 3, 2, 1},
  };
  for (const ConvCase& cc : convs) {
    const bool fwd = wanted(std::string(cc.name) + "_fwd");
    const bool bwd = wanted(std::string(cc.name) + "_bwd");
    if (!fwd && !bwd) continue;
    ops::Conv2dParams p;
    p.stride_h = p.stride_w = cc.stride;
    p.pad_h = p.pad_w = cc.pad;
    Tensor x = bench_random({cc.b, cc.c, cc.h, cc.w}, 3);
    Tensor w = bench_random({cc.oc, cc.c, cc.k, cc.k}, 4);
    Tensor bias = bench_random({cc.oc}, 5);
    const int64_t oh = ops::conv2d_output_size(cc.h, cc.k, cc.stride, cc.pad, 1);
    const int64_t ow = ops::conv2d_output_size(cc.w, cc.k, cc.stride, cc.pad, 1);
    const int64_t m = cc.oc, n = cc.b * oh * ow, k = cc.c * cc.k * cc.k;
    const double flops = 2.0 * m * n * k;
    const double sgemm = flops / sgemm_seconds(ctx, m, n, k, options.min_seconds) / 1e9;
    char shape[96];
    std::snprintf(shape, sizeof(shape), "x(%lld,%lld,%lld,%lld) w(%lld,%lld,%lld,%lld) s%lld",
                  (long long)cc.b, (long long)cc.c, (long long)cc.h, (long long)cc.w,
                  (long long)cc.oc, (long long)cc.c, (long long)cc.k, (long long)cc.k,
                  (long long)cc.stride);
    if (fwd) {
      const double t =
          median_seconds([&] { ops::conv2d_forward(ctx, x, w, bias, p); }, options.min_seconds);
      emit({std::string(cc.name) + "_fwd", shape, flops, t, sgemm});
    }
    if (bwd) {
      Tensor y = ops::conv2d_forward(ctx, x, w, bias, p);
      Tensor dy = bench_random(y.shape(), 6);
      Tensor dw = Tensor::zeros(w.shape()), db = Tensor::zeros(bias.shape());
      const double t = median_seconds([&] { ops::conv2d_backward(ctx, dy, x, w, p, dw, db, true); },
                                      options.min_seconds);
      emit({std::string(cc.name) + "_bwd", shape, 2 * flops, t, sgemm});
    }
  }

  struct MatmulCase {
    const char* name;
    int64_t n, k, m;  // x (n, k) @ w (m, k)^T
  };
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
    const double sgemm = flops / sgemm_seconds(ctx, mc.n, mc.m, mc.k, options.min_seconds) / 1e9;
    char shape[96];
    std::snprintf(shape, sizeof(shape), "x(%lld,%lld) w(%lld,%lld)", (long long)mc.n,
                  (long long)mc.k, (long long)mc.m, (long long)mc.k);
    if (fwd) {
      const double t =
          median_seconds([&] { ops::linear_forward(ctx, x, w, b); }, options.min_seconds);
      emit({std::string(mc.name) + "_fwd", shape, flops, t, sgemm});
    }
    if (bwd) {
      Tensor dy = bench_random({mc.n, mc.m}, 10);
      Tensor dw = Tensor::zeros(w.shape()), db = Tensor::zeros(b.shape());
      const double t = median_seconds([&] { ops::linear_backward(ctx, dy, x, w, dw, db, true); },
                                      options.min_seconds);
      emit({std::string(mc.name) + "_bwd", shape, 2 * flops, t, sgemm});
    }
  }
  std::printf(
      "ratio = op GFLOP/s / sgemm GFLOP/s on the op's matrix shape (M=OC, N=B*OH*OW, "
      "K=C*KH*KW for conv2d)\n");
  return 0;
}

}  // namespace strata::tools
