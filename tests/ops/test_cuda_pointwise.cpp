// CUDA-vs-CPU parity of the point-wise ops: elementwise (add, mul, scale, add_, sum_to_shape),
// shape ops (permute_copy, concat, split), activations (relu, gelu), dropout, softmax and layer
// norm, in f32 and (where the CUDA kernels take them) bf16 and f16. Low-precision runs compare
// against the CPU f32 op on the same rounded inputs. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "engine/check.h"
#include "ops/activation.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/layer_norm.h"
#include "ops/shape_ops.h"
#include "ops/softmax.h"
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

const DType kLowp[] = {DType::kBF16, DType::kF16};

Precision precision_of(DType d) {
  switch (d) {
    case DType::kBF16:
      return Precision::kBF16;
    case DType::kF16:
      return Precision::kF16;
    default:
      return Precision::kF32;
  }
}

// A CPU tensor rounded to `d` (the input of the CUDA op) and its f32 copy (the CPU reference's).
struct Rounded {
  Tensor lowp, f32;
};
Rounded rounded(const Tensor& t, DType d) {
  Rounded r;
  r.lowp = t.to(d);
  r.f32 = r.lowp.to(DType::kF32);
  return r;
}

std::string tag(const std::string& what, DType d) { return what + " " + dtype_name(d); }

// ---- elementwise ------------------------------------------------------------------------------

struct ShapePair {
  Shape a, b;
};

const std::vector<ShapePair>& binary_shapes() {
  static const std::vector<ShapePair> shapes = {
      {{1}, {1}},
      {{7}, {7}},
      {{1003}, {1003}},
      {{7, 5}, {7, 5}},
      {{4, 3, 5}, {5}},
      {{4, 1, 5}, {3, 1}},
      {{1}, {2, 3}},
      {{257, 129}, {257, 1}},
      {{3, 70001}, {70001}},
      {{2, 1, 3, 1, 5}, {4, 1, 5}},
      {{6, 8}, {1}},
  };
  return shapes;
}

TEST(CudaPointwise, AddMulF32) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 1;
  for (const ShapePair& s : binary_shapes()) {
    const Tensor a = random_f32(s.a, seed++), b = random_f32(s.b, seed++);
    const Tensor da = to_device(a, gpu), db = to_device(b, gpu);
    const std::string what = shape_str(s.a) + " x " + shape_str(s.b);
    EXPECT_TRUE(parity(gpu, ops::add(gpu, da, db), ops::add(cpu, a, b),
                       parity_bound(Precision::kF32), "add " + what));
    EXPECT_TRUE(parity(gpu, ops::mul(gpu, da, db), ops::mul(cpu, a, b),
                       parity_bound(Precision::kF32), "mul " + what));
  }
}

TEST(CudaPointwise, AddMulLowPrecision) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 100;
  for (DType d : kLowp) {
    for (const ShapePair& s : binary_shapes()) {
      const Rounded a = rounded(random_f32(s.a, seed++), d),
                    b = rounded(random_f32(s.b, seed++), d);
      const Tensor da = to_device(a.lowp, gpu), db = to_device(b.lowp, gpu);
      const std::string what = shape_str(s.a) + " x " + shape_str(s.b);
      const Tensor sum = ops::add(gpu, da, db);
      EXPECT_EQ(sum.dtype(), d);
      EXPECT_TRUE(parity(gpu, sum, ops::add(cpu, a.f32, b.f32), parity_bound(precision_of(d)),
                         tag("add " + what, d)));
      EXPECT_TRUE(parity(gpu, ops::mul(gpu, da, db), ops::mul(cpu, a.f32, b.f32),
                         parity_bound(precision_of(d)), tag("mul " + what, d)));
    }
  }
}

TEST(CudaPointwise, Scale) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  for (int64_t n : {1, 7, 1003, 70001}) {
    const Tensor x = random_f32({n}, 200 + n);
    EXPECT_TRUE(parity(gpu, ops::scale(gpu, to_device(x, gpu), -0.37), ops::scale(cpu, x, -0.37),
                       parity_bound(Precision::kF32), "scale " + std::to_string(n)));
    for (DType d : kLowp) {
      const Rounded r = rounded(x, d);
      EXPECT_TRUE(parity(gpu, ops::scale(gpu, to_device(r.lowp, gpu), 2.5),
                         ops::scale(cpu, r.f32, 2.5), parity_bound(precision_of(d)),
                         tag("scale " + std::to_string(n), d)));
    }
  }
}

