#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "ops/elementwise.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::all_close;
using testing::gradients_match;
using testing::random_tensor;

// Expects f to throw a strata::Error whose message contains every needle.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no strata::Error thrown";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const std::string& n : needles) {
      EXPECT_NE(what.find(n), std::string::npos) << "'" << n << "' not in: " << what;
    }
  }
}

// Row-major multi-index of flat index i in `shape`.
std::vector<int64_t> unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = i % shape[d];
    i /= shape[d];
  }
  return index;
}

// Flat index in `shape` of the output multi-index `out_index`, NumPy broadcasting rules.
int64_t broadcast_source(const std::vector<int64_t>& out_index, const Shape& shape) {
  const size_t lead = out_index.size() - shape.size();
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    flat = flat * shape[d] + (shape[d] == 1 ? 0 : out_index[lead + d]);
  }
  return flat;
}

// Naive reference of a broadcast binary op, in double, one output element at a time.
Tensor naive_binary(const Tensor& a, const Tensor& b, const Shape& out,
                    const std::function<double(double, double)>& f) {
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> y(static_cast<size_t>(shape_numel(out)));
  for (int64_t i = 0; i < shape_numel(out); ++i) {
    const std::vector<int64_t> index = unravel(i, out);
    y[i] = f(av[broadcast_source(index, a.shape())], bv[broadcast_source(index, b.shape())]);
  }
  return Tensor::from_vector(y, out);
}

// Naive sum_to_shape: every element of t added into the element it was broadcast from.
Tensor naive_sum_to_shape(const Tensor& t, const Shape& shape) {
  const std::vector<double> tv = t.to_vector<double>();
  std::vector<double> out(static_cast<size_t>(shape_numel(shape)), 0.0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    out[broadcast_source(unravel(i, t.shape()), shape)] += tv[i];
  }
  return Tensor::from_vector(out, shape);
}

TEST(BroadcastShapes, NumPyRules) {
  EXPECT_EQ(ops::broadcast_shapes({2, 3}, {2, 3}), (Shape{2, 3}));
  EXPECT_EQ(ops::broadcast_shapes({2, 3, 4}, {4}), (Shape{2, 3, 4}));
  EXPECT_EQ(ops::broadcast_shapes({3, 1}, {2, 1, 5}), (Shape{2, 3, 5}));
  EXPECT_EQ(ops::broadcast_shapes({}, {2, 3}), (Shape{2, 3}));
  EXPECT_EQ(ops::broadcast_shapes({1}, {0, 3}), (Shape{0, 3}));
  expect_error(
      [] {
        ops::broadcast_shapes({2, 3}, {4});
      },
      {"broadcast_shapes", "(2, 3)", "(4,)", "3 and 4"});
}

struct BinaryCase {
  Shape a, b;
};

class BroadcastBinaryTest : public ::testing::TestWithParam<BinaryCase> {};

