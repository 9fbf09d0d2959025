// CUDA-vs-CPU parity of the CNN ops: conv2d (cuDNN), max/average/adaptive pooling and batch
// normalization. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/exec_context.h"
#include "engine/tensor.h"
#include "ops/batch_norm.h"
#include "ops/conv2d.h"
#include "ops/pooling.h"
#include "testing/cuda_parity.h"

namespace strata {
namespace {

using testing::identical;
using testing::parity;
using testing::parity_bound;
using testing::Precision;
using testing::random_f32;
using testing::random_ids;
using testing::to_device;
using testing::to_host;

// The same values rounded to a 16-bit dtype (kept as f32 for the CPU reference).
Tensor rounded(const Tensor& t, DType dtype) { return t.to(dtype).to(DType::kF32); }

// ---- conv2d ---------------------------------------------------------------------------------

struct ConvCase {
  int64_t b, c, h, w, oc, kh, kw;
  ops::Conv2dParams p;
  bool bias;
  std::string name;
};

ops::Conv2dParams conv_params(int64_t stride, int64_t pad, int64_t dilation = 1,
                              int64_t groups = 1) {
  ops::Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.dilation_h = p.dilation_w = dilation;
  p.groups = groups;
  return p;
}

std::vector<ConvCase> conv_cases() {
  std::vector<ConvCase> cases;
  cases.push_back({2, 3, 7, 9, 5, 3, 3, conv_params(1, 1), true, "3x3 same"});
  cases.push_back({1, 1, 1, 1, 1, 1, 1, conv_params(1, 0), true, "1x1 on one pixel"});
  cases.push_back({3, 4, 11, 10, 6, 3, 3, conv_params(2, 1), false, "stride 2"});
  cases.push_back({2, 4, 13, 12, 4, 3, 3, conv_params(1, 2, 2), true, "dilation 2"});
  cases.push_back({2, 6, 9, 9, 4, 3, 3, conv_params(1, 1, 1, 2), true, "groups 2"});
  cases.push_back({2, 8, 10, 7, 8, 3, 3, conv_params(1, 1, 1, 8), true, "depthwise"});
  cases.push_back({4, 16, 14, 14, 32, 1, 1, conv_params(1, 0), true, "pointwise"});
  cases.push_back({2, 3, 32, 33, 7, 5, 3, conv_params(1, 2), true, "5x3 kernel"});
  cases.push_back({8, 32, 28, 28, 64, 3, 3, conv_params(1, 1), true, "larger"});
  {
    ConvCase c{2, 3, 15, 17, 4, 3, 5, conv_params(1, 0), true, "asymmetric"};
    c.p.stride_h = 2;
    c.p.stride_w = 3;
    c.p.pad_h = 1;
    c.p.pad_w = 2;
    cases.push_back(c);
  }
  return cases;
}

TEST(CudaConv2d, ForwardMatchesCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 100;
  for (const ConvCase& k : conv_cases()) {
    SCOPED_TRACE(k.name);
    const Tensor x = random_f32({k.b, k.c, k.h, k.w}, ++seed);
    const Tensor w = random_f32({k.oc, k.c / k.p.groups, k.kh, k.kw}, ++seed);
    const Tensor bias = k.bias ? random_f32({k.oc}, ++seed) : Tensor();
    const Tensor ref = ops::conv2d_forward(cpu, x, w, bias, k.p);
    const Tensor got = ops::conv2d_forward(gpu, to_device(x, gpu), to_device(w, gpu),
                                           k.bias ? to_device(bias, gpu) : Tensor(), k.p);
    EXPECT_TRUE(parity(gpu, got, ref, parity_bound(Precision::kF32), "y"));
  }
}

TEST(CudaConv2d, BackwardMatchesCpuAndAccumulates) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 200;
  for (const ConvCase& k : conv_cases()) {
    for (const bool need_dx : {true, false}) {
      SCOPED_TRACE(k.name + (need_dx ? " with dx" : " without dx"));
      const Tensor x = random_f32({k.b, k.c, k.h, k.w}, ++seed);
      const Tensor w = random_f32({k.oc, k.c / k.p.groups, k.kh, k.kw}, ++seed);
      const int64_t oh =
          ops::conv2d_output_size(k.h, k.kh, k.p.stride_h, k.p.pad_h, k.p.dilation_h);
      const int64_t ow =
          ops::conv2d_output_size(k.w, k.kw, k.p.stride_w, k.p.pad_w, k.p.dilation_w);
      const Tensor dy = random_f32({k.b, k.oc, oh, ow}, ++seed);
      // Pre-filled gradients: the op must add to them.
      const Tensor dw_cpu = random_f32(w.shape(), ++seed);
      const Tensor db_cpu = k.bias ? random_f32({k.oc}, ++seed) : Tensor();
      const Tensor dw_gpu = to_device(dw_cpu, gpu);
      const Tensor db_gpu = k.bias ? to_device(db_cpu, gpu) : Tensor();
      const Tensor dx_ref = ops::conv2d_backward(cpu, dy, x, w, k.p, dw_cpu, db_cpu, need_dx);
      const Tensor dx = ops::conv2d_backward(gpu, to_device(dy, gpu), to_device(x, gpu),
                                             to_device(w, gpu), k.p, dw_gpu, db_gpu, need_dx);
      EXPECT_EQ(dx.defined(), need_dx);
      if (need_dx) {
        EXPECT_TRUE(parity(gpu, dx, dx_ref, parity_bound(Precision::kF32), "dx"));
      }
      EXPECT_TRUE(parity(gpu, dw_gpu, dw_cpu, parity_bound(Precision::kF32), "dweight"));
      if (k.bias) {
        EXPECT_TRUE(parity(gpu, db_gpu, db_cpu, parity_bound(Precision::kF32), "dbias"));
      }
    }
  }
}

TEST(CudaConv2d, OnlyBiasGradient) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const ops::Conv2dParams p = conv_params(1, 1);
  const Tensor x = random_f32({3, 4, 9, 8}, 1);
  const Tensor w = random_f32({5, 4, 3, 3}, 2);
  const Tensor dy = random_f32({3, 5, 9, 8}, 3);
  const Tensor db_cpu = random_f32({5}, 4);
  const Tensor db_gpu = to_device(db_cpu, gpu);
  ops::conv2d_backward(cpu, dy, x, w, p, Tensor(), db_cpu, false);
  const Tensor dx = ops::conv2d_backward(gpu, to_device(dy, gpu), to_device(x, gpu),
                                         to_device(w, gpu), p, Tensor(), db_gpu, false);
  EXPECT_FALSE(dx.defined());
  EXPECT_TRUE(parity(gpu, db_gpu, db_cpu, parity_bound(Precision::kF32), "dbias"));
}

