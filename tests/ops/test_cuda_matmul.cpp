// CUDA parity of the matrix products (ops/matmul_cuda.cu, cuBLASLt) against the CPU reference:
// matmul and its gradients (2-D, transposes, strided batches, a 2-D b shared by the batch), the
// linear layer (bias epilogue, dweight/dbias accumulation), TF32, bf16 and f16, and the fused
// linear_gelu_forward. The last test checks linear_gelu_forward's CPU path and runs everywhere.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/check.h"
#include "engine/cuda_runtime.h"
#include "ops/activation.h"
#include "ops/linear_padded.h"
#include "ops/matmul.h"
#include "testing/cuda_parity.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::identical;
using testing::parity;
using testing::parity_bound;
using testing::Precision;
using testing::random_f32;
using testing::to_device;
using testing::to_host;

// The values a 16-bit tensor holds, as f32 (the CPU reference computes on these).
Tensor rounded(const Tensor& t, DType dtype) { return t.to(dtype).to(DType::kF32); }

// f32 values with at most 8 significant bits (those of bf16), which TF32's 11 hold exactly: the
// tensor cores' conversion of the inputs (rounding or truncating the mantissa) then loses nothing,
// and a TF32 product differs from the f32 reference by accumulation order only. (On arbitrary f32
// inputs a truncating conversion biases products by up to 2^-10, the size of the TF32 bound.)
Tensor tf32_exact(const Tensor& t) { return rounded(t, DType::kBF16); }

// Expects `fn` to throw a strata::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown (expected one mentioning " << parts.front() << ")";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
    }
  }
}

// ---- matmul ------------------------------------------------------------------------------------

struct MatmulCase {
  Shape a, b;
  bool ta, tb;
};

std::string case_name(const ::testing::TestParamInfo<MatmulCase>& info) {
  std::string s;
  for (int64_t v : info.param.a) s += std::to_string(v) + "x";
  s += "_";
  for (int64_t v : info.param.b) s += std::to_string(v) + "x";
  s += info.param.ta ? "_ta" : "";
  s += info.param.tb ? "_tb" : "";
  return s;
}

class CudaMatmulTest : public ::testing::TestWithParam<MatmulCase> {};

