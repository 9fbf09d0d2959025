#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "ops/shape_ops.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::all_close;
using testing::gradients_match;
using testing::random_ids;
using testing::random_tensor;

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

// Naive permute of a contiguous tensor: y[i_0, ..., i_n] = x[j] with j_{dims[k]} = i_k.
Tensor naive_permute(const Tensor& x, const std::vector<int64_t>& dims) {
  const Tensor xc = x.contiguous();
  const std::vector<double> xv = xc.to_vector<double>();
  const Shape& in = x.shape();
  const Shape in_strides = contiguous_strides(in);
  std::vector<int64_t> wrapped = dims;
  for (int64_t& d : wrapped) d = d < 0 ? d + x.dim() : d;
  Shape out(dims.size());
  for (size_t k = 0; k < dims.size(); ++k) out[k] = in[wrapped[k]];
  std::vector<double> y(xv.size());
  for (int64_t i = 0; i < static_cast<int64_t>(y.size()); ++i) {
    int64_t rem = i, src = 0;
    for (size_t k = out.size(); k-- > 0;) {
      src += (rem % out[k]) * in_strides[wrapped[k]];
      rem /= out[k];
    }
    y[i] = xv[src];
  }
  return Tensor::from_vector(y, out);
}

TEST(InversePermutation, UndoesThePermutation) {
  EXPECT_EQ(ops::inverse_permutation({0, 1, 2}), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(ops::inverse_permutation({2, 0, 1}), (std::vector<int64_t>{1, 2, 0}));
  EXPECT_EQ(ops::inverse_permutation({1, 3, 0, 2}), (std::vector<int64_t>{2, 0, 3, 1}));
  EXPECT_EQ(ops::inverse_permutation({-1, 0}), (std::vector<int64_t>{1, 0}));
  EXPECT_TRUE(ops::inverse_permutation({}).empty());
  expect_error([] { ops::inverse_permutation({0, 0}); }, {"inverse_permutation", "repeated"});
  expect_error([] { ops::inverse_permutation({0, 2}); }, {"inverse_permutation", "out of range"});
}

class PermuteCopyTest : public ::testing::TestWithParam<std::vector<int64_t>> {};

TEST_P(PermuteCopyTest, MatchesNaivePermute) {
  ExecContext ctx;
  const Tensor x = random_tensor({2, 3, 4, 5}, 1);
  const Tensor y = ops::permute_copy(ctx, x, GetParam());
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_TRUE(all_close(y, naive_permute(x, GetParam()), 0, 0));
}

TEST_P(PermuteCopyTest, FiniteDifferenceGradient) {
  ExecContext ctx;
  const std::vector<int64_t>& dims = GetParam();
  const Tensor x = random_tensor({2, 3, 2, 3}, 2);
  const Tensor y = ops::permute_copy(ctx, x, dims);
  const Tensor dy = random_tensor(y.shape(), 3);
  const Tensor dx = ops::permute_copy(ctx, dy, ops::inverse_permutation(dims));
  auto f = [&](const TensorList& xs) { return ops::permute_copy(ctx, xs[0], dims); };
  EXPECT_TRUE(gradients_match(f, {x}, dy, {dx}));
}

INSTANTIATE_TEST_SUITE_P(Perms, PermuteCopyTest,
                         ::testing::Values(std::vector<int64_t>{0, 1, 2, 3},
                                           std::vector<int64_t>{0, 2, 1, 3},  // heads <-> time
                                           std::vector<int64_t>{3, 2, 1, 0},
                                           std::vector<int64_t>{1, 0, 3, 2},
                                           std::vector<int64_t>{0, 3, 1, 2},  // NCHW -> NHWC
                                           std::vector<int64_t>{-1, 0, 1, 2}),
                         [](const ::testing::TestParamInfo<std::vector<int64_t>>& info) {
                           return "perm" + std::to_string(info.index);
                         });

TEST(PermuteCopy, AcceptsStridedViewsAndAnyDtype) {
  ExecContext ctx;
  const Tensor base = random_tensor({4, 6, 5}, 1);
  // A narrowed, transposed view: neither contiguous nor starting at offset 0.
  const Tensor view = base.narrow(1, 1, 4).transpose(0, 2);  // (5, 4, 4)
  ASSERT_FALSE(view.is_contiguous());
  const Tensor y = ops::permute_copy(ctx, view, {1, 0, 2});
  EXPECT_TRUE(all_close(y, naive_permute(view, {1, 0, 2}), 0, 0));

  const Tensor ids = random_ids({3, 4}, 100, 2);
  const Tensor t = ops::permute_copy(ctx, ids, {1, 0});
  EXPECT_EQ(t.dtype(), DType::kI64);
  EXPECT_EQ(t.to_vector<int64_t>(), ids.transpose(0, 1).to_vector<int64_t>());
  const Tensor f32 = random_tensor({3, 4}, 3, -1, 1, DType::kF32);
  EXPECT_EQ(ops::permute_copy(ctx, f32, {1, 0}).to_vector<float>(),
            f32.transpose(0, 1).to_vector<float>());

  const Tensor scalar = Tensor::full({}, 4.5, DType::kF64);
  EXPECT_DOUBLE_EQ(ops::permute_copy(ctx, scalar, {}).item<double>(), 4.5);
}

TEST(PermuteCopy, LargeTransposeTakesTheParallelPath) {
  ExecContext ctx;
  const Tensor x = random_tensor({3, 200, 150}, 1);
  EXPECT_TRUE(all_close(ops::permute_copy(ctx, x, {0, 2, 1}), naive_permute(x, {0, 2, 1}), 0, 0));
}

TEST(PermuteCopy, RejectsBadDims) {
  ExecContext ctx;
  const Tensor x = random_tensor({2, 3, 4}, 1);
  expect_error([&] { ops::permute_copy(ctx, x, {0, 1}); }, {"permute_copy", "x (2, 3, 4)"});
  expect_error([&] { ops::permute_copy(ctx, x, {0, 1, 1}); }, {"permute_copy", "twice"});
  expect_error([&] { ops::permute_copy(ctx, x, {0, 1, 3}); }, {"permute_copy", "out of range"});
  expect_error([&] { ops::permute_copy(ctx, Tensor(), {}); }, {"permute_copy", "x is undefined"});
}

// Naive concat along dim: walks the output and picks the input each slice comes from.
Tensor naive_concat(const TensorList& xs, int64_t dim) {
  Shape out = xs[0].shape();
  out[dim] = 0;
  for (const Tensor& x : xs) out[dim] += x.size(dim);
  std::vector<double> y;
  const int64_t outer = shape_numel(Shape(out.begin(), out.begin() + dim));
  for (int64_t o = 0; o < outer; ++o) {
    for (const Tensor& x : xs) {
      const std::vector<double> v = x.to_vector<double>();
      const int64_t block = x.numel() / outer;
      y.insert(y.end(), v.begin() + o * block, v.begin() + (o + 1) * block);
    }
  }
  return Tensor::from_vector(y, out);
}

TEST(Concat, MatchesNaiveAlongEveryDim) {
  ExecContext ctx;
  for (int64_t dim = 0; dim < 3; ++dim) {
    Shape s0 = {2, 3, 4}, s1 = {2, 3, 4}, s2 = {2, 3, 4};
    s1[dim] = 1;
    s2[dim] = 3;
    const TensorList xs = {random_tensor(s0, 1), random_tensor(s1, 2), random_tensor(s2, 3)};
    const Tensor y = ops::concat(ctx, xs, dim);
    EXPECT_TRUE(all_close(y, naive_concat(xs, dim), 0, 0)) << "dim " << dim;
    EXPECT_TRUE(all_close(ops::concat(ctx, xs, dim - 3), y, 0, 0)) << "dim " << dim - 3;
  }
}

TEST(Concat, IndexDtypesAndEmptyPieces) {
  ExecContext ctx;
  const Tensor a = random_ids({2, 2}, 50, 1, DType::kI32),
               b = random_ids({2, 3}, 50, 2, DType::kI32);
  const Tensor e = Tensor::zeros({2, 0}, DType::kI32);
  const Tensor y = ops::concat(ctx, {a, e, b}, 1);
  EXPECT_EQ(y.dtype(), DType::kI32);
  EXPECT_EQ(y.shape(), (Shape{2, 5}));
  const std::vector<int32_t> av = a.to_vector<int32_t>(), bv = b.to_vector<int32_t>();
  const std::vector<int32_t> expected = {av[0], av[1], bv[0], bv[1], bv[2],
                                         av[2], av[3], bv[3], bv[4], bv[5]};
  EXPECT_EQ(y.to_vector<int32_t>(), expected);
}

TEST(Concat, FiniteDifferenceGradientIsSplit) {
  ExecContext ctx;
  const TensorList xs = {random_tensor({2, 2, 3}, 1), random_tensor({2, 1, 3}, 2),
                         random_tensor({2, 3, 3}, 3)};
  const Tensor dy = random_tensor({2, 6, 3}, 4);
  const TensorList dxs = ops::split(ctx, dy, {2, 1, 3}, 1);
  auto f = [&](const TensorList& in) { return ops::concat(ctx, in, 1); };
  EXPECT_TRUE(gradients_match(f, xs, dy, dxs));
}

TEST(Concat, LargeInputsTakeTheParallelPath) {
  ExecContext ctx;
  const TensorList xs = {random_tensor({300, 40}, 1), random_tensor({300, 30}, 2)};
  EXPECT_TRUE(all_close(ops::concat(ctx, xs, 1), naive_concat(xs, 1), 0, 0));
}

TEST(Concat, RejectsMismatchedInputs) {
  ExecContext ctx;
  const Tensor a = random_tensor({2, 3}, 1);
  expect_error(
      [&] {
        ops::concat(ctx, {a, random_tensor({3, 3}, 2)}, 1);
      },
      {"concat", "xs[1] has shape (3, 3)", "xs[0] has (2, 3)"});
  expect_error(
      [&] {
        ops::concat(ctx, {a, random_tensor({2, 3}, 2, -1, 1, DType::kF32)}, 0);
      },
      {"concat", "xs[1] is f32"});
  expect_error(
      [&] {
        ops::concat(ctx, {a, random_tensor({3, 2}, 2).transpose(0, 1)}, 0);
      },
      {"concat", "xs[1]", "contiguous"});
  expect_error([&] { ops::concat(ctx, {a}, 2); }, {"concat", "dim 2 is out of range"});
  expect_error([&] { ops::concat(ctx, {}, 0); }, {"concat", "at least one"});
}

TEST(Split, PiecesAreContiguousCopiesOfNarrowedViews) {
  ExecContext ctx;
  const Tensor x = random_tensor({3, 7, 2}, 1);
  const std::vector<int64_t> sizes = {2, 0, 4, 1};
  const TensorList pieces = ops::split(ctx, x, sizes, -2);
  ASSERT_EQ(pieces.size(), sizes.size());
  int64_t start = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(pieces[i].shape(), x.narrow(1, start, sizes[i]).shape());
    EXPECT_FALSE(pieces[i].shares_storage(x));
    EXPECT_TRUE(all_close(pieces[i], x.narrow(1, start, sizes[i]).contiguous(), 0, 0));
    start += sizes[i];
  }
  const TensorList rows = ops::split(ctx, x, {1, 2}, 0);
  EXPECT_TRUE(all_close(rows[1], x.narrow(0, 1, 2).contiguous(), 0, 0));
}