TEST(CudaConv2d, HalfPrecisionMatchesCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 300;
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const Precision prec = dtype == DType::kBF16 ? Precision::kBF16 : Precision::kF16;
    for (const ConvCase& k : conv_cases()) {
      SCOPED_TRACE(k.name + " " + dtype_name(dtype));
      const Tensor x = rounded(random_f32({k.b, k.c, k.h, k.w}, ++seed), dtype);
      const Tensor w = rounded(random_f32({k.oc, k.c / k.p.groups, k.kh, k.kw}, ++seed), dtype);
      const Tensor bias = rounded(random_f32({k.oc}, ++seed), dtype);
      const Tensor y_ref = ops::conv2d_forward(cpu, x, w, bias, k.p);
      const Tensor y =
          ops::conv2d_forward(gpu, to_device(x.to(dtype), gpu), to_device(w.to(dtype), gpu),
                              to_device(bias.to(dtype), gpu), k.p);
      EXPECT_EQ(y.dtype(), dtype);
      EXPECT_TRUE(parity(gpu, y, y_ref, parity_bound(prec), "y"));

      const Tensor dy = rounded(random_f32(y_ref.shape(), ++seed), dtype);
      const Tensor dw_ref = Tensor::zeros(w.shape());
      const Tensor db_ref = Tensor::zeros({k.oc});
      const Tensor dx_ref = ops::conv2d_backward(cpu, dy, x, w, k.p, dw_ref, db_ref, true);
      const Tensor dw = to_device(Tensor::zeros(w.shape()).to(dtype), gpu);
      const Tensor db = to_device(Tensor::zeros({k.oc}).to(dtype), gpu);
      const Tensor dx =
          ops::conv2d_backward(gpu, to_device(dy.to(dtype), gpu), to_device(x.to(dtype), gpu),
                               to_device(w.to(dtype), gpu), k.p, dw, db, true);
      EXPECT_TRUE(parity(gpu, dx, dx_ref, parity_bound(prec), "dx"));
      EXPECT_TRUE(parity(gpu, dw, dw_ref, parity_bound(prec), "dweight"));
      EXPECT_TRUE(parity(gpu, db, db_ref, parity_bound(prec), "dbias"));
    }
  }
}

