#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ops/embedding.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::all_close;
using testing::gradients_match;
using testing::random_ids;
using testing::random_tensor;

// y[i, :] = weight[ids[i], :] with plain loops, as f64.
Tensor naive_embedding(const Tensor& ids, const Tensor& weight) {
  const int64_t c = weight.size(1);
  const std::vector<int64_t> id = ids.to(DType::kI64).to_vector<int64_t>();
  const std::vector<double> w = weight.to_vector<double>();
  std::vector<double> y;
  for (int64_t i : id)
    for (int64_t j = 0; j < c; ++j) y.push_back(w[i * c + j]);
  Shape shape = ids.shape();
  shape.push_back(c);
  return Tensor::from_vector(y, shape);
}

// dweight[ids[i], :] += dy[i, :] with plain loops, as f64 (V, C).
Tensor naive_embedding_backward(const Tensor& dy, const Tensor& ids, int64_t vocab) {
  const int64_t c = dy.size(-1);
  const std::vector<int64_t> id = ids.to(DType::kI64).to_vector<int64_t>();
  const std::vector<double> g = dy.to_vector<double>();
  std::vector<double> dw(vocab * c, 0.0);
  for (size_t i = 0; i < id.size(); ++i)
    for (int64_t j = 0; j < c; ++j) dw[id[i] * c + j] += g[i * c + j];
  return Tensor::from_vector(dw, {vocab, c});
}