TEST(CudaPointwise, AddInplaceAccumulates) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  for (int64_t n : {1, 7, 1003}) {
    for (double alpha : {1.0, 0.5, -2.0}) {
      const Tensor dst = random_f32({n}, 300 + n), src = random_f32({n}, 400 + n);
      const Tensor ddst = to_device(dst, gpu);
      ops::add_(gpu, ddst, to_device(src, gpu), alpha);
      const Tensor ref = dst.clone();
      ops::add_(cpu, ref, src, alpha);
      EXPECT_TRUE(parity(gpu, ddst, ref, parity_bound(Precision::kF32),
                         "add_ " + std::to_string(n) + " alpha " + std::to_string(alpha)));
    }
  }
  // src aliasing dst: dst = 3 dst.
  {
    const Tensor dst = random_f32({1003}, 500);
    const Tensor ddst = to_device(dst, gpu);
    ops::add_(gpu, ddst, ddst, 2.0);
    const Tensor ref = dst.clone();
    ops::add_(cpu, ref, ref, 2.0);
    EXPECT_TRUE(parity(gpu, ddst, ref, parity_bound(Precision::kF32), "add_ aliased"));
  }
  // dst a contiguous view at an odd offset (no vector accesses), the rest untouched.
  {
    const Tensor big = random_f32({5, 7}, 501), src = random_f32({3, 7}, 502);
    const Tensor dbig = to_device(big, gpu);
    ops::add_(gpu, dbig.narrow(0, 1, 3), to_device(src, gpu), 1.0);
    const Tensor ref = big.clone();
    ops::add_(cpu, ref.narrow(0, 1, 3), src, 1.0);
    EXPECT_TRUE(parity(gpu, dbig, ref, parity_bound(Precision::kF32), "add_ into a view"));
  }
  for (DType d : kLowp) {
    const Rounded dst = rounded(random_f32({1003}, 503), d),
                  src = rounded(random_f32({1003}, 504), d);
    const Tensor ddst = to_device(dst.lowp, gpu);
    ops::add_(gpu, ddst, to_device(src.lowp, gpu), 0.5);
    const Tensor ref = dst.f32.clone();
    ops::add_(cpu, ref, src.f32, 0.5);
    EXPECT_TRUE(parity(gpu, ddst, ref, parity_bound(precision_of(d)), tag("add_", d)));
  }
}

TEST(CudaPointwise, SumToShape) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const std::vector<ShapePair> cases = {
      {{64, 33}, {33}},
      {{64, 33}, {64, 1}},
      {{2, 3, 4, 5}, {3, 1, 5}},
      {{2, 3, 4, 5}, {1}},
      {{1003}, {1}},
      {{1003}, {1003}},
      {{5000, 7}, {7}},
      {{3, 100003}, {3, 1}},
      {{4, 1, 6}, {1, 6}},
      {{6, 5, 4, 3}, {6, 1, 4, 1}},
      {{20000, 768}, {768}},
      {{1}, {1}},
      {{7, 9, 11}, {9, 1}},
  };
  uint64_t seed = 600;
  for (const ShapePair& c : cases) {
    const Tensor t = random_f32(c.a, seed++);
    const std::string what = shape_str(c.a) + " -> " + shape_str(c.b);
    EXPECT_TRUE(parity(gpu, ops::sum_to_shape(gpu, to_device(t, gpu), c.b),
                       ops::sum_to_shape(cpu, t, c.b), parity_bound(Precision::kF32),
                       "sum_to_shape " + what));
  }
  const Rounded t = rounded(random_f32({300, 17}, 650), DType::kBF16);
  EXPECT_TRUE(parity(gpu, ops::sum_to_shape(gpu, to_device(t.lowp, gpu), {17}),
                     ops::sum_to_shape(cpu, t.f32, {17}), parity_bound(Precision::kBF16),
                     "sum_to_shape bf16"));
  EXPECT_THROW(ops::sum_to_shape(gpu, to_device(random_f32({4, 5}, 651), gpu), {4}), Error);
}