TEST(Split, FiniteDifferenceGradientIsConcat) {
  ExecContext ctx;
  const Tensor x = random_tensor({2, 3, 5}, 1);
  const std::vector<int64_t> sizes = {2, 3};
  // split has several outputs: check the scalar sum_i <piece_i, dy_i> through their concat.
  const TensorList dys = {random_tensor({2, 3, 2}, 2), random_tensor({2, 3, 3}, 3)};
  const Tensor dx = ops::concat(ctx, dys, 2);
  auto f = [&](const TensorList& in) {
    return ops::concat(ctx, ops::split(ctx, in[0], sizes, 2), 2);
  };
  EXPECT_TRUE(gradients_match(f, {x}, dx, {dx}));
  // And each piece on its own: the gradient of piece 1 is dy_1 in its slot, zeros elsewhere.
  auto piece1 = [&](const TensorList& in) { return ops::split(ctx, in[0], sizes, 2)[1]; };
  const Tensor only1 = ops::concat(ctx, {Tensor::zeros({2, 3, 2}, DType::kF64), dys[1]}, 2);
  EXPECT_TRUE(gradients_match(piece1, {x}, dys[1], {only1}));
}

TEST(Split, ZeroSizedPiecesRoundTripThroughConcat) {
  ExecContext ctx;
  const Tensor x = random_tensor({2, 4, 3}, 1);
  const TensorList pieces = ops::split(ctx, x, {1, 0, 3}, 1);
  EXPECT_EQ(pieces[1].shape(), (Shape{2, 0, 3}));
  EXPECT_TRUE(all_close(ops::concat(ctx, pieces, 1), x, 0, 0));
  const TensorList none = ops::split(ctx, Tensor::zeros({2, 0}, DType::kF64), {0, 0}, 1);
  EXPECT_EQ(ops::concat(ctx, none, 1).shape(), (Shape{2, 0}));
}