TEST(CudaConv2d, EmptyBatch) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const Tensor x = to_device(Tensor::zeros({0, 3, 8, 8}), gpu);
  const Tensor w = to_device(random_f32({4, 3, 3, 3}, 1), gpu);
  const Tensor y = ops::conv2d_forward(gpu, x, w, Tensor(), conv_params(1, 1));
  EXPECT_EQ(y.shape(), (Shape{0, 4, 8, 8}));
}

TEST(CudaConv2d, RejectsBadInputs) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const ops::Conv2dParams p = conv_params(1, 1);
  const Tensor x = to_device(random_f32({2, 3, 8, 8}, 1), gpu);
  const Tensor w = to_device(random_f32({4, 3, 3, 3}, 2), gpu);
  // f64 is not a CUDA dtype.
  EXPECT_THROW(
      ops::conv2d_forward(gpu, to_device(random_f32({2, 3, 8, 8}, 1).to(DType::kF64), gpu),
                          to_device(random_f32({4, 3, 3, 3}, 2).to(DType::kF64), gpu), Tensor(), p),
      Error);
  // Mixed dtypes.
  EXPECT_THROW(
      ops::conv2d_forward(gpu, x, to_device(random_f32({4, 3, 3, 3}, 2).to(DType::kBF16), gpu),
                          Tensor(), p),
      Error);
  // Weight channels do not match x.
  EXPECT_THROW(
      ops::conv2d_forward(gpu, x, to_device(random_f32({4, 2, 3, 3}, 3), gpu), Tensor(), p), Error);
  // Bias of the wrong length.
  EXPECT_THROW(ops::conv2d_forward(gpu, x, w, to_device(random_f32({3}, 4), gpu), p), Error);
  // x on the CPU.
  EXPECT_THROW(ops::conv2d_forward(gpu, random_f32({2, 3, 8, 8}, 1), w, Tensor(), p), Error);
  // dy of the wrong shape.
  EXPECT_THROW(ops::conv2d_backward(gpu, to_device(random_f32({2, 4, 7, 8}, 5), gpu), x, w, p,
                                    Tensor(), Tensor(), true),
               Error);
}

// ---- pooling --------------------------------------------------------------------------------

ops::Pool2dParams pool_params(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                              int64_t pw, bool ceil_mode = false, bool count_include_pad = true) {
  ops::Pool2dParams p;
  p.kernel_h = kh;
  p.kernel_w = kw;
  p.stride_h = sh;
  p.stride_w = sw;
  p.pad_h = ph;
  p.pad_w = pw;
  p.ceil_mode = ceil_mode;
  p.count_include_pad = count_include_pad;
  return p;
}

struct PoolCase {
  Shape x;
  ops::Pool2dParams p;
  std::string name;
};