TEST(CudaPointwise, ElementwiseErrors) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const Tensor a = to_device(random_f32({3, 4}, 700), gpu);
  const Tensor ids = to_device(random_ids({3, 4}, 5, 701, DType::kI32), gpu);
  EXPECT_THROW(ops::add(gpu, a, ids), Error);                                       // dtypes
  EXPECT_THROW(ops::add(gpu, ids, ids), Error);                                     // i32
  EXPECT_THROW(ops::mul(gpu, a, to_device(random_f32({5}, 702), gpu)), Error);      // shapes
  EXPECT_THROW(ops::add_(gpu, a, to_device(random_f32({4, 3}, 703), gpu)), Error);  // shapes
  EXPECT_THROW(ops::add(gpu, a, random_f32({3, 4}, 704)), Error);                   // on the CPU
  EXPECT_THROW(ops::scale(gpu, to_device(random_f32({3}, 705).to(DType::kF64), gpu), 2.0), Error);
}

// ---- shape ops ----------------------------------------------------------------------------------

TEST(CudaPointwise, PermuteCopy) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  struct Case {
    Shape shape;
    std::vector<int64_t> dims;
  };
  const std::vector<Case> cases = {
      {{2, 3, 4, 5}, {0, 2, 1, 3}},
      {{2, 3, 4, 5}, {3, 2, 1, 0}},
      {{2, 3, 4, 5}, {0, 1, 3, 2}},
      {{33, 65}, {1, 0}},
      {{1003}, {0}},
      {{4, 1, 7}, {2, 1, 0}},
      {{3, 130, 70}, {0, 2, 1}},
      {{2, 5, 3, 16}, {0, 2, 1, 3}},
      {{1}, {0}},
      {{6, 7, 8}, {-1, 0, 1}},
  };
  uint64_t seed = 800;
  for (const Case& c : cases) {
    const std::string what = "permute_copy " + shape_str(c.shape);
    const Tensor x = random_f32(c.shape, seed++);
    const Tensor dx = to_device(x, gpu);
    EXPECT_TRUE(identical(gpu, ops::permute_copy(gpu, dx, c.dims),
                          ops::permute_copy(cpu, x, c.dims), what + " f32"));
    const Tensor xb = x.to(DType::kBF16);
    EXPECT_TRUE(identical(gpu, ops::permute_copy(gpu, to_device(xb, gpu), c.dims),
                          ops::permute_copy(cpu, xb, c.dims), what + " bf16"));
    const Tensor xh = x.to(DType::kF16);
    EXPECT_TRUE(identical(gpu, ops::permute_copy(gpu, to_device(xh, gpu), c.dims),
                          ops::permute_copy(cpu, xh, c.dims), what + " f16"));
    const Tensor ids = random_ids(c.shape, 1000, seed++);  // i64
    EXPECT_TRUE(identical(gpu, ops::permute_copy(gpu, to_device(ids, gpu), c.dims),
                          ops::permute_copy(cpu, ids, c.dims), what + " i64"));
    const Tensor bytes = random_ids(c.shape, 200, seed++).to(DType::kU8);
    EXPECT_TRUE(identical(gpu, ops::permute_copy(gpu, to_device(bytes, gpu), c.dims),
                          ops::permute_copy(cpu, bytes, c.dims), what + " u8"));
  }
  // A strided view as input (the same view of the same data on both sides).
  const Tensor x = random_f32({6, 9, 10}, 850);
  const Tensor dx = to_device(x, gpu);
  EXPECT_TRUE(identical(gpu, ops::permute_copy(gpu, dx.transpose(0, 2).narrow(1, 2, 5), {1, 0, 2}),
                        ops::permute_copy(cpu, x.transpose(0, 2).narrow(1, 2, 5), {1, 0, 2}),
                        "permute_copy of a view"));
  EXPECT_THROW(ops::permute_copy(gpu, dx, {0, 1}), Error);
  EXPECT_THROW(ops::permute_copy(gpu, dx, {0, 1, 1}), Error);
}