// Forward and both gradients for f32, bf16 and f16 (f32: also TF32).
TEST_P(CudaMatmulTest, ForwardAndBackwardMatchCpu) {
  STRATA_REQUIRE_CUDA();
  const MatmulCase& p = GetParam();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const Tensor a = random_f32(p.a, 11), b = random_f32(p.b, 12);
  const Tensor c_ref = ops::matmul(cpu, a, b, p.ta, p.tb);
  const Tensor dc = random_f32(c_ref.shape(), 13);
  const ops::MatmulGrads g_ref = ops::matmul_backward(cpu, dc, a, b, p.ta, p.tb, true, true);

  {  // f32
    const Tensor ga = to_device(a, gpu), gb = to_device(b, gpu), gdc = to_device(dc, gpu);
    const Tensor c = ops::matmul(gpu, ga, gb, p.ta, p.tb);
    EXPECT_TRUE(parity(gpu, c, c_ref, parity_bound(Precision::kF32), "c"));
    const ops::MatmulGrads g = ops::matmul_backward(gpu, gdc, ga, gb, p.ta, p.tb, true, true);
    EXPECT_TRUE(parity(gpu, g.da, g_ref.da, parity_bound(Precision::kF32), "da"));
    EXPECT_TRUE(parity(gpu, g.db, g_ref.db, parity_bound(Precision::kF32), "db"));
    // Only one of the gradients.
    const ops::MatmulGrads only_a = ops::matmul_backward(gpu, gdc, ga, gb, p.ta, p.tb, true, false);
    EXPECT_FALSE(only_a.db.defined());
    EXPECT_TRUE(parity(gpu, only_a.da, g_ref.da, parity_bound(Precision::kF32), "da only"));
    const ops::MatmulGrads only_b = ops::matmul_backward(gpu, gdc, ga, gb, p.ta, p.tb, false, true);
    EXPECT_FALSE(only_b.da.defined());
    EXPECT_TRUE(parity(gpu, only_b.db, g_ref.db, parity_bound(Precision::kF32), "db only"));
  }
  {  // TF32 tensor cores, on inputs TF32 holds exactly (see tf32_exact)
    cuda::set_tf32(gpu.cuda(), true);
    const Tensor at = tf32_exact(a), bt = tf32_exact(b), dct = tf32_exact(dc);
    const Tensor ga = to_device(at, gpu), gb = to_device(bt, gpu), gdc = to_device(dct, gpu);
    EXPECT_TRUE(parity(gpu, ops::matmul(gpu, ga, gb, p.ta, p.tb),
                       ops::matmul(cpu, at, bt, p.ta, p.tb), parity_bound(Precision::kTF32),
                       "c tf32"));
    const ops::MatmulGrads g = ops::matmul_backward(gpu, gdc, ga, gb, p.ta, p.tb, true, true);
    const ops::MatmulGrads r = ops::matmul_backward(cpu, dct, at, bt, p.ta, p.tb, true, true);
    EXPECT_TRUE(parity(gpu, g.da, r.da, parity_bound(Precision::kTF32), "da tf32"));
    EXPECT_TRUE(parity(gpu, g.db, r.db, parity_bound(Precision::kTF32), "db tf32"));
    cuda::set_tf32(gpu.cuda(), false);
  }
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    const Precision prec = dtype == DType::kBF16 ? Precision::kBF16 : Precision::kF16;
    const std::string name = dtype_name(dtype);
    const Tensor ar = rounded(a, dtype), br = rounded(b, dtype), dcr = rounded(dc, dtype);
    const Tensor ga = to_device(a.to(dtype), gpu), gb = to_device(b.to(dtype), gpu);
    const Tensor gdc = to_device(dc.to(dtype), gpu);
    const Tensor c = ops::matmul(gpu, ga, gb, p.ta, p.tb);
    EXPECT_EQ(c.dtype(), dtype);
    EXPECT_TRUE(
        parity(gpu, c, ops::matmul(cpu, ar, br, p.ta, p.tb), parity_bound(prec), "c " + name));
    const ops::MatmulGrads g = ops::matmul_backward(gpu, gdc, ga, gb, p.ta, p.tb, true, true);
    const ops::MatmulGrads r = ops::matmul_backward(cpu, dcr, ar, br, p.ta, p.tb, true, true);
    EXPECT_TRUE(parity(gpu, g.da, r.da, parity_bound(prec), "da " + name));
    EXPECT_TRUE(parity(gpu, g.db, r.db, parity_bound(prec), "db " + name));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaMatmulTest,
    ::testing::Values(
        // 2-D, every transpose, odd sizes
        MatmulCase{{1, 1}, {1, 1}, false, false}, MatmulCase{{7, 5}, {5, 3}, false, false},
        MatmulCase{{5, 7}, {5, 3}, true, false}, MatmulCase{{7, 5}, {3, 5}, false, true},
        MatmulCase{{5, 7}, {3, 5}, true, true}, MatmulCase{{1003, 67}, {67, 129}, false, false},
        MatmulCase{{67, 1003}, {129, 67}, true, true}, MatmulCase{{1, 300}, {300, 1}, false, false},
        // strided batches
        MatmulCase{{3, 2, 7, 9}, {3, 2, 9, 5}, false, false},
        MatmulCase{{4, 9, 7}, {4, 5, 9}, true, true}, MatmulCase{{4, 7, 9}, {4, 5, 9}, false, true},
        MatmulCase{{5, 33, 17}, {5, 33, 19}, true, false},
        // a 2-D b shared by the batch: folded into rows (no trans_a) or batch stride 0
        MatmulCase{{4, 7, 9}, {9, 5}, false, false}, MatmulCase{{2, 3, 7, 9}, {5, 9}, false, true},
        MatmulCase{{4, 9, 7}, {9, 5}, true, false}, MatmulCase{{3, 9, 7}, {5, 9}, true, true},
        MatmulCase{{6, 129, 33}, {129, 65}, true, false}),
    case_name);

