#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "ops/pooling.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::all_close;
using testing::gradients_match;
using testing::random_tensor;

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

// PyTorch's pooling_output_shape, written out independently of the op.
int64_t naive_out_size(int64_t in, int64_t k, int64_t s, int64_t pad, bool ceil_mode) {
  const double span = static_cast<double>(in + 2 * pad - k) / static_cast<double>(s);
  int64_t out = static_cast<int64_t>(ceil_mode ? std::ceil(span) : std::floor(span)) + 1;
  if (ceil_mode && (out - 1) * s >= in + pad) --out;
  return out;
}

struct NaivePool {
  Tensor y, indices;
};

// Naive pooling in double: walks every kernel cell of every window. Max pooling treats padding as
// -infinity and keeps the first maximum; average pooling divides by the window cells inside the
// padded input (count_include_pad) or inside the input.
NaivePool naive_pool(const Tensor& x, const ops::Pool2dParams& p, bool max) {
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t oh = naive_out_size(h, p.kernel_h, p.stride_h, p.pad_h, p.ceil_mode);
  const int64_t ow = naive_out_size(w, p.kernel_w, p.stride_w, p.pad_w, p.ceil_mode);
  const std::vector<double> xv = x.to_vector<double>();
  std::vector<double> y;
  std::vector<int64_t> idx;
  for (int64_t plane = 0; plane < b * c; ++plane) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        double best = -std::numeric_limits<double>::infinity(), sum = 0;
        int64_t best_at = -1, in_input = 0, in_padded = 0;
        for (int64_t u = 0; u < p.kernel_h; ++u) {
          for (int64_t v = 0; v < p.kernel_w; ++v) {
            const int64_t ih = i * p.stride_h - p.pad_h + u, iw = j * p.stride_w - p.pad_w + v;
            if (ih < h + p.pad_h && iw < w + p.pad_w) ++in_padded;
            if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
            ++in_input;
            const double val = xv[(plane * h + ih) * w + iw];
            sum += val;
            if (best_at < 0 || val > best) {
              best = val;
              best_at = ih * w + iw;
            }
          }
        }
        if (max) {
          y.push_back(best);
          idx.push_back(best_at);
        } else {
          y.push_back(sum / static_cast<double>(p.count_include_pad ? in_padded : in_input));
        }
      }
    }
  }
  NaivePool r;
  r.y = Tensor::from_vector(y, {b, c, oh, ow});
  if (max) r.indices = Tensor::from_vector(idx, {b, c, oh, ow});
  return r;
}

Tensor naive_adaptive_avg_pool(const Tensor& x, int64_t oh, int64_t ow) {
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const std::vector<double> xv = x.to_vector<double>();
  std::vector<double> y;
  auto lo = [](int64_t i, int64_t in, int64_t out) {
    return static_cast<int64_t>(std::floor(static_cast<double>(i * in) / out));
  };
  auto hi = [](int64_t i, int64_t in, int64_t out) {
    return static_cast<int64_t>(std::ceil(static_cast<double>((i + 1) * in) / out));
  };
  for (int64_t plane = 0; plane < b * c; ++plane) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        double sum = 0;
        int64_t n = 0;
        for (int64_t ih = lo(i, h, oh); ih < hi(i, h, oh); ++ih) {
          for (int64_t iw = lo(j, w, ow); iw < hi(j, w, ow); ++iw, ++n) {
            sum += xv[(plane * h + ih) * w + iw];
          }
        }
        y.push_back(sum / static_cast<double>(n));
      }
    }
  }
  return Tensor::from_vector(y, {b, c, oh, ow});
}

struct PoolCase {
  std::string name;
  Shape x;
  ops::Pool2dParams p;
};
void PrintTo(const PoolCase& c, std::ostream* os) { *os << c.name; }  // gtest names the case

class Pool2dTest : public ::testing::TestWithParam<PoolCase> {};