TEST(CudaPointwise, ConcatSplit) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  struct Case {
    std::vector<Shape> shapes;
    int64_t dim;
  };
  const std::vector<Case> cases = {
      {{{2, 3, 4}, {2, 5, 4}, {2, 1, 4}}, 1},
      {{{2, 3, 4}, {7, 3, 4}}, 0},
      {{{3, 7}, {3, 1}, {3, 0}, {3, 1003}}, -1},
      {{{1}, {1}}, 0},
      {{{5, 16}, {5, 32}}, 1},
      {{{4, 2, 3}}, 2},
  };
  uint64_t seed = 900;
  for (const Case& c : cases) {
    const std::string what = "dim " + std::to_string(c.dim) + " first " + shape_str(c.shapes[0]);
    for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kU8}) {
      TensorList xs, dxs;
      std::vector<int64_t> sizes;
      const int64_t axis = c.dim < 0 ? c.dim + static_cast<int64_t>(c.shapes[0].size()) : c.dim;
      for (const Shape& s : c.shapes) {
        const Tensor x = d == DType::kI32 || d == DType::kU8 ? random_ids(s, 100, seed++).to(d)
                                                             : random_f32(s, seed++).to(d);
        xs.push_back(x);
        dxs.push_back(to_device(x, gpu));
        sizes.push_back(s[axis]);
      }
      const Tensor ref = ops::concat(cpu, xs, c.dim);
      const Tensor got = ops::concat(gpu, dxs, c.dim);
      EXPECT_TRUE(identical(gpu, got, ref, tag("concat " + what, d)));
      const TensorList pieces = ops::split(gpu, to_device(ref, gpu), sizes, c.dim);
      ASSERT_EQ(pieces.size(), xs.size());
      for (size_t i = 0; i < xs.size(); ++i) {
        EXPECT_TRUE(identical(gpu, pieces[i], xs[i], tag("split " + what, d)));
      }
    }
  }
  const Tensor a = to_device(random_f32({2, 3}, 950), gpu);
  EXPECT_THROW(ops::concat(gpu, {a, to_device(random_f32({3, 3}, 951), gpu)}, 1), Error);
  EXPECT_THROW(ops::concat(gpu, {a, to_device(random_f32({2, 3}, 952).to(DType::kBF16), gpu)}, 0),
               Error);
  EXPECT_THROW(ops::split(gpu, a, {1, 1}, 1), Error);
  EXPECT_THROW(ops::split(gpu, a, {1, 1}, 2), Error);
}

// ---- activations --------------------------------------------------------------------------------

TEST(CudaPointwise, ReluGelu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  for (const Shape& shape : {Shape{1}, Shape{7}, Shape{1003}, Shape{3, 70001}, Shape{5, 7, 9}}) {
    const std::string what = shape_str(shape);
    const Tensor x = random_f32(shape, 1000 + shape_numel(shape), -3.0, 3.0);
    const Tensor dy = random_f32(shape, 1100 + shape_numel(shape));
    const Tensor dx_ = to_device(x, gpu), ddy = to_device(dy, gpu);
    const Tensor y_cpu = ops::relu_forward(cpu, x);
    const Tensor y_gpu = ops::relu_forward(gpu, dx_);
    EXPECT_TRUE(parity(gpu, y_gpu, y_cpu, parity_bound(Precision::kF32), "relu " + what));
    EXPECT_TRUE(parity(gpu, ops::relu_backward(gpu, ddy, y_gpu), ops::relu_backward(cpu, dy, y_cpu),
                       parity_bound(Precision::kF32), "relu_backward " + what));
    EXPECT_TRUE(parity(gpu, ops::gelu_forward(gpu, dx_), ops::gelu_forward(cpu, x),
                       parity_bound(Precision::kF32), "gelu " + what));
    EXPECT_TRUE(parity(gpu, ops::gelu_backward(gpu, ddy, dx_), ops::gelu_backward(cpu, dy, x),
                       parity_bound(Precision::kF32), "gelu_backward " + what));
    for (DType d : kLowp) {
      const Rounded xr = rounded(x, d), dyr = rounded(dy, d);
      const Tensor lx = to_device(xr.lowp, gpu), ldy = to_device(dyr.lowp, gpu);
      const double bound = parity_bound(precision_of(d));
      const Tensor ly = ops::relu_forward(gpu, lx);
      EXPECT_TRUE(parity(gpu, ly, ops::relu_forward(cpu, xr.f32), bound, tag("relu " + what, d)));
      EXPECT_TRUE(parity(gpu, ops::relu_backward(gpu, ldy, ly),
                         ops::relu_backward(cpu, dyr.f32, ops::relu_forward(cpu, xr.f32)), bound,
                         tag("relu_backward " + what, d)));
      EXPECT_TRUE(parity(gpu, ops::gelu_forward(gpu, lx), ops::gelu_forward(cpu, xr.f32), bound,
                         tag("gelu " + what, d)));
      EXPECT_TRUE(parity(gpu, ops::gelu_backward(gpu, ldy, lx),
                         ops::gelu_backward(cpu, dyr.f32, xr.f32), bound,
                         tag("gelu_backward " + what, d)));
    }
  }
  const Tensor x = to_device(random_f32({4}, 1200), gpu);
  EXPECT_THROW(ops::relu_forward(gpu, to_device(random_ids({4}, 3, 1201), gpu)), Error);
  EXPECT_THROW(ops::gelu_backward(gpu, to_device(random_f32({5}, 1202), gpu), x), Error);
  EXPECT_THROW(ops::gelu_backward(gpu, x.to(DType::kF32),
                                  to_device(random_f32({4}, 1203).to(DType::kBF16), gpu)),
               Error);
}