TEST(Split, RejectsBadSizes) {
  ExecContext ctx;
  const Tensor x = random_tensor({4, 3}, 1);
  expect_error(
      [&] {
        ops::split(ctx, x, {1, 2}, 0);
      },
      {"split", "sizes add up to 3", "x (4, 3)", "4 entries"});
  expect_error([&] { ops::split(ctx, x, {5, -1}, 0); }, {"split", "sizes[1] is negative"});
  expect_error([&] { ops::split(ctx, x, {4}, -3); }, {"split", "dim -3 is out of range"});
}

// reshape and transpose are views: their backward is the same view of the gradient.
TEST(Views, TransposeGradientIsTheTransposedGradient) {
  const Tensor x = random_tensor({3, 4, 2}, 1);
  const Tensor dy = random_tensor({2, 4, 3}, 2);
  auto f = [](const TensorList& xs) { return xs[0].transpose(0, 2); };
  EXPECT_TRUE(gradients_match(f, {x}, dy, {dy.transpose(0, 2)}));
  auto g = [](const TensorList& xs) { return xs[0].permute({1, 2, 0}); };
  const Tensor dz = random_tensor({4, 2, 3}, 3);
  EXPECT_TRUE(gradients_match(g, {x}, dz, {dz.permute(ops::inverse_permutation({1, 2, 0}))}));
}

TEST(Views, ReshapeGradientIsTheReshapedGradient) {
  const Tensor x = random_tensor({3, 4, 2}, 1);
  const Tensor dy = random_tensor({6, 4}, 2);
  auto f = [](const TensorList& xs) { return xs[0].view({6, 4}); };
  EXPECT_TRUE(gradients_match(f, {x}, dy, {dy.view({3, 4, 2})}));
  // reshape of a strided view copies; its gradient is still the reshaped gradient, transposed back.
  auto g = [](const TensorList& xs) { return xs[0].transpose(0, 1).reshape({4, 6}); };
  const Tensor dz = random_tensor({4, 6}, 3);
  EXPECT_TRUE(gradients_match(g, {x}, dz, {dz.view({4, 3, 2}).transpose(0, 1)}));
}

}  // namespace
}  // namespace strata
