// CUDA parity of the loss group: embedding, cross-entropy, top-k accuracy, optimizer updates,
// sum_of_squares and gradient clipping, against the CPU reference ops on the same inputs. Skipped
// where there is no CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ops/accuracy.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/optimizer.h"
#include "testing/cuda_parity.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::identical;
using testing::parity;
using testing::parity_bound;
using testing::Precision;
using testing::random_f32;
using testing::random_ids;
using testing::random_tensor;
using testing::to_device;
using testing::to_host;

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

// The 16-bit dtypes with their parity bounds.
struct HalfCase {
  DType dtype;
  Precision precision;
  const char* name;
};
const HalfCase kHalfCases[] = {{DType::kBF16, Precision::kBF16, "bf16"},
                               {DType::kF16, Precision::kF16, "f16"}};

// x rounded to `dtype` and back to f32 (the CPU reference's view of a 16-bit tensor).
Tensor rounded(const Tensor& x, DType dtype) { return x.to(dtype).to(DType::kF32); }

// Targets in [0, v) with every `every`-th row (from row 1) set to `ignore` (every = 0: none).
Tensor targets_with_ignored(int64_t n, int64_t v, int64_t ignore, int64_t every, uint64_t seed,
                            DType dtype = DType::kI64) {
  std::vector<int64_t> t = random_ids({n}, v, seed).to_vector<int64_t>();
  if (every > 0) {
    for (int64_t i = 1; i < n; i += every) t[static_cast<size_t>(i)] = ignore;
  }
  return Tensor::from_vector(t, {n}).to(dtype);
}

std::string ce_what(const char* what, int64_t n, int64_t v, const ops::CrossEntropyOptions& o) {
  return std::string(what) + " N=" + std::to_string(n) + " V=" + std::to_string(v) +
         " eps=" + std::to_string(o.label_smoothing) + " norm=" + std::to_string(o.normalizer);
}

// ---- cross-entropy -----------------------------------------------------------------------------

TEST(CudaCrossEntropy, MatchesCpuInF32AcrossShapesAndOptions) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {7, 10}, {1003, 37}, {33, 1003}, {16, 4099}, {9, 20001}, {4, 50257}, {2, 70001}};
  std::vector<ops::CrossEntropyOptions> options(4);
  options[1].label_smoothing = 0.1;
  options[2].ignore_index = 3;
  options[2].label_smoothing = 0.05;
  options[3].normalizer = 123.0;
  uint64_t seed = 100;
  for (const auto& [n, v] : shapes) {
    for (const ops::CrossEntropyOptions& o : options) {
      const Tensor logits = random_f32({n, v}, ++seed, -4.0, 4.0);
      const DType id_type = seed % 2 ? DType::kI32 : DType::kI64;
      const Tensor targets =
          targets_with_ignored(n, v, o.ignore_index, o.ignore_index == 3 ? 3 : 0, ++seed, id_type);
      const Tensor x_gpu = to_device(logits, gpu), t_gpu = to_device(targets, gpu);
      const Tensor loss_ref = ops::cross_entropy_forward(cpu, logits, targets, o);
      const Tensor loss = ops::cross_entropy_forward(gpu, x_gpu, t_gpu, o);
      EXPECT_TRUE(
          parity(gpu, loss, loss_ref, parity_bound(Precision::kF32), ce_what("loss", n, v, o)));
      const Tensor dx_ref = ops::cross_entropy_backward(cpu, logits, targets, o, 2.5);
      const Tensor dx = ops::cross_entropy_backward(gpu, x_gpu, t_gpu, o, 2.5);
      EXPECT_TRUE(
          parity(gpu, dx, dx_ref, parity_bound(Precision::kF32), ce_what("dlogits", n, v, o)));
    }
  }
}