// ---- dropout ------------------------------------------------------------------------------------

TEST(CudaPointwise, DropoutMasksMatchCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  struct Case {
    Shape shape;
    double p;
    RngOffsets rng;
  };
  const std::vector<Case> cases = {
      {{4, 1003}, 0.1, {7, 3, 11, 0}},
      {{8, 64}, 0.5, {1, 0, 0, 5}},
      {{3, 5, 7}, 0.3, {123456789, 12, 99999, 1u << 20}},
      {{1, 1}, 0.5, {2, 2, 2, 2}},
      {{2, 70001}, 0.9, {42, 1, 3, 7}},
      {{5, 6}, 0.25, {0xFFFFFFFFFFull, 7, (int64_t{1} << 33) + 5, (int64_t{1} << 32) - 2}},
  };
  uint64_t seed = 1300;
  for (const Case& c : cases) {
    const std::string what = "dropout " + shape_str(c.shape) + " p " + std::to_string(c.p);
    const Tensor x = random_f32(c.shape, seed++);
    const ops::DropoutResult ref = ops::dropout_forward(cpu, x, c.p, c.rng);
    const ops::DropoutResult got = ops::dropout_forward(gpu, to_device(x, gpu), c.p, c.rng);
    EXPECT_TRUE(identical(gpu, got.mask, ref.mask, what + " mask"));
    EXPECT_TRUE(parity(gpu, got.y, ref.y, parity_bound(Precision::kF32), what + " y"));
    const Tensor dy = random_f32(c.shape, seed++);
    EXPECT_TRUE(parity(gpu, ops::dropout_backward(gpu, to_device(dy, gpu), got.mask, c.p),
                       ops::dropout_backward(cpu, dy, ref.mask, c.p), parity_bound(Precision::kF32),
                       what + " backward"));
    for (DType d : kLowp) {
      const Rounded xr = rounded(x, d), dyr = rounded(dy, d);
      const ops::DropoutResult lref = ops::dropout_forward(cpu, xr.f32, c.p, c.rng);
      const ops::DropoutResult lgot =
          ops::dropout_forward(gpu, to_device(xr.lowp, gpu), c.p, c.rng);
      EXPECT_TRUE(identical(gpu, lgot.mask, lref.mask, tag(what + " mask", d)));
      EXPECT_TRUE(parity(gpu, lgot.y, lref.y, parity_bound(precision_of(d)), tag(what + " y", d)));
      EXPECT_TRUE(parity(gpu, ops::dropout_backward(gpu, to_device(dyr.lowp, gpu), lgot.mask, c.p),
                         ops::dropout_backward(cpu, dyr.f32, lref.mask, c.p),
                         parity_bound(precision_of(d)), tag(what + " backward", d)));
    }
  }
}

TEST(CudaPointwise, DropoutZeroAndErrors) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const Tensor x = to_device(random_f32({3, 4}, 1400), gpu);
  const ops::DropoutResult r = ops::dropout_forward(gpu, x, 0.0, RngOffsets{});
  EXPECT_TRUE(r.y.shares_storage(x));
  EXPECT_FALSE(r.mask.defined());
  EXPECT_TRUE(ops::dropout_backward(gpu, x, Tensor(), 0.0).shares_storage(x));
  EXPECT_THROW(ops::dropout_forward(gpu, x, 1.0, RngOffsets{}), Error);
  EXPECT_THROW(ops::dropout_backward(gpu, x, Tensor(), 0.5), Error);
  const ops::DropoutResult h = ops::dropout_forward(gpu, x, 0.5, RngOffsets{});
  EXPECT_THROW(ops::dropout_backward(gpu, x, x, 0.5), Error);  // f32 mask
  EXPECT_THROW(ops::dropout_backward(gpu, to_device(random_f32({4, 3}, 1401), gpu), h.mask, 0.5),
               Error);
  EXPECT_THROW(
      ops::dropout_forward(gpu, to_device(random_ids({3, 4}, 2, 1402), gpu), 0.5, RngOffsets{}),
      Error);
}