TEST(CudaMatmul, EmptyInnerDimensionGivesZeros) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const Tensor a = Tensor::zeros({3, 0}), b = Tensor::zeros({0, 4});
  const Tensor c = ops::matmul(gpu, to_device(a, gpu), to_device(b, gpu));
  EXPECT_TRUE(parity(gpu, c, Tensor::zeros({3, 4}), parity_bound(Precision::kF32), "c"));
}

TEST(CudaMatmul, RejectsWrongDtypeShapeAndDevice) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const Tensor a64 = to_device(random_f32({3, 4}, 1).to(DType::kF64), gpu);
  const Tensor b64 = to_device(random_f32({4, 5}, 2).to(DType::kF64), gpu);
  expect_error([&] { ops::matmul(gpu, a64, b64); }, {"matmul", "f64"});
  const Tensor a = to_device(random_f32({3, 4}, 1), gpu);
  const Tensor b_bf16 = to_device(random_f32({4, 5}, 2).to(DType::kBF16), gpu);
  expect_error([&] { ops::matmul(gpu, a, b_bf16); }, {"matmul", "bf16"});
  expect_error(
      [&] {
        ops::matmul(gpu, a, to_device(random_f32({5, 6}, 3), gpu));
      },
      {"matmul", "inner dimensions"});
  expect_error([&] { ops::matmul(gpu, a, random_f32({4, 5}, 4)); }, {"matmul", "cpu"});
  const Tensor b = to_device(random_f32({4, 5}, 2), gpu);
  expect_error(
      [&] {
        ops::matmul_backward(gpu, to_device(random_f32({3, 6}, 5), gpu), a, b, false, false, true,
                             true);
      },
      {"matmul_backward", "dc"});
}

// ---- linear ------------------------------------------------------------------------------------

struct LinearCase {
  Shape x;
  int64_t m;
};

class CudaLinearTest : public ::testing::TestWithParam<LinearCase> {};

TEST_P(CudaLinearTest, ForwardAndAccumulatingBackwardMatchCpu) {
  STRATA_REQUIRE_CUDA();
  const LinearCase& p = GetParam();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const int64_t k = p.x.back();
  const Tensor x = random_f32(p.x, 21), w = random_f32({p.m, k}, 22), bias = random_f32({p.m}, 23);
  Shape y_shape = p.x;
  y_shape.back() = p.m;
  const Tensor dy = random_f32(y_shape, 24);
  const Tensor dw0 = random_f32({p.m, k}, 25), db0 = random_f32({p.m}, 26);

  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const Precision prec = dtype == DType::kF32    ? Precision::kF32
                           : dtype == DType::kBF16 ? Precision::kBF16
                                                   : Precision::kF16;
    const double bound = parity_bound(prec);
    const std::string name = dtype_name(dtype);
    // The reference computes in f32 on the values the dtype holds.
    const Tensor xr = rounded(x, dtype), wr = rounded(w, dtype), br = rounded(bias, dtype);
    const Tensor dyr = rounded(dy, dtype);
    const Tensor gx = to_device(x.to(dtype), gpu), gw = to_device(w.to(dtype), gpu);
    const Tensor gb = to_device(bias.to(dtype), gpu), gdy = to_device(dy.to(dtype), gpu);

    // Forward with and without bias.
    EXPECT_TRUE(parity(gpu, ops::linear_forward(gpu, gx, gw, gb),
                       ops::linear_forward(cpu, xr, wr, br), bound, "y " + name));
    EXPECT_TRUE(parity(gpu, ops::linear_forward(gpu, gx, gw, Tensor()),
                       ops::linear_forward(cpu, xr, wr, Tensor()), bound, "y no bias " + name));

    // Backward: dx returned, dweight and dbias accumulated into pre-filled gradients, twice.
    const Tensor dw_ref = rounded(dw0, dtype), db_ref = rounded(db0, dtype);
    const Tensor dx_ref = ops::linear_backward(cpu, dyr, xr, wr, dw_ref, db_ref, true);
    ops::linear_backward(cpu, dyr, xr, wr, dw_ref, db_ref, false);
    const Tensor gdw = to_device(dw0.to(dtype), gpu), gdb = to_device(db0.to(dtype), gpu);
    const Tensor dx = ops::linear_backward(gpu, gdy, gx, gw, gdw, gdb, true);
    const Tensor none = ops::linear_backward(gpu, gdy, gx, gw, gdw, gdb, false);
    EXPECT_FALSE(none.defined());
    EXPECT_TRUE(parity(gpu, dx, dx_ref, bound, "dx " + name));
    EXPECT_TRUE(parity(gpu, gdw, dw_ref, bound, "dweight += " + name));
    EXPECT_TRUE(parity(gpu, gdb, db_ref, bound, "dbias += " + name));

    // Undefined parameter gradients: only dx.
    EXPECT_TRUE(parity(gpu, ops::linear_backward(gpu, gdy, gx, gw, Tensor(), Tensor(), true),
                       dx_ref, bound, "dx alone " + name));
    // Only dbias (no dx, no dweight).
    const Tensor db_only_ref = rounded(db0, dtype);
    ops::linear_backward(cpu, dyr, xr, wr, Tensor(), db_only_ref, false);
    const Tensor gdb_only = to_device(db0.to(dtype), gpu);
    ops::linear_backward(gpu, gdy, gx, gw, Tensor(), gdb_only, false);
    EXPECT_TRUE(parity(gpu, gdb_only, db_only_ref, bound, "dbias alone " + name));
  }
}