TEST_P(Pool2dTest, MaxForwardMatchesNaive) {
  ExecContext ctx;
  const PoolCase& k = GetParam();
  Tensor x = random_tensor(k.x, 1);
  const NaivePool ref = naive_pool(x, k.p, true);
  ops::MaxPool2dResult r = ops::max_pool2d_forward(ctx, x, k.p);
  EXPECT_TRUE(all_close(r.y, ref.y, 0, 0));
  EXPECT_EQ(r.indices.dtype(), DType::kI64);
  EXPECT_EQ(r.indices.to_vector<int64_t>(), ref.indices.to_vector<int64_t>());
  ops::MaxPool2dResult r32 = ops::max_pool2d_forward(ctx, x.to(DType::kF32), k.p);
  EXPECT_TRUE(all_close(r32.y, ref.y, 1e-6, 1e-6));
  EXPECT_EQ(r32.indices.to_vector<int64_t>(), ref.indices.to_vector<int64_t>());
}

TEST_P(Pool2dTest, AvgForwardMatchesNaive) {
  ExecContext ctx;
  for (bool include_pad : {true, false}) {
    ops::Pool2dParams p = GetParam().p;
    p.count_include_pad = include_pad;
    Tensor x = random_tensor(GetParam().x, 2);
    const Tensor ref = naive_pool(x, p, false).y;
    EXPECT_TRUE(all_close(ops::avg_pool2d_forward(ctx, x, p), ref, 1e-14, 1e-14)) << include_pad;
    EXPECT_TRUE(all_close(ops::avg_pool2d_forward(ctx, x.to(DType::kF32), p), ref, 1e-6, 1e-6))
        << include_pad;
  }
}

TEST_P(Pool2dTest, MaxBackwardFiniteDifference) {
  ExecContext ctx;
  const PoolCase& k = GetParam();
  Tensor x = random_tensor(k.x, 3);
  ops::MaxPool2dResult r = ops::max_pool2d_forward(ctx, x, k.p);
  Tensor dy = random_tensor(r.y.shape(), 4);
  Tensor dx = ops::max_pool2d_backward(ctx, dy, r.indices, x.shape());
  auto f = [&](const TensorList& xs) { return ops::max_pool2d_forward(ctx, xs[0], k.p).y; };
  EXPECT_TRUE(gradients_match(f, {x}, dy, {dx}));
}

TEST_P(Pool2dTest, AvgBackwardFiniteDifference) {
  ExecContext ctx;
  for (bool include_pad : {true, false}) {
    ops::Pool2dParams p = GetParam().p;
    p.count_include_pad = include_pad;
    Tensor x = random_tensor(GetParam().x, 5);
    Tensor dy = random_tensor(ops::avg_pool2d_forward(ctx, x, p).shape(), 6);
    Tensor dx = ops::avg_pool2d_backward(ctx, dy, x.shape(), p);
    auto f = [&](const TensorList& xs) { return ops::avg_pool2d_forward(ctx, xs[0], p); };
    EXPECT_TRUE(gradients_match(f, {x}, dy, {dx})) << include_pad;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Windows, Pool2dTest,
    ::testing::Values(
        PoolCase{"k2_s2", {2, 3, 6, 6}, pool_params(2, 2, 2, 2, 0, 0)},
        PoolCase{"k3_s2_p1_nonsquare_input", {2, 2, 7, 5}, pool_params(3, 3, 2, 2, 1, 1)},
        PoolCase{"nonsquare_kernel", {1, 2, 6, 5}, pool_params(3, 2, 2, 1, 1, 0)},
        PoolCase{"overlapping_k3_s1_p1", {1, 2, 5, 4}, pool_params(3, 3, 1, 1, 1, 1)},
        PoolCase{"ceil_partial_window", {1, 2, 5, 7}, pool_params(2, 2, 2, 2, 0, 0, true)},
        PoolCase{"ceil_padded", {2, 1, 6, 7}, pool_params(3, 3, 2, 2, 1, 1, true)},
        PoolCase{"ceil_drops_last_window", {1, 2, 5, 8}, pool_params(3, 3, 3, 3, 1, 1, true)},
        PoolCase{"kernel_fills_padded_input", {1, 2, 3, 2}, pool_params(5, 4, 1, 1, 1, 1)}),
    [](const ::testing::TestParamInfo<PoolCase>& info) { return info.param.name; });

TEST(Pool2d, OutputSize) {
  EXPECT_EQ(ops::pool2d_output_size(28, 2, 2, 0, false), 14);
  EXPECT_EQ(ops::pool2d_output_size(3, 2, 2, 0, false), 1);
  EXPECT_EQ(ops::pool2d_output_size(3, 2, 2, 0, true), 2);
  EXPECT_EQ(ops::pool2d_output_size(112, 3, 2, 1, false), 56);
  // Without the rule the last window would start at 6, past the input plus its left padding.
  EXPECT_EQ(ops::pool2d_output_size(5, 3, 3, 1, true), 2);
  EXPECT_EQ(ops::pool2d_output_size(8, 3, 3, 1, true), 3);
  EXPECT_THROW(ops::pool2d_output_size(4, 3, 1, 2, false), Error);  // pad > kernel / 2
  EXPECT_THROW(ops::pool2d_output_size(2, 5, 1, 1, false), Error);  // kernel > padded input
  EXPECT_THROW(ops::pool2d_output_size(4, 2, 0, 0, false), Error);
}

TEST(MaxPool2d, TiesNaNAndPadding) {
  ExecContext ctx;
  Tensor x = Tensor::from_vector(std::vector<double>{1, 3, 3, 0, 3, 2, 1, 3}, {1, 1, 2, 4});
  ops::MaxPool2dResult r = ops::max_pool2d_forward(ctx, x, pool_params(2, 2, 2, 2, 0, 0));
  EXPECT_EQ(r.y.to_vector<double>(), (std::vector<double>{3, 3}));
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));

  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor with_nan = Tensor::from_vector(std::vector<double>{1, nan, 3, 0}, {1, 1, 2, 2});
  ops::MaxPool2dResult rnan = ops::max_pool2d_forward(ctx, with_nan, pool_params(2, 2, 2, 2, 0, 0));
  EXPECT_TRUE(std::isnan(rnan.y.item<double>()));  // NaN propagates, as in PyTorch
  EXPECT_EQ(rnan.indices.item<int64_t>(), 1);

  Tensor neg = random_tensor({1, 2, 4, 4}, 1, -3.0, -1.0);
  ops::MaxPool2dResult rn = ops::max_pool2d_forward(ctx, neg, pool_params(3, 3, 1, 1, 1, 1));
  for (double v : rn.y.to_vector<double>()) EXPECT_LT(v, -0.5);
  // Overlapping windows route several gradients to one maximum.
  Tensor dx = ops::max_pool2d_backward(ctx, Tensor::full(rn.y.shape(), 1.0, DType::kF64),
                                       rn.indices, neg.shape());
  double total = 0;
  for (double v : dx.to_vector<double>()) total += v;
  EXPECT_DOUBLE_EQ(total, 32.0);
}