TEST(CudaCrossEntropy, IgnoredRowsAndAllIgnored) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  ops::CrossEntropyOptions o;  // ignore_index -100
  const int64_t n = 50, v = 300;
  const Tensor logits = random_f32({n, v}, 7, -3.0, 3.0);
  // Every other row ignored: ignored rows of dlogits must be exactly 0.
  const Tensor some = targets_with_ignored(n, v, o.ignore_index, 2, 8);
  const Tensor dx =
      ops::cross_entropy_backward(gpu, to_device(logits, gpu), to_device(some, gpu), o, 1.0);
  const Tensor dx_ref = ops::cross_entropy_backward(cpu, logits, some, o, 1.0);
  EXPECT_TRUE(parity(gpu, dx, dx_ref, parity_bound(Precision::kF32), "dlogits, half ignored"));
  const std::vector<float> dxh = to_host(dx, gpu).to_vector<float>();
  for (int64_t i = 1; i < n; i += 2) {
    for (int64_t j = 0; j < v; ++j) ASSERT_EQ(dxh[static_cast<size_t>(i * v + j)], 0.0f);
  }
  // Every row ignored: loss 0 and zero gradient (normalizer 0).
  const Tensor none = Tensor::from_vector(std::vector<int64_t>(n, -100), {n});
  const Tensor loss =
      ops::cross_entropy_forward(gpu, to_device(logits, gpu), to_device(none, gpu), o);
  EXPECT_EQ(to_host(loss, gpu).item<double>(), 0.0);
  const Tensor dx0 =
      ops::cross_entropy_backward(gpu, to_device(logits, gpu), to_device(none, gpu), o, 1.0);
  for (float g : to_host(dx0, gpu).to_vector<float>()) ASSERT_EQ(g, 0.0f);
  // No rows at all.
  const Tensor empty_loss =
      ops::cross_entropy_forward(gpu, to_device(Tensor::zeros({0, 5}), gpu),
                                 to_device(Tensor::zeros({0}, DType::kI64), gpu), o);
  EXPECT_EQ(to_host(empty_loss, gpu).item<double>(), 0.0);
}

TEST(CudaCrossEntropy, MisalignedRowsOfAView) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  // Rows of 1001 logits starting one row into a buffer: the rows of logits and of dlogits are
  // aligned differently, which takes the scalar path of the backward's writes.
  const int64_t n = 21, v = 1001;
  const Tensor full = random_f32({n + 1, v}, 11, -2.0, 2.0);
  const Tensor logits = full.narrow(0, 1, n);
  const Tensor targets = random_ids({n}, v, 12);
  ops::CrossEntropyOptions o;
  o.label_smoothing = 0.2;
  const Tensor x_gpu = to_device(full, gpu).narrow(0, 1, n), t_gpu = to_device(targets, gpu);
  EXPECT_TRUE(parity(gpu, ops::cross_entropy_forward(gpu, x_gpu, t_gpu, o),
                     ops::cross_entropy_forward(cpu, logits.contiguous(), targets, o),
                     parity_bound(Precision::kF32), "loss of a view"));
  EXPECT_TRUE(parity(gpu, ops::cross_entropy_backward(gpu, x_gpu, t_gpu, o, 1.0),
                     ops::cross_entropy_backward(cpu, logits.contiguous(), targets, o, 1.0),
                     parity_bound(Precision::kF32), "dlogits of a view"));
}

TEST(CudaCrossEntropy, HalfPrecisionLogits) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{7, 10}, {129, 1003}, {8, 50257}};
  for (const HalfCase& h : kHalfCases) {
    uint64_t seed = 300;
    for (const auto& [n, v] : shapes) {
      for (double eps : {0.0, 0.1}) {
        ops::CrossEntropyOptions o;
        o.label_smoothing = eps;
        const Tensor logits = random_f32({n, v}, ++seed, -4.0, 4.0);
        const Tensor targets = targets_with_ignored(n, v, o.ignore_index, 4, ++seed);
        const Tensor x_ref = rounded(logits, h.dtype);
        const Tensor x_gpu = to_device(logits.to(h.dtype), gpu), t_gpu = to_device(targets, gpu);
        const Tensor loss = ops::cross_entropy_forward(gpu, x_gpu, t_gpu, o);
        EXPECT_EQ(loss.dtype(), DType::kF32);  // the loss is not rounded to 16 bits
        EXPECT_TRUE(parity(gpu, loss, ops::cross_entropy_forward(cpu, x_ref, targets, o),
                           parity_bound(Precision::kF32), std::string(h.name) + " loss"));
        const Tensor dx = ops::cross_entropy_backward(gpu, x_gpu, t_gpu, o, 1.0);
        EXPECT_EQ(dx.dtype(), h.dtype);
        EXPECT_TRUE(parity(gpu, dx, ops::cross_entropy_backward(cpu, x_ref, targets, o, 1.0),
                           parity_bound(h.precision), std::string(h.name) + " dlogits"));
      }
    }
  }
}