TEST_P(CudaLinearTest, Tf32MatchesCpu) {
  STRATA_REQUIRE_CUDA();
  const LinearCase& p = GetParam();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  cuda::set_tf32(gpu.cuda(), true);
  const int64_t k = p.x.back();
  const Tensor x = tf32_exact(random_f32(p.x, 31)), w = tf32_exact(random_f32({p.m, k}, 32));
  const Tensor bias = random_f32({p.m}, 33);
  const Tensor y_ref = ops::linear_forward(cpu, x, w, bias);
  const Tensor dy = tf32_exact(random_f32(y_ref.shape(), 34));
  const Tensor dw_ref = random_f32({p.m, k}, 35), db_ref = random_f32({p.m}, 36);
  const Tensor gdw = to_device(dw_ref, gpu), gdb = to_device(db_ref, gpu);
  const Tensor dx_ref = ops::linear_backward(cpu, dy, x, w, dw_ref, db_ref, true);
  const Tensor gx = to_device(x, gpu), gw = to_device(w, gpu);
  const double bound = parity_bound(Precision::kTF32);
  EXPECT_TRUE(
      parity(gpu, ops::linear_forward(gpu, gx, gw, to_device(bias, gpu)), y_ref, bound, "y"));
  const Tensor dx = ops::linear_backward(gpu, to_device(dy, gpu), gx, gw, gdw, gdb, true);
  EXPECT_TRUE(parity(gpu, dx, dx_ref, bound, "dx"));
  EXPECT_TRUE(parity(gpu, gdw, dw_ref, bound, "dweight"));
  EXPECT_TRUE(parity(gpu, gdb, db_ref, bound, "dbias"));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaLinearTest,
                         ::testing::Values(LinearCase{{1, 1}, 1}, LinearCase{{7, 5}, 3},
                                           LinearCase{{2, 3, 13}, 8},
                                           LinearCase{{1003, 65}, 37},      // odd, several splits
                                           LinearCase{{8, 517, 64}, 96},    // many rows
                                           LinearCase{{20000, 16}, 5},      // long column sums
                                           LinearCase{{3, 1000 + 3}, 1003}  // wide rows
                                           ));

