// The CPU's Winograd F(4x4, 3x3) path (ops/conv2d_winograd_cpu.h) against im2col in float32 and
// float64. Its float32 error is larger than im2col's; the bound here (kWinogradTolerance,
// relative to the largest magnitude of the float64 result) is the expected order for
// F(4x4, 3x3) at these channel counts, and each case also checks that the error stays within a
// fixed factor of im2col's own float32 error, so a wrong transform (errors of order 1) fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "ops/conv2d.h"
#include "ops/conv2d_winograd_cpu.h"
#include "testing/testing.h"

namespace strata {
namespace {

using ops::cpu::Conv2dAlgo;
using testing::random_tensor;

constexpr double kWinogradTolerance = 5e-5;
// Winograd's float32 error over im2col's, at most. Measured on these cases (2026-11-26): winograd
// 0.9e-6 to 1.2e-5 (dweight at 64 channels over 7 images the largest), im2col 1e-7 to 5e-7, the
// ratio 5 to 38; a wrong coefficient or tile offset gives errors of order 1.
constexpr double kErrorRatioBound = 100.0;

struct WinoCase {
  std::string name;
  int64_t b, c, h, w, oc, pad;
};
void PrintTo(const WinoCase& c, std::ostream* os) { *os << c.name; }

ops::Conv2dParams params_for(const WinoCase& c) {
  ops::Conv2dParams p;
  p.pad_h = p.pad_w = c.pad;
  return p;
}

// max |a - ref| / max |ref| over all elements (a in f32 or f64, ref in f64).
double relative_error(const Tensor& a, const Tensor& ref) {
  const std::vector<double> va = a.to(DType::kF64).to_vector<double>();
  const std::vector<double> vr = ref.to_vector<double>();
  EXPECT_EQ(va.size(), vr.size());
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < vr.size(); ++i) {
    diff = std::max(diff, std::abs(va[i] - vr[i]));
    scale = std::max(scale, std::abs(vr[i]));
  }
  return diff / std::max(scale, 1e-300);
}

struct Results {
  Tensor y, dx, dw, db;
};

Results run(ExecContext& ctx, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy,
            const ops::Conv2dParams& p, Conv2dAlgo algo, double dw_start) {
  Results r;
  r.y = ops::cpu::conv2d_forward_with(ctx, x, w, b, p, algo);
  r.dw = Tensor::full(w.shape(), dw_start, x.dtype());
  r.db = Tensor::zeros(b.shape(), x.dtype());
  r.dx = ops::cpu::conv2d_backward_with(ctx, dy, x, w, p, r.dw, r.db, true, algo);
  return r;
}

class WinogradTest : public ::testing::TestWithParam<WinoCase> {};

TEST_P(WinogradTest, MatchesIm2colAndFloat64) {
  const WinoCase c = GetParam();
  const ops::Conv2dParams p = params_for(c);
  const int64_t oh = c.h + 2 * c.pad - 2, ow = c.w + 2 * c.pad - 2;
  Tensor x = random_tensor({c.b, c.c, c.h, c.w}, 11), w = random_tensor({c.oc, c.c, 3, 3}, 12);
  Tensor b = random_tensor({c.oc}, 13), dy = random_tensor({c.b, c.oc, oh, ow}, 14);
  auto f32 = [](const Tensor& t) { return t.to(DType::kF32); };
  ASSERT_TRUE(ops::cpu::winograd::takes(f32(x), f32(w), p));
  ExecContext ctx;
  // Weight gradients accumulate: start from 0.5 and compare against 0.5 + the gradient.
  const Results ref = run(ctx, x, w, b, dy, p, Conv2dAlgo::kIm2col, 0.5);
  const Results wino = run(ctx, f32(x), f32(w), f32(b), f32(dy), p, Conv2dAlgo::kAuto, 0.5);
  const Results im2col = run(ctx, f32(x), f32(w), f32(b), f32(dy), p, Conv2dAlgo::kIm2col, 0.5);
  const struct {
    const char* what;
    const Tensor &wino, &im2col, &ref;
  } outputs[] = {{"y", wino.y, im2col.y, ref.y},
                 {"dx", wino.dx, im2col.dx, ref.dx},
                 {"dweight", wino.dw, im2col.dw, ref.dw},
                 {"dbias", wino.db, im2col.db, ref.db}};
  for (const auto& o : outputs) {
    const double e_wino = relative_error(o.wino, o.ref), e_im2col = relative_error(o.im2col, o.ref);
    std::printf("  %-8s f32 error vs float64: winograd %.2e, im2col %.2e\n", o.what, e_wino,
                e_im2col);
    EXPECT_LT(e_wino, kWinogradTolerance) << o.what << ": im2col's f32 error is " << e_im2col;
    EXPECT_LT(e_wino, kErrorRatioBound * std::max(e_im2col, 1e-7))
        << o.what << ": winograd " << e_wino << ", im2col " << e_im2col;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, WinogradTest,
    ::testing::Values(WinoCase{"Batch1Pad1Odd7x9", 1, 16, 7, 9, 20, 1},
                      WinoCase{"Pad0Channels17To16", 3, 17, 8, 10, 16, 0},
                      WinoCase{"Pad2Channels24To19", 2, 24, 5, 6, 19, 2},
                      WinoCase{"OneTilePlane4x4", 3, 40, 4, 4, 36, 1},
                      WinoCase{"SeveralChunks32px", 7, 64, 32, 32, 64, 1},
                      WinoCase{"TilesAcrossLanes13x21", 2, 16, 13, 21, 24, 1},
                      WinoCase{"KernelBlocks512In", 2, 512, 4, 5, 70, 1},
                      // Kernels past the resident bound, two chunks in
                      // the backward: U and dU block by block per chunk.
                      WinoCase{"KernelsPerChunk384To320", 2, 384, 24, 20, 320, 1}),
    [](const ::testing::TestParamInfo<WinoCase>& info) { return info.param.name; });

TEST(Winograd, OnlyFloat32ThreeByThreeStrideOneWithEnoughChannels) {
  auto x = [](DType d, int64_t c) { return Tensor::zeros({1, c, 8, 8}, d); };
  auto w = [](DType d, int64_t oc, int64_t ic, int64_t k) {
    return Tensor::zeros({oc, ic, k, k}, d);
  };
  ops::Conv2dParams same;
  same.pad_h = same.pad_w = 1;
  EXPECT_TRUE(ops::cpu::winograd::takes(x(DType::kF32, 16), w(DType::kF32, 16, 16, 3), same));
  // float64 stays on the exact im2col path (the reference of the gradient checks).
  EXPECT_FALSE(ops::cpu::winograd::takes(x(DType::kF64, 16), w(DType::kF64, 16, 16, 3), same));
  ops::Conv2dParams stride2 = same;
  stride2.stride_h = stride2.stride_w = 2;
  EXPECT_FALSE(ops::cpu::winograd::takes(x(DType::kF32, 16), w(DType::kF32, 16, 16, 3), stride2));
  ops::Conv2dParams dilated = same;
  dilated.dilation_h = 2;
  EXPECT_FALSE(ops::cpu::winograd::takes(x(DType::kF32, 16), w(DType::kF32, 16, 16, 3), dilated));
  ops::Conv2dParams grouped = same;
  grouped.groups = 2;
  EXPECT_FALSE(ops::cpu::winograd::takes(x(DType::kF32, 16), w(DType::kF32, 16, 8, 3), grouped));
  EXPECT_FALSE(ops::cpu::winograd::takes(x(DType::kF32, 3), w(DType::kF32, 16, 3, 3), same));
  EXPECT_FALSE(ops::cpu::winograd::takes(x(DType::kF32, 16), w(DType::kF32, 8, 16, 3), same));
  EXPECT_FALSE(ops::cpu::winograd::takes(x(DType::kF32, 16), w(DType::kF32, 16, 16, 1), same));
  // A 2 x 2 output (VGG's last block at 32 px) wastes most of a 4 x 4 tile.
  EXPECT_FALSE(ops::cpu::winograd::takes(Tensor::zeros({1, 16, 2, 2}, DType::kF32),
                                         w(DType::kF32, 16, 16, 3), same));
}

// A stride-2 float32 convolution (which falls back to im2col) still matches float64 closely.
TEST(Winograd, StrideTwoFallsBackToIm2col) {
  ops::Conv2dParams p;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  Tensor x = random_tensor({2, 16, 9, 9}, 1), w = random_tensor({16, 16, 3, 3}, 2);
  ExecContext ctx;
  Tensor ref = ops::cpu::conv2d_forward_with(ctx, x, w, Tensor(), p, Conv2dAlgo::kIm2col);
  Tensor y = ops::conv2d_forward(ctx, x.to(DType::kF32), w.to(DType::kF32), Tensor(), p);
  EXPECT_LT(relative_error(y, ref), 2e-6);
}

// dx alone and dweight alone give what the full backward gives.
TEST(Winograd, PartialBackwardMatchesFull) {
  ops::Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  Tensor x = random_tensor({2, 16, 6, 6}, 1, -1, 1, DType::kF32);
  Tensor w = random_tensor({16, 16, 3, 3}, 2, -1, 1, DType::kF32);
  Tensor dy = random_tensor({2, 16, 6, 6}, 3, -1, 1, DType::kF32);
  ExecContext ctx;
  Tensor dw_full = Tensor::zeros(w.shape(), DType::kF32);
  Tensor dx_full = ops::conv2d_backward(ctx, dy, x, w, p, dw_full, Tensor(), true);
  Tensor dw = Tensor::zeros(w.shape(), DType::kF32);
  EXPECT_FALSE(ops::conv2d_backward(ctx, dy, x, w, p, dw, Tensor(), false).defined());
  Tensor dx = ops::conv2d_backward(ctx, dy, x, w, p, Tensor(), Tensor(), true);
  EXPECT_EQ(dw.to_vector<float>(), dw_full.to_vector<float>());
  EXPECT_EQ(dx.to_vector<float>(), dx_full.to_vector<float>());
}

}  // namespace
}  // namespace strata