std::vector<PoolCase> pool_cases() {
  return {
      {{2, 3, 8, 8}, pool_params(2, 2, 2, 2, 0, 0), "2x2 stride 2"},
      {{1, 1, 1, 1}, pool_params(1, 1, 1, 1, 0, 0), "one pixel"},
      {{2, 3, 7, 9}, pool_params(2, 2, 2, 2, 0, 0), "odd input, floor"},
      {{2, 3, 7, 9}, pool_params(2, 2, 2, 2, 0, 0, true), "odd input, ceil_mode"},
      {{2, 5, 11, 10}, pool_params(3, 3, 2, 2, 1, 1), "3x3 stride 2 pad 1"},
      {{2, 5, 11, 10}, pool_params(3, 3, 2, 2, 1, 1, true), "3x3 stride 2 pad 1 ceil"},
      {{2, 5, 11, 10}, pool_params(3, 3, 2, 2, 1, 1, true, false), "exclude pad, ceil"},
      {{3, 2, 13, 6}, pool_params(3, 2, 1, 1, 1, 1, false, false), "overlapping, exclude pad"},
      {{2, 4, 9, 12}, pool_params(4, 3, 3, 2, 2, 1, true), "asymmetric ceil"},
      {{4, 64, 56, 56}, pool_params(3, 3, 2, 2, 1, 1), "resnet stem"},
  };
}

TEST(CudaPooling, MaxForwardBackwardMatchCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 400;
  for (const PoolCase& k : pool_cases()) {
    for (const bool ties : {false, true}) {
      SCOPED_TRACE(k.name + (ties ? " with ties" : ""));
      // Few distinct values make ties: the first maximum must win on both devices.
      const Tensor x = ties ? random_ids(k.x, 3, ++seed).to(DType::kF32) : random_f32(k.x, ++seed);
      const ops::MaxPool2dResult ref = ops::max_pool2d_forward(cpu, x, k.p);
      const ops::MaxPool2dResult got = ops::max_pool2d_forward(gpu, to_device(x, gpu), k.p);
      EXPECT_TRUE(parity(gpu, got.y, ref.y, parity_bound(Precision::kF32), "y"));
      EXPECT_TRUE(identical(gpu, got.indices, ref.indices, "indices"));

      const Tensor dy = random_f32(ref.y.shape(), ++seed);
      const Tensor dx_ref = ops::max_pool2d_backward(cpu, dy, ref.indices, k.x);
      const Tensor dx =
          ops::max_pool2d_backward(gpu, to_device(dy, gpu), to_device(ref.indices, gpu), k.x);
      EXPECT_TRUE(parity(gpu, dx, dx_ref, parity_bound(Precision::kF32), "dx"));
    }
  }
}

TEST(CudaPooling, AvgForwardBackwardMatchCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 500;
  for (const PoolCase& k : pool_cases()) {
    for (const bool include_pad : {true, false}) {
      SCOPED_TRACE(k.name + (include_pad ? " count_include_pad" : " exclude pad"));
      ops::Pool2dParams p = k.p;
      p.count_include_pad = include_pad;
      const Tensor x = random_f32(k.x, ++seed);
      const Tensor y_ref = ops::avg_pool2d_forward(cpu, x, p);
      const Tensor y = ops::avg_pool2d_forward(gpu, to_device(x, gpu), p);
      EXPECT_TRUE(parity(gpu, y, y_ref, parity_bound(Precision::kF32), "y"));
      const Tensor dy = random_f32(y_ref.shape(), ++seed);
      const Tensor dx_ref = ops::avg_pool2d_backward(cpu, dy, k.x, p);
      const Tensor dx = ops::avg_pool2d_backward(gpu, to_device(dy, gpu), k.x, p);
      EXPECT_TRUE(parity(gpu, dx, dx_ref, parity_bound(Precision::kF32), "dx"));
    }
  }
}