TEST(CudaCrossEntropy, CountTargetsOfDeviceTargets) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const Tensor targets = targets_with_ignored(1003, 50, -100, 3, 21, DType::kI32);
  EXPECT_EQ(ops::count_targets(to_device(targets, gpu), -100), ops::count_targets(targets, -100));
}

TEST(CudaCrossEntropy, BadInputsNameOpAndTensor) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const Tensor targets = to_device(random_ids({4}, 5, 1), gpu);
  const ops::CrossEntropyOptions o;
  expect_error(
      [&] {
        ops::cross_entropy_forward(gpu, to_device(random_tensor({4, 5}, 2), gpu), targets, o);
      },
      {"cross_entropy_forward", "logits", "f64"});
  expect_error(
      [&] {
        ops::cross_entropy_backward(gpu, to_device(random_f32({4, 5}, 2), gpu),
                                    to_device(random_ids({3}, 5, 1), gpu), o, 1.0);
      },
      {"cross_entropy_backward", "targets", "(3)", "(4)"});
  expect_error(
      [&] {
        ops::cross_entropy_forward(gpu, to_device(random_f32({4, 5}, 2), gpu),
                                   to_device(random_f32({4}, 1), gpu), o);
      },
      {"cross_entropy_forward", "targets", "i32 or i64"});
  expect_error(
      [&] {
        ops::cross_entropy_forward(gpu, random_f32({4, 5}, 2), targets, o);
      },
      {"cross_entropy_forward", "logits", "cpu"});
}

// ---- embedding ---------------------------------------------------------------------------------

TEST(CudaEmbedding, ForwardCopiesRowsForEveryWidthAndIdType) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 500;
  for (int64_t c : {1, 2, 3, 4, 7, 8, 1003, 1024}) {
    for (DType id_type : {DType::kI32, DType::kI64}) {
      const int64_t vocab = 37;
      const Tensor weight = random_f32({vocab, c}, ++seed);
      const Tensor ids = random_ids({5, 7}, vocab, ++seed, id_type);
      const Tensor y = ops::embedding_forward(gpu, to_device(ids, gpu), to_device(weight, gpu));
      EXPECT_TRUE(identical(gpu, y, ops::embedding_forward(cpu, ids, weight),
                            "f32 forward C=" + std::to_string(c)));
      for (const HalfCase& h : kHalfCases) {
        const Tensor yh =
            ops::embedding_forward(gpu, to_device(ids, gpu), to_device(weight.to(h.dtype), gpu));
        EXPECT_EQ(yh.dtype(), h.dtype);
        EXPECT_TRUE(identical(
            gpu, yh, ops::embedding_forward(cpu, ids, rounded(weight, h.dtype)).to(h.dtype),
            std::string(h.name) + " forward C=" + std::to_string(c)));
      }
    }
  }
  // A weight view one row into a buffer (rows not 16-byte aligned), and no ids at all.
  const Tensor full = random_f32({11, 5}, 1);
  const Tensor ids = random_ids({9}, 10, 2);
  EXPECT_TRUE(identical(
      gpu, ops::embedding_forward(gpu, to_device(ids, gpu), to_device(full, gpu).narrow(0, 1, 10)),
      ops::embedding_forward(cpu, ids, full.narrow(0, 1, 10).contiguous()), "weight view"));
  const Tensor none = ops::embedding_forward(gpu, to_device(Tensor::zeros({0}, DType::kI64), gpu),
                                             to_device(full, gpu));
  EXPECT_EQ(none.shape(), (Shape{0, 5}));
}