// ---- softmax ------------------------------------------------------------------------------------

TEST(CudaPointwise, Softmax) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const std::vector<Shape> shapes = {{1, 1},     {7, 5},    {3, 1003},  {2, 2048}, {2, 3, 64},
                                     {2, 10007}, {130, 33}, {1, 50257}, {5, 1024}, {3, 1025}};
  uint64_t seed = 1500;
  for (const Shape& shape : shapes) {
    const std::string what = "softmax " + shape_str(shape);
    Tensor x = random_f32(shape, seed++, -8.0, 8.0);
    // Row 0 entirely masked (-inf), and a few -inf entries elsewhere.
    const int64_t c = shape.back();
    float* px = x.data<float>();
    if (x.numel() / c > 1) {
      for (int64_t j = 0; j < c; ++j) px[j] = -std::numeric_limits<float>::infinity();
      for (int64_t j = c; j < x.numel(); j += 3) px[j] = -std::numeric_limits<float>::infinity();
    }
    const Tensor dy = random_f32(shape, seed++);
    const Tensor y_ref = ops::softmax_forward(cpu, x);
    const Tensor y_gpu = ops::softmax_forward(gpu, to_device(x, gpu));
    EXPECT_TRUE(parity(gpu, y_gpu, y_ref, parity_bound(Precision::kF32), what));
    EXPECT_TRUE(parity(gpu, ops::softmax_backward(gpu, to_device(dy, gpu), to_device(y_ref, gpu)),
                       ops::softmax_backward(cpu, dy, y_ref), parity_bound(Precision::kF32),
                       what + " backward"));
    for (DType d : kLowp) {
      const Rounded xr = rounded(x, d), dyr = rounded(dy, d);
      const Tensor lref = ops::softmax_forward(cpu, xr.f32);
      EXPECT_TRUE(parity(gpu, ops::softmax_forward(gpu, to_device(xr.lowp, gpu)), lref,
                         parity_bound(precision_of(d)), tag(what, d)));
      const Rounded yr = rounded(lref, d);
      EXPECT_TRUE(
          parity(gpu, ops::softmax_backward(gpu, to_device(dyr.lowp, gpu), to_device(yr.lowp, gpu)),
                 ops::softmax_backward(cpu, dyr.f32, yr.f32), parity_bound(precision_of(d)),
                 tag(what + " backward", d)));
    }
  }
  EXPECT_THROW(ops::softmax_forward(gpu, to_device(random_ids({2, 3}, 4, 1600), gpu)), Error);
  EXPECT_THROW(ops::softmax_backward(gpu, to_device(random_f32({2, 3}, 1601), gpu),
                                     to_device(random_f32({3, 2}, 1602), gpu)),
               Error);
}

// ---- layer norm ---------------------------------------------------------------------------------