TEST(CudaPooling, AdaptiveForwardBackwardMatchCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  struct Case {
    Shape x;
    int64_t oh, ow;
  };
  const std::vector<Case> cases = {
      {{2, 3, 7, 9}, 3, 4},    {{1, 1, 1, 1}, 1, 1},     {{2, 3, 5, 4}, 7, 6},
      {{4, 64, 56, 56}, 1, 1}, {{3, 5, 13, 11}, 13, 11}, {{2, 8, 33, 40}, 5, 7},
      {{2, 16, 7, 7}, 1, 1},   {{1, 2, 100, 3}, 1, 2},
  };
  uint64_t seed = 600;
  for (const Case& k : cases) {
    SCOPED_TRACE(shape_str(k.x) + " -> " + std::to_string(k.oh) + "x" + std::to_string(k.ow));
    const Tensor x = random_f32(k.x, ++seed);
    const Tensor y_ref = ops::adaptive_avg_pool2d_forward(cpu, x, k.oh, k.ow);
    const Tensor y = ops::adaptive_avg_pool2d_forward(gpu, to_device(x, gpu), k.oh, k.ow);
    EXPECT_TRUE(parity(gpu, y, y_ref, parity_bound(Precision::kF32), "y"));
    const Tensor dy = random_f32(y_ref.shape(), ++seed);
    const Tensor dx_ref = ops::adaptive_avg_pool2d_backward(cpu, dy, k.x);
    const Tensor dx = ops::adaptive_avg_pool2d_backward(gpu, to_device(dy, gpu), k.x);
    EXPECT_TRUE(parity(gpu, dx, dx_ref, parity_bound(Precision::kF32), "dx"));
  }
}

TEST(CudaPooling, HalfPrecisionMatchesCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 700;
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const Precision prec = dtype == DType::kBF16 ? Precision::kBF16 : Precision::kF16;
    for (const PoolCase& k : pool_cases()) {
      SCOPED_TRACE(k.name + " " + dtype_name(dtype));
      const Tensor x = rounded(random_f32(k.x, ++seed), dtype);
      const Tensor xd = to_device(x.to(dtype), gpu);
      const ops::MaxPool2dResult mref = ops::max_pool2d_forward(cpu, x, k.p);
      const ops::MaxPool2dResult m = ops::max_pool2d_forward(gpu, xd, k.p);
      EXPECT_EQ(m.y.dtype(), dtype);
      EXPECT_TRUE(parity(gpu, m.y, mref.y, parity_bound(prec), "max y"));
      EXPECT_TRUE(identical(gpu, m.indices, mref.indices, "max indices"));
      const Tensor dy = rounded(random_f32(mref.y.shape(), ++seed), dtype);
      const Tensor dyd = to_device(dy.to(dtype), gpu);
      EXPECT_TRUE(parity(gpu, ops::max_pool2d_backward(gpu, dyd, m.indices, k.x),
                         ops::max_pool2d_backward(cpu, dy, mref.indices, k.x), parity_bound(prec),
                         "max dx"));
      EXPECT_TRUE(parity(gpu, ops::avg_pool2d_forward(gpu, xd, k.p),
                         ops::avg_pool2d_forward(cpu, x, k.p), parity_bound(prec), "avg y"));
      EXPECT_TRUE(parity(gpu, ops::avg_pool2d_backward(gpu, dyd, k.x, k.p),
                         ops::avg_pool2d_backward(cpu, dy, k.x, k.p), parity_bound(prec),
                         "avg dx"));
      EXPECT_TRUE(parity(gpu, ops::adaptive_avg_pool2d_forward(gpu, xd, 3, 2),
                         ops::adaptive_avg_pool2d_forward(cpu, x, 3, 2), parity_bound(prec),
                         "adaptive y"));
    }
  }
}

TEST(CudaPooling, RejectsBadInputs) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const ops::Pool2dParams p = pool_params(2, 2, 2, 2, 0, 0);
  const Tensor x64 = to_device(random_f32({2, 3, 8, 8}, 1).to(DType::kF64), gpu);
  EXPECT_THROW(ops::max_pool2d_forward(gpu, x64, p), Error);
  EXPECT_THROW(ops::avg_pool2d_forward(gpu, x64, p), Error);
  EXPECT_THROW(ops::adaptive_avg_pool2d_forward(gpu, x64, 2, 2), Error);
  const Tensor x3 = to_device(random_f32({3, 8, 8}, 1), gpu);
  EXPECT_THROW(ops::max_pool2d_forward(gpu, x3, p), Error);
  // Padding more than half the kernel.
  const Tensor x = to_device(random_f32({2, 3, 8, 8}, 1), gpu);
  EXPECT_THROW(ops::avg_pool2d_forward(gpu, x, pool_params(2, 2, 2, 2, 2, 2)), Error);
  // dy of the wrong shape; indices of the wrong dtype.
  const Tensor dy = to_device(random_f32({2, 3, 5, 4}, 2), gpu);
  EXPECT_THROW(ops::avg_pool2d_backward(gpu, dy, {2, 3, 8, 8}, p), Error);
  const Tensor idx32 = to_device(random_ids({2, 3, 5, 4}, 4, 3, DType::kI32), gpu);
  EXPECT_THROW(ops::max_pool2d_backward(gpu, dy, idx32, {2, 3, 8, 8}), Error);
}