TEST(CudaLinear, RejectsWrongDtypeAndShape) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const Tensor x = to_device(random_f32({4, 5}, 1), gpu), w = to_device(random_f32({3, 5}, 2), gpu);
  expect_error(
      [&] {
        ops::linear_forward(gpu, to_device(random_f32({4, 5}, 1).to(DType::kF64), gpu),
                            to_device(random_f32({3, 5}, 2).to(DType::kF64), gpu), Tensor());
      },
      {"linear_forward", "f64"});
  expect_error([&] { ops::linear_forward(gpu, x, w, to_device(random_f32({4}, 3), gpu)); },
               {"linear_forward", "bias"});
  expect_error(
      [&] {
        ops::linear_forward(gpu, x, to_device(random_f32({3, 6}, 2), gpu), Tensor());
      },
      {"linear_forward", "K"});
  const Tensor dy = to_device(random_f32({4, 3}, 4), gpu);
  expect_error(
      [&] {
        ops::linear_backward(gpu, dy, x, w, to_device(random_f32({3, 4}, 5), gpu), Tensor(), true);
      },
      {"linear_backward", "dweight"});
  expect_error(
      [&] {
        ops::linear_backward(gpu, dy, x, w, Tensor(),
                             to_device(random_f32({3}, 6).to(DType::kF16), gpu), true);
      },
      {"linear_backward", "dbias"});
  expect_error(
      [&] {
        ops::linear_backward(gpu, to_device(random_f32({4, 2}, 7), gpu), x, w, Tensor(), Tensor(),
                             true);
      },
      {"linear_backward", "dy"});
}

// ---- linear_gelu_forward -----------------------------------------------------------------------

// M a multiple of 8 takes cuBLASLt's GELU_AUX(_BIAS) epilogue, other M the unfused path. The
// epilogue's GELU may use the hardware tanh approximation (relative error ~1e-4), hence the TF32
// bound on y for f32; pre is the exact product plus bias.
TEST(CudaLinearGelu, MatchesCpuFusedAndUnfused) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  struct Case {
    Shape x;
    int64_t m;
  };
  for (const Case& c : {Case{{7, 5}, 8}, Case{{2, 65, 33}, 64}, Case{{1003, 96}, 384},
                        Case{{7, 5}, 3}, Case{{2, 33, 17}, 37}}) {
    const int64_t k = c.x.back();
    const Tensor x = random_f32(c.x, 41, -2.0, 2.0), w = random_f32({c.m, k}, 42);
    const Tensor bias = random_f32({c.m}, 43);
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::string name =
          std::string(dtype_name(dtype)) + " " + shape_str(c.x) + " m " + std::to_string(c.m);
      const double bound_pre = parity_bound(dtype == DType::kF32    ? Precision::kF32
                                            : dtype == DType::kBF16 ? Precision::kBF16
                                                                    : Precision::kF16);
      const double bound_y = dtype == DType::kF32 ? parity_bound(Precision::kTF32) : bound_pre;
      const Tensor xr = rounded(x, dtype), wr = rounded(w, dtype), br = rounded(bias, dtype);
      const Tensor gx = to_device(x.to(dtype), gpu), gw = to_device(w.to(dtype), gpu);
      for (bool with_bias : {true, false}) {
        const ops::LinearGeluResult ref =
            ops::linear_gelu_forward(cpu, xr, wr, with_bias ? br : Tensor());
        const ops::LinearGeluResult r = ops::linear_gelu_forward(
            gpu, gx, gw, with_bias ? to_device(bias.to(dtype), gpu) : Tensor());
        EXPECT_EQ(r.y.dtype(), dtype);
        const std::string what = name + (with_bias ? " bias" : " no bias");
        EXPECT_TRUE(parity(gpu, r.pre, ref.pre, bound_pre, "pre " + what));
        EXPECT_TRUE(parity(gpu, r.y, ref.y, bound_y, "y " + what));
      }
    }
  }
}

TEST(CudaLinearGelu, RejectsWrongDtype) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  expect_error(
      [&] {
        ops::linear_gelu_forward(gpu, to_device(random_f32({4, 5}, 1).to(DType::kF64), gpu),
                                 to_device(random_f32({8, 5}, 2).to(DType::kF64), gpu), Tensor());
      },
      {"linear_gelu_forward", "f64"});
}