TEST(CudaEmbedding, BackwardAccumulatesRepeatedIdsIntoPrefilledGradient) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 600;
  // (n ids, V, C): few distinct ids (long runs), many ids, odd widths, one id only.
  const std::vector<std::vector<int64_t>> cases = {
      {1, 1, 1}, {7, 3, 7}, {1003, 5, 33}, {4096, 1000, 768}, {2000, 50257, 17}, {3000, 1, 300}};
  for (const auto& cs : cases) {
    const int64_t n = cs[0], vocab = cs[1], c = cs[2];
    for (DType id_type : {DType::kI32, DType::kI64}) {
      const Tensor ids = random_ids({n}, vocab, ++seed, id_type);
      const Tensor dy = random_f32({n, c}, ++seed);
      const Tensor dw_cpu = random_f32({vocab, c}, ++seed);
      const Tensor dw_gpu = to_device(dw_cpu, gpu);
      ops::embedding_backward(cpu, dy, ids, dw_cpu);
      ops::embedding_backward(gpu, to_device(dy, gpu), to_device(ids, gpu), dw_gpu);
      const std::string what = "dweight n=" + std::to_string(n) + " V=" + std::to_string(vocab) +
                               " C=" + std::to_string(c);
      EXPECT_TRUE(parity(gpu, dw_gpu, dw_cpu, parity_bound(Precision::kF32), what));
    }
  }
}

TEST(CudaEmbedding, BackwardIsDeterministicAndTakesIdsOfAnyShape) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const int64_t vocab = 50, c = 129;
  const Tensor ids = random_ids({8, 250}, vocab, 1);
  const Tensor dy = random_f32({8, 250, c}, 2);
  const Tensor ids_gpu = to_device(ids, gpu), dy_gpu = to_device(dy, gpu);
  const Tensor a = to_device(Tensor::zeros({vocab, c}), gpu);
  const Tensor b = to_device(Tensor::zeros({vocab, c}), gpu);
  ops::embedding_backward(gpu, dy_gpu, ids_gpu, a);
  ops::embedding_backward(gpu, dy_gpu, ids_gpu, b);
  EXPECT_TRUE(identical(gpu, a, to_host(b, gpu), "two runs"));
  // Twice into the same gradient doubles it.
  ops::embedding_backward(gpu, dy_gpu, ids_gpu, a);
  const Tensor ref = Tensor::zeros({vocab, c});
  ops::embedding_backward(cpu, dy, ids, ref);
  ops::embedding_backward(cpu, dy, ids, ref);
  EXPECT_TRUE(parity(gpu, a, ref, parity_bound(Precision::kF32), "accumulated twice"));
}

TEST(CudaEmbedding, BackwardInHalfPrecision) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const int64_t n = 2000, vocab = 40, c = 72;
  for (const HalfCase& h : kHalfCases) {
    const Tensor ids = random_ids({n}, vocab, 3);
    const Tensor dy = random_f32({n, c}, 4);
    const Tensor dw0 = random_f32({vocab, c}, 5, -4.0, 4.0);
    const Tensor dw_gpu = to_device(dw0.to(h.dtype), gpu);
    ops::embedding_backward(gpu, to_device(dy.to(h.dtype), gpu), to_device(ids, gpu), dw_gpu);
    const Tensor ref = rounded(dw0, h.dtype);
    ops::embedding_backward(cpu, rounded(dy, h.dtype), ids, ref);
    EXPECT_TRUE(parity(gpu, dw_gpu, ref, parity_bound(h.precision), h.name));
  }
}

TEST(CudaEmbedding, BadInputsNameOpAndTensor) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const Tensor ids = to_device(random_ids({4}, 5, 1), gpu);
  expect_error(
      [&] {
        ops::embedding_forward(gpu, ids, to_device(random_tensor({5, 3}, 2), gpu));
      },
      {"embedding_forward", "weight", "f64"});
  expect_error(
      [&] {
        ops::embedding_forward(gpu, to_device(random_f32({4}, 1), gpu),
                               to_device(random_f32({5, 3}, 2), gpu));
      },
      {"embedding_forward", "ids", "i32 or i64"});
  expect_error(
      [&] {
        ops::embedding_backward(gpu, to_device(random_f32({4, 2}, 2), gpu), ids,
                                to_device(Tensor::zeros({5, 3}), gpu));
      },
      {"embedding_backward", "dy", "(4, 2)", "(4, 3)"});
  expect_error(
      [&] {
        ops::embedding_backward(gpu, to_device(random_f32({4, 3}, 2).to(DType::kBF16), gpu), ids,
                                to_device(Tensor::zeros({5, 3}), gpu));
      },
      {"embedding_backward", "dy", "bf16", "dweight", "f32"});
}

// ---- top-k accuracy ----------------------------------------------------------------------------