// ---- batch norm -----------------------------------------------------------------------------

struct BnCase {
  Shape x;
  std::string name;
};

std::vector<BnCase> bn_cases() {
  return {
      {{8, 5}, "(B, C)"},
      {{1003, 3}, "(B, C) tall"},
      {{4, 7, 7, 7}, "7x7 planes"},
      {{3, 6, 32, 33}, "odd planes"},
      {{4, 3, 16, 16}, "vectorized planes"},
      {{2, 4, 5}, "1-d spatial"},
      {{1, 2, 100, 100}, "one image"},
      {{32, 64, 28, 28}, "larger"},
  };
}

TEST(CudaBatchNorm, TrainForwardMatchesCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 800;
  for (const BnCase& k : bn_cases()) {
    for (const bool affine : {true, false}) {
      for (const bool running : {true, false}) {
        SCOPED_TRACE(k.name + (affine ? " affine" : "") + (running ? " running" : ""));
        const int64_t c = k.x[1];
        // An offset mean, so the variance is not computed around zero.
        const Tensor x = random_f32(k.x, ++seed, 2.0, 5.0);
        const Tensor gamma = affine ? random_f32({c}, ++seed, 0.5, 1.5) : Tensor();
        const Tensor beta = affine ? random_f32({c}, ++seed) : Tensor();
        const Tensor rm_cpu = running ? random_f32({c}, ++seed) : Tensor();
        const Tensor rv_cpu = running ? random_f32({c}, ++seed, 0.5, 2.0) : Tensor();
        const Tensor rm_gpu = running ? to_device(rm_cpu, gpu) : Tensor();
        const Tensor rv_gpu = running ? to_device(rv_cpu, gpu) : Tensor();
        const ops::BatchNormTrainResult ref =
            ops::batch_norm_forward_train(cpu, x, gamma, beta, rm_cpu, rv_cpu, 0.1, 1e-5);
        const ops::BatchNormTrainResult got = ops::batch_norm_forward_train(
            gpu, to_device(x, gpu), affine ? to_device(gamma, gpu) : Tensor(),
            affine ? to_device(beta, gpu) : Tensor(), rm_gpu, rv_gpu, 0.1, 1e-5);
        EXPECT_TRUE(parity(gpu, got.y, ref.y, parity_bound(Precision::kF32), "y"));
        EXPECT_TRUE(
            parity(gpu, got.save_mean, ref.save_mean, parity_bound(Precision::kF32), "mean"));
        EXPECT_TRUE(
            parity(gpu, got.save_invstd, ref.save_invstd, parity_bound(Precision::kF32), "invstd"));
        if (running) {
          EXPECT_TRUE(parity(gpu, rm_gpu, rm_cpu, parity_bound(Precision::kF32), "running_mean"));
          EXPECT_TRUE(parity(gpu, rv_gpu, rv_cpu, parity_bound(Precision::kF32), "running_var"));
        }
      }
    }
  }
}

TEST(CudaBatchNorm, EvalForwardMatchesCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 900;
  for (const BnCase& k : bn_cases()) {
    for (const bool affine : {true, false}) {
      SCOPED_TRACE(k.name + (affine ? " affine" : ""));
      const int64_t c = k.x[1];
      const Tensor x = random_f32(k.x, ++seed);
      const Tensor gamma = affine ? random_f32({c}, ++seed) : Tensor();
      const Tensor beta = affine ? random_f32({c}, ++seed) : Tensor();
      const Tensor rm = random_f32({c}, ++seed);
      const Tensor rv = random_f32({c}, ++seed, 0.5, 2.0);
      const Tensor ref = ops::batch_norm_forward_eval(cpu, x, gamma, beta, rm, rv, 1e-5);
      const Tensor got = ops::batch_norm_forward_eval(
          gpu, to_device(x, gpu), affine ? to_device(gamma, gpu) : Tensor(),
          affine ? to_device(beta, gpu) : Tensor(), to_device(rm, gpu), to_device(rv, gpu), 1e-5);
      EXPECT_TRUE(parity(gpu, got, ref, parity_bound(Precision::kF32), "y"));
    }
  }
}