// ---- CPU path (runs everywhere) ----------------------------------------------------------------

TEST(LinearGeluCpu, EqualsLinearThenGelu) {
  ExecContext cpu;
  for (DType dtype : {DType::kF32, DType::kF64}) {
    const Tensor x = random_f32({2, 7, 13}, 51, -3.0, 3.0).to(dtype);
    const Tensor w = random_f32({9, 13}, 52).to(dtype), b = random_f32({9}, 53).to(dtype);
    for (const Tensor& bias : {b, Tensor()}) {
      const ops::LinearGeluResult r = ops::linear_gelu_forward(cpu, x, w, bias);
      const Tensor pre = ops::linear_forward(cpu, x, w, bias);
      const Tensor y = ops::gelu_forward(cpu, pre);
      EXPECT_EQ(r.pre.shape(), (Shape{2, 7, 9}));
      EXPECT_EQ(r.y.dtype(), dtype);
      EXPECT_TRUE(testing::all_close(r.pre, pre, 0.0, 0.0));
      EXPECT_TRUE(testing::all_close(r.y, y, 0.0, 0.0));
    }
  }
  EXPECT_THROW(
      ops::linear_gelu_forward(cpu, random_f32({2, 4}, 1), random_f32({3, 5}, 2), Tensor()), Error);
}

// The padded linear layer (ops/linear_padded.h): CUDA computes the padded product, the CPU the
// unpadded one; the real columns agree, the padding is -inf on both, and the backward leaves the
// padding rows of the gradients at zero. f32 and bf16.
TEST(CudaLinearPadded, MatchesTheCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const int64_t m = 33, k = 64, n = 300, np = 384;
  for (const DType d : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(d));
    const double bound = parity_bound(d == DType::kF32 ? Precision::kF32 : Precision::kBF16);
    const Tensor x = random_f32({m, k}, 81).to(d);
    Tensor w = random_f32({np, k}, 82);
    w.narrow(0, n, np - n).zero_();  // padding rows are zero, as the models keep them
    w = w.to(d);
    const Tensor y_cpu = ops::linear_padded_forward(cpu, x, w, Tensor(), n);
    const Tensor y_gpu =
        ops::linear_padded_forward(gpu, to_device(x, gpu), to_device(w, gpu), Tensor(), n);
    EXPECT_TRUE(parity(gpu, to_host(y_gpu, gpu).narrow(1, 0, n).contiguous(),
                       y_cpu.narrow(1, 0, n).contiguous(), bound, "logits"));
    EXPECT_TRUE(identical(gpu, to_host(y_gpu, gpu).narrow(1, n, np - n).contiguous(),
                          y_cpu.narrow(1, n, np - n).contiguous(), "the padding's -inf"));
    Tensor dy = random_f32({m, np}, 83);
    dy.narrow(1, n, np - n).zero_();  // cross_entropy_backward with num_classes zeroes it
    dy = dy.to(d);
    const Tensor dw_cpu = Tensor::zeros({np, k}, d), dw_gpu = to_device(dw_cpu, gpu);
    const Tensor dx_cpu = ops::linear_padded_backward(cpu, dy, x, w, dw_cpu, Tensor(), n);
    const Tensor dx_gpu = ops::linear_padded_backward(gpu, to_device(dy, gpu), to_device(x, gpu),
                                                      to_device(w, gpu), dw_gpu, Tensor(), n);
    EXPECT_TRUE(parity(gpu, dx_gpu, dx_cpu, bound, "dx"));
    EXPECT_TRUE(parity(gpu, dw_gpu, dw_cpu, bound, "dweight"));
    EXPECT_TRUE(identical(gpu, to_host(dw_gpu, gpu).narrow(0, n, np - n).contiguous(),
                          Tensor::zeros({np - n, k}, d), "the padding rows' gradient"));
  }
}

}  // namespace
}  // namespace strata
