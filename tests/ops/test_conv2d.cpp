#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "ops/conv2d.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::all_close;
using testing::gradients_match;
using testing::random_tensor;

struct ConvCase {
  std::string name;
  int64_t b, c, h, w, oc, kh, kw;
  ops::Conv2dParams p;
  bool bias;
};
void PrintTo(const ConvCase& c, std::ostream* os) { *os << c.name; }  // gtest names the case

ops::Conv2dParams conv_params(int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh = 1,
                              int64_t dw = 1, int64_t groups = 1) {
  ops::Conv2dParams p;
  p.stride_h = sh;
  p.stride_w = sw;
  p.pad_h = ph;
  p.pad_w = pw;
  p.dilation_h = dh;
  p.dilation_w = dw;
  p.groups = groups;
  return p;
}

struct Sizes {
  int64_t b, c, h, w, oc, cg, kh, kw, oh, ow, ocg;
};

Sizes sizes_of(const Tensor& x, const Tensor& w, const ops::Conv2dParams& p) {
  Sizes s{};
  s.b = x.size(0);
  s.c = x.size(1);
  s.h = x.size(2);
  s.w = x.size(3);
  s.oc = w.size(0);
  s.cg = w.size(1);
  s.kh = w.size(2);
  s.kw = w.size(3);
  s.oh = (s.h + 2 * p.pad_h - p.dilation_h * (s.kh - 1) - 1) / p.stride_h + 1;
  s.ow = (s.w + 2 * p.pad_w - p.dilation_w * (s.kw - 1) - 1) / p.stride_w + 1;
  s.ocg = s.oc / p.groups;
  return s;
}

// Calls f(y index, x index, weight index) for every kernel tap that lands inside x.
template <typename F>
void for_each_tap(const Sizes& s, const ops::Conv2dParams& p, F&& f) {
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t o = 0; o < s.oc; ++o)
      for (int64_t cl = 0; cl < s.cg; ++cl)
        for (int64_t u = 0; u < s.kh; ++u)
          for (int64_t v = 0; v < s.kw; ++v)
            for (int64_t i = 0; i < s.oh; ++i) {
              const int64_t c = (o / s.ocg) * s.cg + cl;
              const int64_t ih = i * p.stride_h - p.pad_h + u * p.dilation_h;
              if (ih < 0 || ih >= s.h) continue;
              const int64_t w_at = ((o * s.cg + cl) * s.kh + u) * s.kw + v;
              for (int64_t j = 0; j < s.ow; ++j) {
                const int64_t iw = j * p.stride_w - p.pad_w + v * p.dilation_w;
                if (iw < 0 || iw >= s.w) continue;
                const int64_t y_at = ((b * s.oc + o) * s.oh + i) * s.ow + j;
                const int64_t x_at = ((b * s.c + c) * s.h + ih) * s.w + iw;
                f(y_at, x_at, w_at);
              }
            }
}

// Naive reference in double, straight from the definition.
Tensor naive_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                    const ops::Conv2dParams& p) {
  const Sizes s = sizes_of(x, w, p);
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  std::vector<double> y(static_cast<size_t>(s.b * s.oc * s.oh * s.ow), 0.0);
  if (bias.defined()) {
    const std::vector<double> bv = bias.to_vector<double>();
    for (size_t i = 0; i < y.size(); ++i) y[i] = bv[(i / (s.oh * s.ow)) % s.oc];
  }
  for_each_tap(s, p,
               [&](int64_t y_at, int64_t x_at, int64_t w_at) { y[y_at] += xv[x_at] * wv[w_at]; });
  return Tensor::from_vector(y, {s.b, s.oc, s.oh, s.ow});
}

struct NaiveGrads {
  Tensor dx, dw, db;
};
NaiveGrads naive_conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                 const ops::Conv2dParams& p) {
  const Sizes s = sizes_of(x, w, p);
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const std::vector<double> dyv = dy.to_vector<double>();
  std::vector<double> dx(xv.size(), 0.0), dw(wv.size(), 0.0), db(s.oc, 0.0);
  for (size_t i = 0; i < dyv.size(); ++i) db[(i / (s.oh * s.ow)) % s.oc] += dyv[i];
  for_each_tap(s, p, [&](int64_t y_at, int64_t x_at, int64_t w_at) {
    dx[x_at] += dyv[y_at] * wv[w_at];
    dw[w_at] += dyv[y_at] * xv[x_at];
  });
  return {Tensor::from_vector(dx, x.shape()), Tensor::from_vector(dw, w.shape()),
          Tensor::from_vector(db, {s.oc})};
}