TEST_P(BroadcastBinaryTest, AddAndMulMatchNaiveInF64AndF32) {
  const BinaryCase& p = GetParam();
  ExecContext ctx;
  const Tensor a = random_tensor(p.a, 1), b = random_tensor(p.b, 2);
  const Shape out = ops::broadcast_shapes(p.a, p.b);
  const Tensor sum = naive_binary(a, b, out, [](double x, double y) { return x + y; });
  const Tensor prod = naive_binary(a, b, out, [](double x, double y) { return x * y; });
  EXPECT_TRUE(all_close(ops::add(ctx, a, b), sum, 0, 0));
  EXPECT_TRUE(all_close(ops::mul(ctx, a, b), prod, 0, 0));
  const Tensor a32 = a.to(DType::kF32), b32 = b.to(DType::kF32);
  const Tensor y32 = ops::add(ctx, a32, b32);
  EXPECT_EQ(y32.dtype(), DType::kF32);
  EXPECT_TRUE(all_close(y32, sum, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(ops::mul(ctx, a32, b32), prod, 1e-6, 1e-6));
  // Swapping the operands swaps the broadcast roles.
  EXPECT_TRUE(all_close(ops::add(ctx, b, a), sum, 0, 0));
}

TEST_P(BroadcastBinaryTest, AddBackwardFiniteDifference) {
  const BinaryCase& p = GetParam();
  ExecContext ctx;
  const Tensor a = random_tensor(p.a, 3), b = random_tensor(p.b, 4);
  const Tensor dy = random_tensor(ops::broadcast_shapes(p.a, p.b), 5);
  const ops::BinaryGrads g = ops::add_backward(ctx, dy, p.a, p.b, true, true);
  auto f = [&](const TensorList& xs) { return ops::add(ctx, xs[0], xs[1]); };
  EXPECT_TRUE(gradients_match(f, {a, b}, dy, {g.da, g.db}));
  EXPECT_FALSE(g.da.shares_storage(dy));
  EXPECT_FALSE(g.db.shares_storage(dy));
}

TEST_P(BroadcastBinaryTest, MulBackwardFiniteDifference) {
  const BinaryCase& p = GetParam();
  ExecContext ctx;
  const Tensor a = random_tensor(p.a, 6), b = random_tensor(p.b, 7);
  const Tensor dy = random_tensor(ops::broadcast_shapes(p.a, p.b), 8);
  const ops::BinaryGrads g = ops::mul_backward(ctx, dy, a, b, true, true);
  auto f = [&](const TensorList& xs) { return ops::mul(ctx, xs[0], xs[1]); };
  EXPECT_TRUE(gradients_match(f, {a, b}, dy, {g.da, g.db}));
  const ops::BinaryGrads only_b = ops::mul_backward(ctx, dy, a, b, false, true);
  EXPECT_FALSE(only_b.da.defined());
  EXPECT_TRUE(all_close(only_b.db, g.db, 0, 0));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, BroadcastBinaryTest,
    ::testing::Values(BinaryCase{{2, 3}, {2, 3}},        // equal: flat path
                      BinaryCase{{2, 3, 4}, {4}},        // bias over rows
                      BinaryCase{{2, 3, 4}, {3, 1}},     // per-row scalar
                      BinaryCase{{2, 1, 4}, {3, 1}},     // both broadcast
                      BinaryCase{{}, {2, 3}},            // scalar
                      BinaryCase{{1}, {2, 3}},           // one element
                      BinaryCase{{2, 3, 1, 5}, {4, 1}},  // broadcast in the middle
                      BinaryCase{{2, 1, 3}, {2, 4, 1}},  // outer product per batch
                      BinaryCase{{1, 1}, {}}),           // single element both sides
    [](const ::testing::TestParamInfo<BinaryCase>& info) {
      return "case" + std::to_string(info.index);
    });

TEST(Add, LargeBroadcastTakesTheParallelPathAndMatches) {
  ExecContext ctx;
  const Tensor a = random_tensor({64, 513}, 1), b = random_tensor({513}, 2);
  const Tensor c = random_tensor({64, 1}, 3);
  EXPECT_TRUE(all_close(ops::add(ctx, a, b),
                        naive_binary(a, b, {64, 513}, [](double x, double y) { return x + y; }), 0,
                        0));
  EXPECT_TRUE(all_close(ops::mul(ctx, a, c),
                        naive_binary(a, c, {64, 513}, [](double x, double y) { return x * y; }), 0,
                        0));
}

TEST(Add, EmptyShapes) {
  ExecContext ctx;
  const Tensor y = ops::add(ctx, Tensor::zeros({0, 3}, DType::kF64), random_tensor({3}, 1));
  EXPECT_EQ(y.shape(), (Shape{0, 3}));
}

TEST(Add, RejectsBadOperandsNamingOpAndTensor) {
  ExecContext ctx;
  const Tensor a = random_tensor({2, 3}, 1);
  expect_error([&] { ops::add(ctx, a, random_tensor({4}, 2)); }, {"add", "a (2, 3)", "b (4,)"});
  expect_error([&] { ops::mul(ctx, a, random_tensor({3}, 2, -1, 1, DType::kF32)); },
               {"mul", "a is f64", "b is f32"});
  expect_error(
      [&] {
        ops::add(ctx, a.transpose(0, 1), random_tensor({3, 2}, 2));
      },
      {"add", "a", "contiguous"});
  expect_error([&] { ops::mul(ctx, a, Tensor()); }, {"mul", "b is undefined"});
  expect_error(
      [&] { ops::add(ctx, Tensor::zeros({3}, DType::kI64), Tensor::zeros({3}, DType::kI64)); },
      {"add", "a must be f32 or f64"});
}

TEST(Scale, MultipliesEveryElement) {
  ExecContext ctx;
  const Tensor x = random_tensor({3, 5}, 1);
  const Tensor y = ops::scale(ctx, x, -2.5);
  std::vector<double> ref = x.to_vector<double>();
  for (double& v : ref) v *= -2.5;
  EXPECT_TRUE(all_close(y, Tensor::from_vector(ref, {3, 5}), 0, 0));
  EXPECT_FALSE(y.shares_storage(x));
  expect_error([&] { ops::scale(ctx, x.transpose(0, 1), 2.0); }, {"scale", "x", "contiguous"});
}

TEST(AddInplace, AccumulatesIntoAViewOfAFlatBuffer) {
  ExecContext ctx;
  const Tensor flat = random_tensor({12}, 1);
  const std::vector<double> before = flat.to_vector<double>();
  const Tensor dst = flat.narrow(0, 3, 6).view({2, 3});
  const Tensor src = random_tensor({2, 3}, 2);
  ops::add_(ctx, dst, src, 0.5);
  const std::vector<double> after = flat.to_vector<double>(), s = src.to_vector<double>();
  for (int64_t i = 0; i < 12; ++i) {
    const double expected = (i >= 3 && i < 9) ? before[i] + 0.5 * s[i - 3] : before[i];
    EXPECT_DOUBLE_EQ(after[i], expected) << "element " << i;
  }
  ops::add_(ctx, dst, src);  // alpha defaults to 1
  EXPECT_DOUBLE_EQ(flat.to_vector<double>()[3], before[3] + 1.5 * s[0]);
}

TEST(AddInplace, AliasedSourceDoublesAndGradientsAccumulate) {
  ExecContext ctx;
  const Tensor g = random_tensor({4, 3}, 1);
  const std::vector<double> v = g.to_vector<double>();
  ops::add_(ctx, g, g, 1.0);
  const std::vector<double> w = g.to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) EXPECT_DOUBLE_EQ(w[i], 2 * v[i]);
}