TEST(CudaBatchNorm, BackwardMatchesCpuAndAccumulates) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 1000;
  for (const BnCase& k : bn_cases()) {
    for (const bool affine : {true, false}) {
      SCOPED_TRACE(k.name + (affine ? " affine" : ""));
      const int64_t c = k.x[1];
      const Tensor x = random_f32(k.x, ++seed, -1.0, 3.0);
      const Tensor gamma = affine ? random_f32({c}, ++seed, 0.5, 1.5) : Tensor();
      const Tensor beta = affine ? random_f32({c}, ++seed) : Tensor();
      const ops::BatchNormTrainResult fwd =
          ops::batch_norm_forward_train(cpu, x, gamma, beta, Tensor(), Tensor(), 0.1, 1e-5);
      const Tensor dy = random_f32(k.x, ++seed);
      const Tensor dg_cpu = affine ? random_f32({c}, ++seed) : Tensor();
      const Tensor db_cpu = affine ? random_f32({c}, ++seed) : Tensor();
      const Tensor dg_gpu = affine ? to_device(dg_cpu, gpu) : Tensor();
      const Tensor db_gpu = affine ? to_device(db_cpu, gpu) : Tensor();
      const Tensor dx_ref = ops::batch_norm_backward(cpu, dy, x, gamma, fwd.save_mean,
                                                     fwd.save_invstd, dg_cpu, db_cpu);
      const Tensor dx = ops::batch_norm_backward(
          gpu, to_device(dy, gpu), to_device(x, gpu), affine ? to_device(gamma, gpu) : Tensor(),
          to_device(fwd.save_mean, gpu), to_device(fwd.save_invstd, gpu), dg_gpu, db_gpu);
      EXPECT_TRUE(parity(gpu, dx, dx_ref, parity_bound(Precision::kF32), "dx"));
      if (affine) {
        EXPECT_TRUE(parity(gpu, dg_gpu, dg_cpu, parity_bound(Precision::kF32), "dgamma"));
        EXPECT_TRUE(parity(gpu, db_gpu, db_cpu, parity_bound(Precision::kF32), "dbeta"));
      }
    }
  }
}