// Logits on a coarse grid (many ties), with NaN at some places (targets included).
Tensor tied_logits(int64_t n, int64_t c, uint64_t seed, bool with_nan) {
  Tensor x = random_f32({n, c}, seed, -1.0, 1.0);
  float* p = x.data<float>();
  for (int64_t i = 0; i < n * c; ++i) p[i] = std::round(p[i] * 4.0f) / 4.0f;
  if (with_nan) {
    for (int64_t i = 0; i < n * c; i += 7) p[i] = std::numeric_limits<float>::quiet_NaN();
  }
  return x;
}

TEST(CudaAccuracy, TopkMatchesCpuWithTiesNanAndIgnoredRows) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {7, 10}, {1003, 37}, {64, 5003}, {3, 50257}};
  uint64_t seed = 700;
  for (const auto& [n, c] : shapes) {
    for (bool with_nan : {false, true}) {
      const Tensor logits = tied_logits(n, c, ++seed, with_nan);
      const Tensor targets = targets_with_ignored(n, c, -1, 5, ++seed, DType::kI32);
      const Tensor x_gpu = to_device(logits, gpu), t_gpu = to_device(targets, gpu);
      for (int64_t k : {int64_t{1}, int64_t{5}, c}) {
        if (k > c) continue;
        EXPECT_EQ(ops::topk_correct(gpu, x_gpu, t_gpu, k, -1),
                  ops::topk_correct(cpu, logits, targets, k, -1))
            << "N=" << n << " C=" << c << " k=" << k << " nan=" << with_nan;
      }
      for (const HalfCase& h : kHalfCases) {
        EXPECT_EQ(ops::topk_correct(gpu, to_device(logits.to(h.dtype), gpu), t_gpu, 1, -1),
                  ops::topk_correct(cpu, rounded(logits, h.dtype), targets, 1, -1))
            << h.name << " N=" << n << " C=" << c;
      }
    }
  }
}

TEST(CudaAccuracy, BadInputsNameOpAndValue) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const Tensor logits = to_device(random_f32({6, 5}, 1), gpu);
  // An out-of-range target is reported like on the CPU (this op synchronizes anyway).
  const Tensor bad =
      to_device(Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 9, 4, 7}, {6}), gpu);
  expect_error([&] { ops::topk_correct(gpu, logits, bad, 1, -100); },
               {"topk_correct", "targets[3] = 9", "C = 5"});
  const Tensor targets = to_device(random_ids({6}, 5, 2), gpu);
  expect_error([&] { ops::topk_correct(gpu, logits, targets, 6, -100); },
               {"topk_correct", "k = 6"});
  expect_error(
      [&] {
        ops::topk_correct(gpu, to_device(random_tensor({6, 5}, 3), gpu), targets, 1, -100);
      },
      {"topk_correct", "logits", "f64"});
  // The context is still usable after the errors.
  EXPECT_EQ(ops::topk_correct(gpu, logits, targets, 5, -100), 6);
}

// ---- optimizer ---------------------------------------------------------------------------------

// Flat f32 tensors of n elements; `offset` > 0 makes them views one element into a buffer (not
// 16-byte aligned: the scalar path).
struct Flat {
  Tensor cpu, gpu;
};
Flat flat(int64_t n, uint64_t seed, ExecContext& gpu, int64_t offset, double lo = -1.0,
          double hi = 1.0) {
  const Tensor full = random_f32({n + offset}, seed, lo, hi);
  return Flat{full.narrow(0, offset, n).contiguous(), to_device(full, gpu).narrow(0, offset, n)};
}