TEST(AddInplace, RejectsMismatchedTensors) {
  ExecContext ctx;
  const Tensor dst = random_tensor({2, 3}, 1);
  expect_error(
      [&] {
        ops::add_(ctx, dst, random_tensor({3, 2}, 2));
      },
      {"add_", "src has shape (3, 2)", "expected (2, 3)"});
  expect_error(
      [&] {
        ops::add_(ctx, dst, random_tensor({2, 3}, 2, -1, 1, DType::kF32));
      },
      {"add_", "dst is f64", "src is f32"});
  expect_error(
      [&] {
        ops::add_(ctx, random_tensor({3, 2}, 3).transpose(0, 1), dst);
      },
      {"add_", "dst", "contiguous"});
}

struct SumCase {
  Shape t, target;
};

class SumToShapeTest : public ::testing::TestWithParam<SumCase> {};

TEST_P(SumToShapeTest, MatchesNaiveSum) {
  const SumCase& p = GetParam();
  ExecContext ctx;
  const Tensor t = random_tensor(p.t, 1);
  const Tensor ref = naive_sum_to_shape(t, p.target);
  const Tensor s = ops::sum_to_shape(ctx, t, p.target);
  EXPECT_EQ(s.shape(), p.target);
  EXPECT_TRUE(all_close(s, ref, 1e-13, 1e-13));
  EXPECT_FALSE(s.shares_storage(t));
  EXPECT_TRUE(all_close(ops::sum_to_shape(ctx, t.to(DType::kF32), p.target), ref, 1e-5, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SumToShapeTest,
    ::testing::Values(SumCase{{2, 3}, {2, 3}},           // no reduction: a copy
                      SumCase{{4, 5, 3}, {3}},           // bias gradient: leading dims
                      SumCase{{4, 5, 3}, {5, 1}},        // trailing and leading
                      SumCase{{4, 5, 3}, {4, 1, 3}},     // middle
                      SumCase{{2, 3, 4, 5}, {3, 1, 1}},  // conv bias (B, C, H, W) -> (C, 1, 1)
                      SumCase{{3, 4}, {}},               // everything, to a scalar
                      SumCase{{3, 4}, {1, 1}},           // everything, keeping dims
                      SumCase{{2, 1, 600}, {1, 600}},    // wide rows: several column blocks
                      SumCase{{3, 1, 4}, {1, 1, 4}}),    // size-1 dims in t
    [](const ::testing::TestParamInfo<SumCase>& info) {
      return "case" + std::to_string(info.index);
    });

TEST(SumToShape, LargeReductionsTakeTheParallelPath) {
  ExecContext ctx;
  const Tensor t = random_tensor({130, 300}, 1);
  EXPECT_TRUE(
      all_close(ops::sum_to_shape(ctx, t, {300}), naive_sum_to_shape(t, {300}), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(ops::sum_to_shape(ctx, t, {130, 1}), naive_sum_to_shape(t, {130, 1}), 1e-12,
                        1e-12));
}

TEST(SumToShape, AccumulatesF32InDouble) {
  ExecContext ctx;
  // 2^17 copies of 0.1f: a float running sum drifts by ~1e-3 relative; a double one does not.
  const int64_t n = int64_t{1} << 17;
  const Tensor t = Tensor::full({n}, 0.1, DType::kF32);
  const double exact = static_cast<double>(0.1f) * static_cast<double>(n);
  const double s = ops::sum_to_shape(ctx, t, {}).item<double>();
  EXPECT_NEAR(s, exact, exact * 1e-7);
}

TEST(SumToShape, EmptyInputGivesZeros) {
  ExecContext ctx;
  const Tensor s = ops::sum_to_shape(ctx, Tensor::zeros({0, 3}, DType::kF64), {1, 3});
  EXPECT_TRUE(all_close(s, Tensor::zeros({1, 3}, DType::kF64), 0, 0));
}

TEST(SumToShape, RejectsShapesThatDoNotBroadcast) {
  ExecContext ctx;
  const Tensor t = random_tensor({4, 3}, 1);
  expect_error([&] { ops::sum_to_shape(ctx, t, {2}); }, {"sum_to_shape", "t (4, 3)", "(2,)"});
  expect_error([&] { ops::sum_to_shape(ctx, t, {1, 4, 3}); }, {"sum_to_shape", "more dimensions"});
}

TEST(BinaryBackward, RejectsAWrongUpstreamShape) {
  ExecContext ctx;
  const Tensor a = random_tensor({2, 3}, 1), b = random_tensor({3}, 2);
  expect_error(
      [&] {
        ops::add_backward(ctx, random_tensor({3}, 3), {2, 3}, {3}, true, true);
      },
      {"add_backward", "dy has shape (3,)", "(2, 3)"});
  expect_error(
      [&] {
        ops::mul_backward(ctx, random_tensor({2, 2}, 3), a, b, true, true);
      },
      {"mul_backward", "dy"});
}

}  // namespace
}  // namespace strata