TEST(AvgPool2d, KnownValuesOfPaddingAndCeilRules) {
  ExecContext ctx;
  Tensor ones = Tensor::full({1, 1, 3, 3}, 1.0, DType::kF64);
  // The ceil-mode window hanging past the input (no padding) divides by its cells inside: 1.
  Tensor y = ops::avg_pool2d_forward(ctx, ones, pool_params(2, 2, 2, 2, 0, 0, true, true));
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{1, 1, 1, 1}));
  // Padded cells count with count_include_pad: window at (-1..1) x (-1..1) holds 4 ones of 9.
  y = ops::avg_pool2d_forward(ctx, ones, pool_params(3, 3, 2, 2, 1, 1, false, true));
  EXPECT_TRUE(all_close(y, Tensor::full({1, 1, 2, 2}, 4.0 / 9.0, DType::kF64), 1e-15, 0));
  y = ops::avg_pool2d_forward(ctx, ones, pool_params(3, 3, 2, 2, 1, 1, false, false));
  EXPECT_TRUE(all_close(y, Tensor::full({1, 1, 2, 2}, 1.0, DType::kF64), 1e-15, 0));
}

struct AdaptiveCase {
  std::string name;
  Shape x;
  int64_t oh, ow;
};
void PrintTo(const AdaptiveCase& c, std::ostream* os) { *os << c.name; }  // gtest names the case

class AdaptiveAvgPool2dTest : public ::testing::TestWithParam<AdaptiveCase> {};

TEST_P(AdaptiveAvgPool2dTest, ForwardMatchesNaive) {
  ExecContext ctx;
  const AdaptiveCase& k = GetParam();
  Tensor x = random_tensor(k.x, 1);
  const Tensor ref = naive_adaptive_avg_pool(x, k.oh, k.ow);
  EXPECT_TRUE(all_close(ops::adaptive_avg_pool2d_forward(ctx, x, k.oh, k.ow), ref, 1e-14, 1e-14));
  EXPECT_TRUE(all_close(ops::adaptive_avg_pool2d_forward(ctx, x.to(DType::kF32), k.oh, k.ow), ref,
                        1e-6, 1e-6));
}