class Conv2dTest : public ::testing::TestWithParam<ConvCase> {
 protected:
  Tensor x() const {
    const ConvCase& k = GetParam();
    return random_tensor({k.b, k.c, k.h, k.w}, 1);
  }
  Tensor weight() const {
    const ConvCase& k = GetParam();
    return random_tensor({k.oc, k.c / k.p.groups, k.kh, k.kw}, 2);
  }
  Tensor bias() const { return GetParam().bias ? random_tensor({GetParam().oc}, 3) : Tensor(); }
};

TEST_P(Conv2dTest, ForwardMatchesNaiveInF64AndF32) {
  ExecContext ctx;
  const ops::Conv2dParams& p = GetParam().p;
  Tensor x = this->x(), w = weight(), b = bias();
  const Tensor ref = naive_conv2d(x, w, b, p);
  EXPECT_TRUE(all_close(ops::conv2d_forward(ctx, x, w, b, p), ref, 1e-12, 1e-12));
  Tensor b32 = b.defined() ? b.to(DType::kF32) : Tensor();
  Tensor y32 = ops::conv2d_forward(ctx, x.to(DType::kF32), w.to(DType::kF32), b32, p);
  EXPECT_EQ(y32.dtype(), DType::kF32);
  EXPECT_TRUE(all_close(y32, ref, 1e-5, 1e-5));
}