TEST(CudaOptimizer, SgdFiveStepsMatchCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  std::vector<ops::SgdOptions> options(4);
  options[0].lr = 0.1;
  options[1].lr = 0.05;
  options[1].momentum = 0.9;
  options[1].weight_decay = 1e-2;
  options[2].lr = 0.05;
  options[2].momentum = 0.8;
  options[2].dampening = 0.3;
  options[3].lr = 0.02;
  options[3].momentum = 0.9;
  options[3].nesterov = true;
  options[3].weight_decay = 1e-4;
  uint64_t seed = 800;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1003}, (int64_t{1} << 20) + 3}) {
    for (int64_t offset : {0, 1}) {
      for (const ops::SgdOptions& o : options) {
        Flat p = flat(n, ++seed, gpu, offset);
        const Flat g = flat(n, ++seed, gpu, offset);
        Flat buf = flat(n, ++seed, gpu, offset);  // overwritten on step 1
        const Tensor buf_cpu = o.momentum > 0 ? buf.cpu : Tensor();
        const Tensor buf_gpu = o.momentum > 0 ? buf.gpu : Tensor();
        for (int64_t step = 1; step <= 5; ++step) {
          ops::sgd_step(cpu, p.cpu, g.cpu, buf_cpu, o, step);
          ops::sgd_step(gpu, p.gpu, g.gpu, buf_gpu, o, step);
        }
        const std::string what =
            "sgd n=" + std::to_string(n) + " offset=" + std::to_string(offset) +
            " momentum=" + std::to_string(o.momentum) + (o.nesterov ? " nesterov" : "");
        EXPECT_TRUE(parity(gpu, p.gpu, p.cpu, 1e-5, what + " param"));
        if (o.momentum > 0) {
          EXPECT_TRUE(parity(gpu, buf.gpu, buf.cpu, 1e-5, what + " buf"));
        }
      }
    }
  }
}

TEST(CudaOptimizer, AdamWFiveStepsMatchCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  std::vector<ops::AdamWOptions> options(2);
  options[1].lr = 3e-3;
  options[1].beta1 = 0.8;
  options[1].beta2 = 0.95;
  options[1].eps = 1e-6;
  options[1].weight_decay = 0.1;
  uint64_t seed = 900;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1003}, (int64_t{1} << 20) + 3}) {
    for (int64_t offset : {0, 1}) {
      for (const ops::AdamWOptions& o : options) {
        Flat p = flat(n, ++seed, gpu, offset);
        const Flat g = flat(n, ++seed, gpu, offset);
        Flat m = flat(n, ++seed, gpu, offset, -0.1, 0.1);
        Flat v = flat(n, ++seed, gpu, offset, 0.0, 0.01);
        for (int64_t step = 1; step <= 5; ++step) {
          ops::adamw_step(cpu, p.cpu, g.cpu, m.cpu, v.cpu, o, step);
          ops::adamw_step(gpu, p.gpu, g.gpu, m.gpu, v.gpu, o, step);
        }
        const std::string what = "adamw n=" + std::to_string(n) +
                                 " offset=" + std::to_string(offset) +
                                 " lr=" + std::to_string(o.lr);
        EXPECT_TRUE(parity(gpu, p.gpu, p.cpu, 1e-5, what + " param"));
        EXPECT_TRUE(parity(gpu, m.gpu, m.cpu, 1e-5, what + " m"));
        EXPECT_TRUE(parity(gpu, v.gpu, v.cpu, 1e-5, what + " v"));
      }
    }
  }
}

TEST(CudaOptimizer, SumOfSquaresMatchesCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  uint64_t seed = 1000;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1003}, (int64_t{1} << 22) + 5}) {
    for (int64_t offset : {0, 1}) {
      const Flat t = flat(n, ++seed, gpu, offset, -3.0, 3.0);
      const double ref = ops::sum_of_squares(cpu, t.cpu);
      EXPECT_NEAR(ops::sum_of_squares(gpu, t.gpu), ref, 1e-10 * ref) << "n=" << n;
      for (const HalfCase& h : kHalfCases) {
        const double ref_h = ops::sum_of_squares(cpu, rounded(t.cpu, h.dtype));
        EXPECT_NEAR(ops::sum_of_squares(gpu, to_device(t.cpu.to(h.dtype), gpu)), ref_h,
                    1e-10 * ref_h)
            << h.name << " n=" << n;
      }
    }
  }
  EXPECT_EQ(ops::sum_of_squares(gpu, to_device(Tensor::zeros({0}), gpu)), 0.0);
}