TEST_P(AdaptiveAvgPool2dTest, BackwardFiniteDifference) {
  ExecContext ctx;
  const AdaptiveCase& k = GetParam();
  Tensor x = random_tensor(k.x, 2);
  Tensor dy = random_tensor({k.x[0], k.x[1], k.oh, k.ow}, 3);
  Tensor dx = ops::adaptive_avg_pool2d_backward(ctx, dy, x.shape());
  auto f = [&](const TensorList& xs) {
    return ops::adaptive_avg_pool2d_forward(ctx, xs[0], k.oh, k.ow);
  };
  EXPECT_TRUE(gradients_match(f, {x}, dy, {dx}));
}

INSTANTIATE_TEST_SUITE_P(Sizes, AdaptiveAvgPool2dTest,
                         ::testing::Values(AdaptiveCase{"divides", {2, 3, 6, 6}, 3, 3},
                                           AdaptiveCase{"does_not_divide", {1, 2, 7, 5}, 3, 2},
                                           AdaptiveCase{"global", {2, 2, 5, 4}, 1, 1},
                                           AdaptiveCase{"larger_than_input", {1, 2, 3, 4}, 5, 6},
                                           AdaptiveCase{"identity", {1, 1, 4, 3}, 4, 3}),
                         [](const ::testing::TestParamInfo<AdaptiveCase>& info) {
                           return info.param.name;
                         });

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

TEST(Pool2d, RejectsBadInputs) {
  ExecContext ctx;
  Tensor x = random_tensor({2, 3, 6, 6}, 1);
  const ops::Pool2dParams p = pool_params(2, 2, 2, 2, 0, 0);
  expect_error(
      [&] {
        ops::max_pool2d_forward(ctx, random_tensor({3, 6, 6}, 1), p);
      },
      {"max_pool2d_forward", "x", "(B, C, H, W)"});
  expect_error([&] { ops::avg_pool2d_forward(ctx, x, pool_params(8, 2, 1, 1, 0, 0)); },
               {"avg_pool2d_forward", "kernel", "larger than x"});
  expect_error([&] { ops::avg_pool2d_forward(ctx, x, pool_params(2, 2, 1, 1, 2, 0)); },
               {"avg_pool2d_forward", "half the kernel"});
  expect_error([&] { ops::max_pool2d_forward(ctx, x, pool_params(2, 2, 0, 1, 0, 0)); },
               {"max_pool2d_forward", "stride"});
  expect_error([&] { ops::max_pool2d_forward(ctx, x.to(DType::kI32), p); },
               {"max_pool2d_forward", "x", "i32"});
  expect_error(
      [&] {
        ops::avg_pool2d_backward(ctx, random_tensor({2, 3, 3, 4}, 2), x.shape(), p);
      },
      {"avg_pool2d_backward", "dy"});
  expect_error(
      [&] {
        ops::avg_pool2d_backward(ctx, random_tensor({2, 3, 3, 3}, 2), {3, 6, 6}, p);
      },
      {"avg_pool2d_backward", "x_shape"});
  ops::MaxPool2dResult r = ops::max_pool2d_forward(ctx, x, p);
  expect_error([&] { ops::max_pool2d_backward(ctx, r.y, r.indices.to(DType::kI32), x.shape()); },
               {"max_pool2d_backward", "indices", "i64"});
  expect_error(
      [&] {
        ops::max_pool2d_backward(ctx, r.y, r.indices, {2, 4, 6, 6});
      },
      {"max_pool2d_backward", "dy", "x_shape"});
  expect_error(
      [&] {
        ops::max_pool2d_backward(ctx, r.y, r.indices, {2, 3, 3, 3});
      },
      {"max_pool2d_backward", "indices", "outside"});
  expect_error([&] { ops::adaptive_avg_pool2d_forward(ctx, x, 0, 2); },
               {"adaptive_avg_pool2d_forward", "output size"});
  expect_error(
      [&] {
        ops::adaptive_avg_pool2d_backward(ctx, random_tensor({2, 2, 3, 3}, 2), x.shape());
      },
      {"adaptive_avg_pool2d_backward", "dy"});
}

}  // namespace
}  // namespace strata