TEST_P(Conv2dTest, BackwardMatchesNaive) {
  ExecContext ctx;
  const ops::Conv2dParams& p = GetParam().p;
  Tensor x = this->x(), w = weight();
  Tensor dy = random_tensor(naive_conv2d(x, w, Tensor(), p).shape(), 4);
  Tensor dw = Tensor::zeros(w.shape(), DType::kF64), db = Tensor::zeros({w.size(0)}, DType::kF64);
  Tensor dx = ops::conv2d_backward(ctx, dy, x, w, p, dw, db, true);
  const NaiveGrads ref = naive_conv2d_backward(dy, x, w, p);
  EXPECT_TRUE(all_close(dx, ref.dx, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(dw, ref.dw, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(db, ref.db, 1e-12, 1e-12));
}

TEST_P(Conv2dTest, FiniteDifferenceGradients) {
  ExecContext ctx;
  const ops::Conv2dParams& p = GetParam().p;
  Tensor x = this->x(), w = weight(), b = bias();
  Tensor dy = random_tensor(naive_conv2d(x, w, b, p).shape(), 4);
  Tensor dw = Tensor::zeros(w.shape(), DType::kF64);
  Tensor db = b.defined() ? Tensor::zeros(b.shape(), DType::kF64) : Tensor();
  Tensor dx = ops::conv2d_backward(ctx, dy, x, w, p, dw, db, true);
  if (b.defined()) {
    auto f = [&](const TensorList& xs) { return ops::conv2d_forward(ctx, xs[0], xs[1], xs[2], p); };
    EXPECT_TRUE(gradients_match(f, {x, w, b}, dy, {dx, dw, db}));
  } else {
    auto f = [&](const TensorList& xs) {
      return ops::conv2d_forward(ctx, xs[0], xs[1], Tensor(), p);
    };
    EXPECT_TRUE(gradients_match(f, {x, w}, dy, {dx, dw}));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Conv2dTest,
    ::testing::Values(
        ConvCase{"basic_3x3_pad1_bias", 2, 4, 5, 6, 4, 3, 3, conv_params(1, 1, 1, 1), true},
        ConvCase{"single_image", 1, 2, 4, 5, 3, 3, 3, conv_params(1, 1, 1, 1), true},
        ConvCase{"stride_nonsquare_kernel", 2, 2, 7, 6, 3, 3, 2, conv_params(2, 1, 0, 0), false},
        ConvCase{"dilation", 2, 4, 7, 7, 2, 3, 3, conv_params(1, 1, 2, 1, 2, 1), true},
        ConvCase{"groups_stride2", 2, 8, 5, 5, 6, 3, 3, conv_params(2, 2, 1, 1, 1, 1, 2), true},
        ConvCase{"depthwise", 2, 3, 6, 5, 3, 3, 3, conv_params(1, 1, 1, 1, 1, 1, 3), true},
        ConvCase{"depthwise_multiplier", 2, 3, 5, 4, 6, 3, 3, conv_params(1, 2, 1, 0, 1, 1, 3),
                 false},
        ConvCase{"pointwise_small_plane", 3, 32, 3, 4, 5, 1, 1, conv_params(1, 1, 0, 0), true},
        ConvCase{"same_width_taps_past_the_edge", 1, 2, 3, 2, 2, 3, 5, conv_params(1, 1, 1, 2),
                 false},
        ConvCase{"pad_wider_than_kernel", 1, 1, 3, 3, 2, 2, 2, conv_params(3, 2, 2, 3), true},
        ConvCase{"kernel_fills_padded_input", 2, 2, 4, 3, 2, 6, 5, conv_params(1, 1, 1, 1), true}),
    [](const ::testing::TestParamInfo<ConvCase>& info) { return info.param.name; });

// A 1x1 kernel on a large plane takes the path without im2col.
TEST(Conv2d, PointwiseLargePlaneMatchesNaive) {
  ExecContext ctx;
  for (int64_t groups : {1, 2}) {
    const ops::Conv2dParams p = conv_params(1, 1, 0, 0, 1, 1, groups);
    Tensor x = random_tensor({2, 4, 32, 40}, 1), w = random_tensor({6, 4 / groups, 1, 1}, 2);
    Tensor b = random_tensor({6}, 3);
    EXPECT_TRUE(
        all_close(ops::conv2d_forward(ctx, x, w, b, p), naive_conv2d(x, w, b, p), 1e-12, 1e-12));
    Tensor dy = random_tensor({2, 6, 32, 40}, 4);
    Tensor dw = Tensor::zeros(w.shape(), DType::kF64), db = Tensor::zeros({6}, DType::kF64);
    Tensor dx = ops::conv2d_backward(ctx, dy, x, w, p, dw, db, true);
    const NaiveGrads ref = naive_conv2d_backward(dy, x, w, p);
    EXPECT_TRUE(all_close(dx, ref.dx, 1e-12, 1e-12));
    EXPECT_TRUE(all_close(dw, ref.dw, 1e-12, 1e-12));
    EXPECT_TRUE(all_close(db, ref.db, 1e-12, 1e-12));
  }
}

// A batch whose columns pass the chunk budget is processed in several chunks; results are the
// same and the scratch memory stays bounded.
TEST(Conv2d, LargeBatchRunsInBoundedChunks) {
  CpuAllocator alloc;
  ExecContext ctx(Device::cpu(), &alloc);
  const ops::Conv2dParams p = conv_params(1, 1, 1, 1, 1, 1, 2);
  Tensor x = random_tensor({38, 8, 32, 32}, 1), w = random_tensor({4, 4, 3, 3}, 2);
  Tensor b = random_tensor({4}, 3);
  const size_t before = alloc.stats().current;  // x, w, b come from the default allocator
  alloc.reset_peak();
  Tensor y = ops::conv2d_forward(ctx, x, w, b, p);
  const size_t columns_of_whole_batch = 38 * 8 * 9 * 32 * 32 * sizeof(double);  // 21.4 MiB
  EXPECT_LT(alloc.stats().peak - before - y.nbytes(), columns_of_whole_batch / 2);
  EXPECT_TRUE(all_close(y, naive_conv2d(x, w, b, p), 1e-12, 1e-12));

  Tensor dy = random_tensor(y.shape(), 4);
  Tensor dw = Tensor::zeros(w.shape(), DType::kF64), db = Tensor::zeros({4}, DType::kF64);
  alloc.reset_peak();
  Tensor dx = ops::conv2d_backward(ctx, dy, x, w, p, dw, db, true);
  EXPECT_LT(alloc.stats().peak - before - y.nbytes() - dx.nbytes(), columns_of_whole_batch / 2);
  const NaiveGrads ref = naive_conv2d_backward(dy, x, w, p);
  EXPECT_TRUE(all_close(dx, ref.dx, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(dw, ref.dw, 1e-11, 1e-12));
  EXPECT_TRUE(all_close(db, ref.db, 1e-11, 1e-12));
}

TEST(Conv2d, ParameterGradientsAccumulate) {
  ExecContext ctx;
  const ops::Conv2dParams p = conv_params(1, 1, 1, 1, 1, 1, 2);
  Tensor x = random_tensor({3, 4, 5, 5}, 1), w = random_tensor({4, 2, 3, 3}, 2);
  Tensor dy = random_tensor({3, 4, 5, 5}, 3);
  Tensor dw = Tensor::zeros(w.shape(), DType::kF64), db = Tensor::zeros({4}, DType::kF64);
  Tensor dx = ops::conv2d_backward(ctx, dy, x, w, p, dw, db, false);
  EXPECT_FALSE(dx.defined());
  const std::vector<double> w1 = dw.to_vector<double>(), b1 = db.to_vector<double>();
  ops::conv2d_backward(ctx, dy, x, w, p, dw, db, false);
  const std::vector<double> w2 = dw.to_vector<double>(), b2 = db.to_vector<double>();
  for (size_t i = 0; i < w2.size(); ++i) EXPECT_DOUBLE_EQ(w2[i], 2 * w1[i]);
  for (size_t i = 0; i < b2.size(); ++i) EXPECT_DOUBLE_EQ(b2[i], 2 * b1[i]);
}

TEST(Conv2d, BackwardWithoutParameterGradients) {
  ExecContext ctx;
  const ops::Conv2dParams p = conv_params(2, 1, 1, 0);
  Tensor x = random_tensor({2, 3, 6, 5}, 1), w = random_tensor({2, 3, 3, 3}, 2);
  Tensor dy = random_tensor(naive_conv2d(x, w, Tensor(), p).shape(), 3);
  Tensor dx = ops::conv2d_backward(ctx, dy, x, w, p, Tensor(), Tensor(), true);
  EXPECT_TRUE(all_close(dx, naive_conv2d_backward(dy, x, w, p).dx, 1e-12, 1e-12));
}

TEST(Conv2d, OutputSize) {
  EXPECT_EQ(ops::conv2d_output_size(28, 3, 1, 1, 1), 28);
  EXPECT_EQ(ops::conv2d_output_size(28, 3, 2, 1, 1), 14);
  EXPECT_EQ(ops::conv2d_output_size(7, 3, 1, 0, 2), 3);
  EXPECT_EQ(ops::conv2d_output_size(224, 7, 2, 3, 1), 112);
  EXPECT_EQ(ops::conv2d_output_size(4, 6, 1, 1, 1), 1);
  EXPECT_THROW(ops::conv2d_output_size(4, 7, 1, 1, 1), Error);
  EXPECT_THROW(ops::conv2d_output_size(4, 3, 0, 1, 1), Error);
}

// Runs f, expects a strata::Error whose message contains every one of `words`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& words) {
  try {
    f();
    ADD_FAILURE() << "no error thrown; expected one mentioning '" << words.back() << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& word : words) {
      EXPECT_NE(message.find(word), std::string::npos) << "'" << word << "' not in: " << message;
    }
  }
}

TEST(Conv2d, RejectsBadInputs) {
  ExecContext ctx;
  const ops::Conv2dParams p = conv_params(1, 1, 1, 1);
  Tensor x = random_tensor({2, 4, 5, 5}, 1), w = random_tensor({6, 4, 3, 3}, 2);
  auto fwd = [&](const Tensor& xx, const Tensor& ww, const Tensor& bb,
                 const ops::Conv2dParams& pp) {
    return [&ctx, xx, ww, bb, pp] { ops::conv2d_forward(ctx, xx, ww, bb, pp); };
  };
  expect_error(fwd(random_tensor({4, 5, 5}, 1), w, Tensor(), p), {"conv2d_forward", "x"});
  expect_error(fwd(x, random_tensor({6, 4, 9}, 2), Tensor(), p), {"conv2d_forward", "weight"});
  expect_error(fwd(x, random_tensor({6, 3, 3, 3}, 2), Tensor(), p),
               {"conv2d_forward", "weight", "input channels"});
  expect_error(fwd(x, random_tensor({6, 2, 3, 3}, 2), Tensor(), conv_params(1, 1, 1, 1, 1, 1, 3)),
               {"conv2d_forward", "groups 3"});
  expect_error(fwd(x, random_tensor({6, 4, 8, 3}, 2), Tensor(), p),
               {"conv2d_forward", "weight", "larger than x"});
  expect_error(fwd(x, w, Tensor(), conv_params(1, 1, 1, 1, 4, 1)), {"conv2d_forward", "spans"});
  expect_error(fwd(x, w, random_tensor({5}, 3), p), {"conv2d_forward", "bias"});
  expect_error(fwd(x, w.to(DType::kF32), Tensor(), p), {"conv2d_forward", "weight", "f32"});
  expect_error(fwd(x.to(DType::kI64), w, Tensor(), p), {"conv2d_forward", "x", "i64"});
  expect_error(fwd(x, w, Tensor(), conv_params(0, 1, 1, 1)), {"conv2d_forward", "stride"});
  expect_error(
      [&] {
        ops::conv2d_backward(ctx, random_tensor({2, 6, 4, 5}, 3), x, w, p, Tensor(), Tensor(),
                             true);
      },
      {"conv2d_backward", "dy"});
  expect_error(
      [&] {
        ops::conv2d_backward(ctx, random_tensor({2, 6, 5, 5}, 3), x, w, p,
                             Tensor::zeros({6, 4, 3, 2}, DType::kF64), Tensor(), true);
      },
      {"conv2d_backward", "dweight"});
  expect_error(
      [&] {
        ops::conv2d_backward(ctx, random_tensor({2, 6, 5, 5}, 3), x, w, p, Tensor(),
                             Tensor::zeros({6}, DType::kF32), true);
      },
      {"conv2d_backward", "dbias"});
}

}  // namespace
}  // namespace strata