// f throws a strata::Error whose message contains every one of `words`.
template <typename F>
::testing::AssertionResult throws_naming(F&& f, const std::vector<std::string>& words) {
  try {
    f();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& w : words) {
      if (message.find(w) == std::string::npos) {
        return ::testing::AssertionFailure() << "message does not name '" << w << "': " << message;
      }
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no strata::Error was thrown";
}

TEST(Embedding, ForwardMatchesNaiveReferenceForI32AndI64Ids) {
  ExecContext ctx;
  Tensor weight = random_tensor({7, 5}, 1);
  for (DType id_type : {DType::kI32, DType::kI64}) {
    Tensor ids = random_ids({2, 3, 4}, 7, 2, id_type);
    Tensor y = ops::embedding_forward(ctx, ids, weight);
    EXPECT_EQ(y.shape(), (Shape{2, 3, 4, 5}));
    EXPECT_TRUE(all_close(y, naive_embedding(ids, weight), 0, 0));
    Tensor y32 = ops::embedding_forward(ctx, ids, weight.to(DType::kF32));
    EXPECT_EQ(y32.dtype(), DType::kF32);
    EXPECT_TRUE(all_close(y32, naive_embedding(ids, weight), 1e-7, 1e-7));
  }
  // A 0-d id gives a single (C,) row.
  Tensor one = Tensor::from_vector(std::vector<int64_t>{3}, {});
  EXPECT_TRUE(
      all_close(ops::embedding_forward(ctx, one, weight), naive_embedding(one, weight), 0, 0));
}

TEST(Embedding, FiniteDifferenceGradient) {
  ExecContext ctx;
  Tensor weight = random_tensor({4, 3}, 1);
  Tensor ids = random_ids({3, 5}, 4, 2);  // 15 ids over 4 rows: repeats are certain
  Tensor dy = random_tensor({3, 5, 3}, 3);
  Tensor dweight = Tensor::zeros(weight.shape(), DType::kF64);
  ops::embedding_backward(ctx, dy, ids, dweight);
  auto f = [&](const TensorList& xs) { return ops::embedding_forward(ctx, ids, xs[0]); };
  EXPECT_TRUE(gradients_match(f, {weight}, dy, {dweight}));
}

TEST(Embedding, RepeatedIdsAddUpOnTheThreadedPath) {
  ExecContext ctx;
  const int64_t vocab = 10, c = 256;  // enough columns for the column-parallel path
  Tensor ids = random_ids({8, 16}, vocab, 4, DType::kI32);
  Tensor weight = random_tensor({vocab, c}, 6, -1.0, 1.0, DType::kF32);
  EXPECT_TRUE(
      all_close(ops::embedding_forward(ctx, ids, weight), naive_embedding(ids, weight), 0, 0));
  Tensor dy = random_tensor({8, 16, c}, 5, -1.0, 1.0, DType::kF32);
  Tensor dweight = Tensor::zeros({vocab, c}, DType::kF32);
  ops::embedding_backward(ctx, dy, ids, dweight);
  EXPECT_TRUE(all_close(dweight, naive_embedding_backward(dy, ids, vocab), 1e-5, 1e-5));
  Tensor counts = Tensor::zeros({3, 2}, DType::kF64);
  ops::embedding_backward(ctx, Tensor::full({3, 2}, 1.0, DType::kF64),
                          Tensor::from_vector(std::vector<int32_t>{1, 1, 1}, {3}), counts);
  EXPECT_EQ(counts.to_vector<double>(), (std::vector<double>{0, 0, 3, 3, 0, 0}));
}

TEST(Embedding, ParameterGradientAccumulates) {
  ExecContext ctx;
  Tensor ids = random_ids({2, 6}, 5, 1);
  Tensor dy = random_tensor({2, 6, 4}, 2);
  Tensor dweight = Tensor::zeros({5, 4}, DType::kF64);
  ops::embedding_backward(ctx, dy, ids, dweight);
  const std::vector<double> once = dweight.to_vector<double>();
  ops::embedding_backward(ctx, dy, ids, dweight);
  const std::vector<double> twice = dweight.to_vector<double>();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_DOUBLE_EQ(twice[i], 2 * once[i]);
}

TEST(Embedding, OutOfRangeIdNamesValuePositionAndVocabulary) {
  ExecContext ctx;
  Tensor weight = random_tensor({5, 2}, 1);
  Tensor ids = Tensor::from_vector(std::vector<int32_t>{0, 4, 7, 1}, {2, 2});
  EXPECT_TRUE(throws_naming([&] { ops::embedding_forward(ctx, ids, weight); },
                            {"embedding_forward: id 7 ", "position 2 of ids", "V = 5"}));
  Tensor negative = Tensor::from_vector(std::vector<int64_t>{2, -1}, {2});
  EXPECT_TRUE(throws_naming([&] { ops::embedding_forward(ctx, negative, weight); },
                            {"embedding_forward: id -1 ", "position 1", "V = 5"}));
  Tensor dweight = Tensor::zeros({5, 2}, DType::kF64);
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::embedding_backward(ctx, random_tensor({2, 2, 2}, 2), ids, dweight);
      },
      {"embedding_backward: id 7 ", "position 2 of ids", "V = 5"}));
  for (double e : dweight.to_vector<double>()) EXPECT_EQ(e, 0.0);  // nothing written
}

TEST(Embedding, BadInputsNameOpAndTensor) {
  ExecContext ctx;
  Tensor weight = random_tensor({5, 2}, 1);
  Tensor ids = Tensor::from_vector(std::vector<int64_t>{0, 1, 2}, {3});
  EXPECT_TRUE(throws_naming([&] { ops::embedding_forward(ctx, random_tensor({3}, 2), weight); },
                            {"embedding_forward: ids "}));
  EXPECT_TRUE(throws_naming([&] { ops::embedding_forward(ctx, ids, random_tensor({10}, 2)); },
                            {"embedding_forward: weight "}));
  Tensor dweight = Tensor::zeros({5, 2}, DType::kF64);
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::embedding_backward(ctx, random_tensor({3, 3}, 2), ids, dweight);
      },
      {"embedding_backward: dy "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::embedding_backward(ctx, random_tensor({3, 2}, 2, -1, 1, DType::kF32), ids, dweight);
      },
      {"embedding_backward: dy ", "but dweight is"}));
}

}  // namespace
}  // namespace strata