TEST(CudaBatchNorm, HalfPrecisionMatchesCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 1100;
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const Precision prec = dtype == DType::kBF16 ? Precision::kBF16 : Precision::kF16;
    for (const BnCase& k : bn_cases()) {
      SCOPED_TRACE(k.name + " " + dtype_name(dtype));
      const int64_t c = k.x[1];
      const Tensor x = rounded(random_f32(k.x, ++seed), dtype);
      const Tensor gamma = rounded(random_f32({c}, ++seed, 0.5, 1.5), dtype);
      const Tensor beta = rounded(random_f32({c}, ++seed), dtype);
      const auto dev = [&](const Tensor& t) { return to_device(t.to(dtype), gpu); };
      // The statistics stay f32 under 16-bit x (ops/batch_norm.h), the running ones too.
      const Tensor rm_cpu = random_f32({c}, ++seed), rv_cpu = random_f32({c}, ++seed, 0.5, 2.0);
      const Tensor rm_gpu = to_device(rm_cpu, gpu), rv_gpu = to_device(rv_cpu, gpu);
      const ops::BatchNormTrainResult ref =
          ops::batch_norm_forward_train(cpu, x, gamma, beta, rm_cpu, rv_cpu, 0.1, 1e-5);
      const ops::BatchNormTrainResult got = ops::batch_norm_forward_train(
          gpu, dev(x), dev(gamma), dev(beta), rm_gpu, rv_gpu, 0.1, 1e-5);
      EXPECT_EQ(got.y.dtype(), dtype);
      EXPECT_EQ(got.save_mean.dtype(), DType::kF32);
      EXPECT_EQ(got.save_invstd.dtype(), DType::kF32);
      EXPECT_TRUE(parity(gpu, got.y, ref.y, parity_bound(prec), "y"));
      EXPECT_TRUE(parity(gpu, got.save_mean, ref.save_mean, parity_bound(prec), "mean"));
      EXPECT_TRUE(parity(gpu, got.save_invstd, ref.save_invstd, parity_bound(prec), "invstd"));
      EXPECT_TRUE(parity(gpu, rm_gpu, rm_cpu, parity_bound(prec), "running_mean"));
      EXPECT_TRUE(parity(gpu, rv_gpu, rv_cpu, parity_bound(prec), "running_var"));
      // Backward from the same f32 saved statistics on both sides.
      const Tensor mean = ref.save_mean, invstd = ref.save_invstd;
      const Tensor dy = rounded(random_f32(k.x, ++seed), dtype);
      const Tensor dg_cpu = Tensor::zeros({c}), db_cpu = Tensor::zeros({c});
      const Tensor dg_gpu = dev(Tensor::zeros({c})), db_gpu = dev(Tensor::zeros({c}));
      const Tensor dx_ref =
          ops::batch_norm_backward(cpu, dy, x, gamma, mean, invstd, dg_cpu, db_cpu);
      const Tensor dx =
          ops::batch_norm_backward(gpu, dev(dy), dev(x), dev(gamma), to_device(mean, gpu),
                                   to_device(invstd, gpu), dg_gpu, db_gpu);
      EXPECT_TRUE(parity(gpu, dx, dx_ref, parity_bound(prec), "dx"));
      EXPECT_TRUE(parity(gpu, dg_gpu, dg_cpu, parity_bound(prec), "dgamma"));
      EXPECT_TRUE(parity(gpu, db_gpu, db_cpu, parity_bound(prec), "dbeta"));
    }
  }
}

TEST(CudaBatchNorm, RejectsBadInputs) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const Tensor x = to_device(random_f32({4, 3, 5, 5}, 1), gpu);
  const Tensor x64 = to_device(random_f32({4, 3, 5, 5}, 1).to(DType::kF64), gpu);
  EXPECT_THROW(
      ops::batch_norm_forward_train(gpu, x64, Tensor(), Tensor(), Tensor(), Tensor(), 0.1, 1e-5),
      Error);
  // gamma of the wrong length; gamma of another dtype.
  EXPECT_THROW(ops::batch_norm_forward_train(gpu, x, to_device(random_f32({4}, 2), gpu), Tensor(),
                                             Tensor(), Tensor(), 0.1, 1e-5),
               Error);
  EXPECT_THROW(
      ops::batch_norm_forward_train(gpu, x, to_device(random_f32({3}, 2).to(DType::kBF16), gpu),
                                    Tensor(), Tensor(), Tensor(), 0.1, 1e-5),
      Error);
  // One value per channel.
  EXPECT_THROW(ops::batch_norm_forward_train(gpu, to_device(random_f32({1, 3}, 3), gpu), Tensor(),
                                             Tensor(), Tensor(), Tensor(), 0.1, 1e-5),
               Error);
  // Only one running statistic; evaluation without them.
  const Tensor r = to_device(random_f32({3}, 4), gpu);
  EXPECT_THROW(ops::batch_norm_forward_train(gpu, x, Tensor(), Tensor(), r, Tensor(), 0.1, 1e-5),
               Error);
  EXPECT_THROW(ops::batch_norm_forward_eval(gpu, x, Tensor(), Tensor(), Tensor(), Tensor(), 1e-5),
               Error);
  // dy of the wrong shape.
  EXPECT_THROW(ops::batch_norm_backward(gpu, to_device(random_f32({4, 3, 5, 4}, 5), gpu), x,
                                        Tensor(), r, r, Tensor(), Tensor()),
               Error);
}

}  // namespace
}  // namespace strata