TEST(CudaOptimizer, ClipGradNormScalesDeviceGradients) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  TensorList g_cpu, g_gpu;
  uint64_t seed = 1100;
  for (int64_t n : {int64_t{3}, int64_t{1003}, int64_t{70001}}) {
    const Flat g = flat(n, ++seed, gpu, n % 2, -2.0, 2.0);
    g_cpu.push_back(g.cpu);
    g_gpu.push_back(g.gpu);
  }
  g_cpu.push_back(Tensor());  // a parameter without a gradient
  g_gpu.push_back(Tensor());
  const double norm_ref = ops::clip_grad_norm(cpu, g_cpu, 1.5);
  const double norm = ops::clip_grad_norm(gpu, g_gpu, 1.5);
  EXPECT_NEAR(norm, norm_ref, 1e-10 * norm_ref);
  EXPECT_GT(norm, 1.5);  // it clipped
  for (size_t i = 0; i + 1 < g_cpu.size(); ++i) {
    // The coefficient comes from norms summed in different orders: equal up to rounding.
    EXPECT_TRUE(parity(gpu, g_gpu[i], g_cpu[i], parity_bound(Precision::kF32),
                       "clipped gradient " + std::to_string(i)));
  }
  // Below max_norm nothing changes.
  const double norm2 = ops::clip_grad_norm(gpu, g_gpu, 1e6);
  EXPECT_NEAR(norm2, 1.5, 1e-5);
}

TEST(CudaOptimizer, BadInputsNameOpAndTensor) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const Tensor p = to_device(random_f32({10}, 1), gpu);
  const Tensor g = to_device(random_f32({10}, 2), gpu);
  ops::SgdOptions sgd;
  sgd.momentum = 0.9;
  expect_error([&] { ops::sgd_step(gpu, p, to_device(random_f32({9}, 2), gpu), Tensor(), {}, 1); },
               {"sgd_step", "grad", "(9)", "(10)"});
  expect_error([&] { ops::sgd_step(gpu, p, g, Tensor(), sgd, 1); }, {"sgd_step", "momentum_buf"});
  expect_error(
      [&] {
        ops::sgd_step(gpu, to_device(random_tensor({10}, 1), gpu),
                      to_device(random_tensor({10}, 2), gpu), Tensor(), {}, 1);
      },
      {"sgd_step", "param", "f64"});
  const Tensor m = to_device(Tensor::zeros({10}), gpu), v = to_device(Tensor::zeros({10}), gpu);
  expect_error([&] { ops::adamw_step(gpu, p, g, m, v, {}, 0); }, {"adamw_step", "step"});
  expect_error(
      [&] {
        ops::adamw_step(gpu, p, g, m, to_device(Tensor::zeros({10}).to(DType::kBF16), gpu), {}, 1);
      },
      {"adamw_step", "v", "bf16"});
  expect_error([&] { ops::sum_of_squares(gpu, to_device(random_tensor({10}, 1), gpu)); },
               {"sum_of_squares", "f64"});
}

// A padded vocabulary (CrossEntropyOptions::num_classes): the CUDA kernel reads the counted
// columns with the full row stride and zeroes the padding's gradient; the CPU computes on a copy
// of the counted columns. With and without label smoothing; the padding holds -inf, as the heads
// write it.
TEST(CudaCrossEntropy, PaddedClassesMatchTheCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const int64_t n = 37, v = 300, vp = 384;
  Tensor logits = random_f32({n, vp}, 71, -4.0, 4.0);
  logits.narrow(1, v, vp - v).fill_(-std::numeric_limits<double>::infinity());
  Tensor targets = random_ids({n}, v, 72);
  targets.data<int64_t>()[3] = -100;
  for (const double smoothing : {0.0, 0.1}) {
    SCOPED_TRACE("label smoothing " + std::to_string(smoothing));
    ops::CrossEntropyOptions o;
    o.num_classes = v;
    o.label_smoothing = smoothing;
    const Tensor lg = to_device(logits, gpu), tg = to_device(targets, gpu);
    EXPECT_TRUE(parity(gpu, ops::cross_entropy_forward(gpu, lg, tg, o),
                       ops::cross_entropy_forward(cpu, logits, targets, o),
                       parity_bound(Precision::kF32), "loss"));
    const Tensor d_gpu = ops::cross_entropy_backward(gpu, lg, tg, o, 1.0);
    const Tensor d_cpu = ops::cross_entropy_backward(cpu, logits, targets, o, 1.0);
    EXPECT_TRUE(parity(gpu, d_gpu, d_cpu, parity_bound(Precision::kF32), "dlogits"));
    EXPECT_TRUE(identical(gpu, to_host(d_gpu, gpu).narrow(1, v, vp - v).contiguous(),
                          Tensor::zeros({n, vp - v}), "the padding's gradient"));
  }
}

}  // namespace
}  // namespace strata