TEST(CudaPointwise, LayerNormForward) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 1700;
  for (int64_t c : {1, 7, 768, 1003, 3000, 9000}) {
    for (int64_t rows : {1, 5, 130}) {
      for (int affine = 0; affine < 4; ++affine) {
        const std::string what = "layer_norm rows " + std::to_string(rows) + " C " +
                                 std::to_string(c) + " affine " + std::to_string(affine);
        const Tensor x = random_f32({rows, c}, seed++, -2.0, 3.0);
        const Tensor gamma = (affine & 1) ? random_f32({c}, seed++, 0.5, 1.5) : Tensor();
        const Tensor beta = (affine & 2) ? random_f32({c}, seed++) : Tensor();
        const ops::LayerNormResult ref = ops::layer_norm_forward(cpu, x, gamma, beta, 1e-5);
        const ops::LayerNormResult got = ops::layer_norm_forward(
            gpu, to_device(x, gpu), gamma.defined() ? to_device(gamma, gpu) : Tensor(),
            beta.defined() ? to_device(beta, gpu) : Tensor(), 1e-5);
        const double bound = parity_bound(Precision::kF32);
        EXPECT_TRUE(parity(gpu, got.y, ref.y, bound, what + " y"));
        EXPECT_TRUE(parity(gpu, got.mean, ref.mean, bound, what + " mean"));
        EXPECT_TRUE(parity(gpu, got.rstd, ref.rstd, bound, what + " rstd"));
      }
    }
  }
  for (DType d : kLowp) {
    for (int64_t c : {7, 768, 3000}) {
      const Rounded x = rounded(random_f32({33, c}, seed++, -2.0, 3.0), d);
      const Rounded gamma = rounded(random_f32({c}, seed++, 0.5, 1.5), d);
      const Rounded beta = rounded(random_f32({c}, seed++), d);
      const ops::LayerNormResult ref =
          ops::layer_norm_forward(cpu, x.f32, gamma.f32, beta.f32, 1e-5);
      const ops::LayerNormResult got = ops::layer_norm_forward(
          gpu, to_device(x.lowp, gpu), to_device(gamma.lowp, gpu), to_device(beta.lowp, gpu), 1e-5);
      EXPECT_EQ(got.mean.dtype(), DType::kF32);  // statistics stay f32 (ops/layer_norm.h)
      EXPECT_EQ(got.rstd.dtype(), DType::kF32);
      const double bound = parity_bound(precision_of(d));
      const std::string what = "layer_norm C " + std::to_string(c);
      EXPECT_TRUE(parity(gpu, got.y, ref.y, bound, tag(what + " y", d)));
      EXPECT_TRUE(parity(gpu, got.mean, ref.mean, bound, tag(what + " mean", d)));
      EXPECT_TRUE(parity(gpu, got.rstd, ref.rstd, bound, tag(what + " rstd", d)));
    }
  }
}

