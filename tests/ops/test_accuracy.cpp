#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "ops/accuracy.h"
#include "testing/testing.h"

namespace strata {
namespace {

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

// Naive reference: a stable descending sort of each row's class indices (no NaN in the inputs
// here), then whether the target is among the first k.
int64_t naive_topk_correct(const Tensor& logits, const Tensor& targets, int64_t k, int64_t ignore) {
  const int64_t n = logits.size(0), c = logits.size(1);
  const std::vector<double> x = logits.to_vector<double>();
  const std::vector<int64_t> t = targets.to_vector<int64_t>();
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == ignore) continue;
    std::vector<int64_t> order(static_cast<size_t>(c));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return x[i * c + a] > x[i * c + b]; });
    if (std::find(order.begin(), order.begin() + k, t[i]) != order.begin() + k) ++correct;
  }
  return correct;
}

TEST(TopkCorrect, MatchesStableSortWithManyTies) {
  ExecContext ctx;
  // Integer-valued logits in [0, 4): ties in almost every row.
  std::vector<double> v = random_tensor({50, 8}, 1, 0, 4).to_vector<double>();
  for (double& x : v) x = std::floor(x);
  const Tensor logits = Tensor::from_vector(v, {50, 8});
  std::vector<int64_t> t = random_ids({50}, 8, 2).to_vector<int64_t>();
  for (size_t i = 0; i < t.size(); i += 7) t[i] = -1;
  const Tensor targets = Tensor::from_vector(t, {50});
  for (int64_t k = 1; k <= 8; ++k) {
    const int64_t ref = naive_topk_correct(logits, targets, k, -1);
    EXPECT_EQ(ops::topk_correct(ctx, logits, targets, k, -1), ref) << "k " << k;
    EXPECT_EQ(ops::topk_correct(ctx, logits.to(DType::kF32), targets.to(DType::kI32), k, -1), ref)
        << "k " << k;
  }
  EXPECT_EQ(ops::topk_correct(ctx, logits, targets, 8, -1), 50 - 8);  // every counted row
}

TEST(TopkCorrect, HandCheckedTieRule) {
  ExecContext ctx;
  // Classes 1 and 2 tie at the top: class 1 ranks first (smaller index).
  const Tensor logits = Tensor::from_vector(std::vector<double>{1, 2, 2, 0}, {1, 4});
  auto count = [&](int64_t target, int64_t k) {
    return ops::topk_correct(ctx, logits, Tensor::from_vector(std::vector<int64_t>{target}, {1}),
                             k);
  };
  EXPECT_EQ(count(1, 1), 1);
  EXPECT_EQ(count(2, 1), 0);
  EXPECT_EQ(count(2, 2), 1);
  EXPECT_EQ(count(0, 2), 0);
  EXPECT_EQ(count(0, 3), 1);
  EXPECT_EQ(count(3, 3), 0);
  EXPECT_EQ(count(3, 4), 1);
  EXPECT_EQ(count(-100, 4), 0);  // ignored
}

TEST(TopkCorrect, NaNRanksAboveEveryNumber) {
  ExecContext ctx;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor logits = Tensor::from_vector(std::vector<double>{nan, 5, 1, nan}, {1, 4});
  auto count = [&](int64_t target, int64_t k) {
    return ops::topk_correct(ctx, logits, Tensor::from_vector(std::vector<int64_t>{target}, {1}),
                             k);
  };
  EXPECT_EQ(count(0, 1), 1);
  EXPECT_EQ(count(3, 1), 0);
  EXPECT_EQ(count(3, 2), 1);
  EXPECT_EQ(count(1, 2), 0);
  EXPECT_EQ(count(1, 3), 1);
}

TEST(TopkCorrect, LargeBatchTakesTheParallelPath) {
  ExecContext ctx;
  const Tensor logits = random_tensor({200, 300}, 1);
  const Tensor targets = random_ids({200}, 300, 2);
  for (int64_t k : {1, 5, 150}) {
    EXPECT_EQ(ops::topk_correct(ctx, logits, targets, k),
              naive_topk_correct(logits, targets, k, -100))
        << "k " << k;
  }
}

TEST(TopkCorrect, RejectsBadArguments) {
  ExecContext ctx;
  const Tensor logits = random_tensor({3, 4}, 1);
  const Tensor targets = Tensor::from_vector(std::vector<int64_t>{0, 1, 2}, {3});
  expect_error([&] { ops::topk_correct(ctx, logits, targets, 0); }, {"topk_correct", "k = 0"});
  expect_error([&] { ops::topk_correct(ctx, logits, targets, 5); },
               {"topk_correct", "k = 5", "C = 4"});
  expect_error(
      [&] {
        ops::topk_correct(ctx, logits, Tensor::from_vector(std::vector<int64_t>{0, 4, 1}, {3}), 1);
      },
      {"topk_correct", "targets[1] = 4", "C = 4"});
  expect_error([&] { ops::topk_correct(ctx, logits, Tensor::zeros({2}, DType::kI64), 1); },
               {"topk_correct", "targets has shape (2,)"});
  expect_error([&] { ops::topk_correct(ctx, random_tensor({12}, 1), targets, 1); },
               {"topk_correct", "logits must be (N, C)"});
}

}  // namespace
}  // namespace strata