TEST(CudaPointwise, LayerNormBackwardAccumulates) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 1800;
  for (int64_t c : {1, 7, 768, 1003, 9000}) {
    for (int64_t rows : {1, 5, 1000}) {
      for (int variant = 0; variant < 4; ++variant) {
        // variant: bit 0 gamma defined, bit 1 parameter gradients wanted.
        const bool with_gamma = variant & 1, want_params = variant & 2;
        const std::string what = "layer_norm_backward rows " + std::to_string(rows) + " C " +
                                 std::to_string(c) + " variant " + std::to_string(variant);
        const Tensor x = random_f32({rows, c}, seed++, -2.0, 3.0);
        const Tensor dy = random_f32({rows, c}, seed++);
        const Tensor gamma = with_gamma ? random_f32({c}, seed++, 0.5, 1.5) : Tensor();
        const ops::LayerNormResult fwd = ops::layer_norm_forward(cpu, x, gamma, Tensor(), 1e-5);
        // Pre-filled parameter gradients: backward must add to them.
        const Tensor dgamma = want_params ? random_f32({c}, seed++) : Tensor();
        const Tensor dbeta = want_params ? random_f32({c}, seed++) : Tensor();
        const Tensor ddgamma = want_params ? to_device(dgamma, gpu) : Tensor();
        const Tensor ddbeta = want_params ? to_device(dbeta, gpu) : Tensor();
        const Tensor ref_dgamma = want_params ? dgamma.clone() : Tensor();
        const Tensor ref_dbeta = want_params ? dbeta.clone() : Tensor();
        const Tensor dx_ref =
            ops::layer_norm_backward(cpu, dy, x, gamma, fwd.mean, fwd.rstd, ref_dgamma, ref_dbeta);
        const Tensor dx_got = ops::layer_norm_backward(
            gpu, to_device(dy, gpu), to_device(x, gpu),
            with_gamma ? to_device(gamma, gpu) : Tensor(), to_device(fwd.mean, gpu),
            to_device(fwd.rstd, gpu), ddgamma, ddbeta);
        const double bound = parity_bound(Precision::kF32);
        EXPECT_TRUE(parity(gpu, dx_got, dx_ref, bound, what + " dx"));
        if (want_params) {
          EXPECT_TRUE(parity(gpu, ddgamma, ref_dgamma, bound, what + " dgamma"));
          EXPECT_TRUE(parity(gpu, ddbeta, ref_dbeta, bound, what + " dbeta"));
        }
      }
    }
  }
  // Only dbeta wanted; and a second backward doubles the accumulated sum.
  {
    const Tensor x = random_f32({64, 96}, seed++), dy = random_f32({64, 96}, seed++);
    const ops::LayerNormResult fwd = ops::layer_norm_forward(cpu, x, Tensor(), Tensor(), 1e-5);
    const Tensor dbeta = Tensor::zeros({96});
    const Tensor ddbeta = to_device(dbeta, gpu);
    for (int i = 0; i < 2; ++i) {
      ops::layer_norm_backward(cpu, dy, x, Tensor(), fwd.mean, fwd.rstd, Tensor(), dbeta);
      ops::layer_norm_backward(gpu, to_device(dy, gpu), to_device(x, gpu), Tensor(),
                               to_device(fwd.mean, gpu), to_device(fwd.rstd, gpu), Tensor(),
                               ddbeta);
    }
    EXPECT_TRUE(parity(gpu, ddbeta, dbeta, parity_bound(Precision::kF32), "dbeta twice"));
  }
  for (DType d : kLowp) {
    for (int64_t c : {7, 768, 3000}) {
      const std::string what = "layer_norm_backward C " + std::to_string(c);
      const Rounded x = rounded(random_f32({257, c}, seed++, -2.0, 3.0), d);
      const Rounded dy = rounded(random_f32({257, c}, seed++), d);
      const Rounded gamma = rounded(random_f32({c}, seed++, 0.5, 1.5), d);
      const ops::LayerNormResult fwd =
          ops::layer_norm_forward(cpu, x.f32, gamma.f32, Tensor(), 1e-5);
      const Tensor mean = fwd.mean, rstd = fwd.rstd;  // f32 statistics on both sides
      const Rounded dgamma = rounded(random_f32({c}, seed++), d);
      const Rounded dbeta = rounded(random_f32({c}, seed++), d);
      const Tensor ddgamma = to_device(dgamma.lowp, gpu), ddbeta = to_device(dbeta.lowp, gpu);
      const Tensor ref_dgamma = dgamma.f32.clone(), ref_dbeta = dbeta.f32.clone();
      const Tensor dx_ref = ops::layer_norm_backward(cpu, dy.f32, x.f32, gamma.f32, mean, rstd,
                                                     ref_dgamma, ref_dbeta);
      const Tensor dx_got = ops::layer_norm_backward(
          gpu, to_device(dy.lowp, gpu), to_device(x.lowp, gpu), to_device(gamma.lowp, gpu),
          to_device(mean, gpu), to_device(rstd, gpu), ddgamma, ddbeta);
      const double bound = parity_bound(precision_of(d));
      EXPECT_TRUE(parity(gpu, dx_got, dx_ref, bound, tag(what + " dx", d)));
      EXPECT_TRUE(parity(gpu, ddgamma, ref_dgamma, bound, tag(what + " dgamma", d)));
      EXPECT_TRUE(parity(gpu, ddbeta, ref_dbeta, bound, tag(what + " dbeta", d)));
    }
  }
}

TEST(CudaPointwise, LayerNormErrors) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const Tensor x = to_device(random_f32({4, 6}, 1900), gpu);
  EXPECT_THROW(
      ops::layer_norm_forward(gpu, x, to_device(random_f32({5}, 1901), gpu), Tensor(), 1e-5),
      Error);
  EXPECT_THROW(ops::layer_norm_forward(
                   gpu, x, to_device(random_f32({6}, 1902).to(DType::kBF16), gpu), Tensor(), 1e-5),
               Error);
  EXPECT_THROW(ops::layer_norm_forward(gpu, x, Tensor(), Tensor(), -1.0), Error);
  EXPECT_THROW(ops::layer_norm_forward(gpu, to_device(random_ids({4, 6}, 3, 1903), gpu), Tensor(),
                                       Tensor(), 1e-5),
               Error);
  const ops::LayerNormResult fwd = ops::layer_norm_forward(gpu, x, Tensor(), Tensor(), 1e-5);
  EXPECT_THROW(ops::layer_norm_backward(gpu, x, x, Tensor(), fwd.rstd, x, Tensor(), Tensor()),
               Error);  // rstd with the wrong shape
  EXPECT_THROW(ops::layer_norm_backward(gpu, x, x, Tensor(), fwd.mean, fwd.rstd,
                                        to_device(random_f32({5}, 1904), gpu), Tensor()),
               Error);  // dgamma with the wrong shape
}

}  // namespace
}  // namespace strata
