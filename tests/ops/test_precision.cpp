// Mixed-precision conversions (ops/precision.h) and 16-bit tensors through the CPU kernels (the
// widening of ops/dispatch.cpp): the CPU is the reference of the 16-bit paths, so its results
// must be "the f32 kernel on the 16-bit inputs, rounded once". CUDA: the same conversions, bit
// for bit (skipped without a device).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "engine/dtype.h"
#include "ops/batch_norm.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/layer_norm.h"
#include "ops/matmul.h"
#include "ops/precision.h"
#include "testing/cuda_parity.h"

namespace strata::ops {
namespace {

using testing::identical;
using testing::random_f32;
using testing::to_device;
using testing::to_host;

// Values over every range a conversion must handle: small, large (f16 overflows above 65504),
// signed zeros, infinities and (optionally: it never compares equal) NaN.
Tensor awkward_values(bool nan = true) {
  Tensor t = random_f32({4096}, 7, -3.0, 3.0);
  float* p = t.data<float>();
  for (int64_t i = 0; i < 256; ++i) p[i] *= std::ldexp(1.0f, static_cast<int>(i % 40) - 20);
  p[300] = 70000.0f;
  p[301] = -1e30f;
  p[302] = -0.0f;
  p[303] = std::numeric_limits<float>::infinity();
  p[304] = nan ? std::numeric_limits<float>::quiet_NaN() : 1.0f;
  p[305] = 65504.0f;
  p[306] = 1e-8f;  // below f16's smallest subnormal: 0
  return t;
}

TEST(Precision, CastCopyRoundsLikeTheScalarConversions) {
  ExecContext ctx(Device::cpu());
  const Tensor x = awkward_values();
  const float* px = x.data<float>();
  const Tensor b = cast(ctx, x, DType::kBF16);
  const Tensor h = cast(ctx, x, DType::kF16);
  ASSERT_EQ(b.dtype(), DType::kBF16);
  ASSERT_EQ(h.dtype(), DType::kF16);
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(b.data<BFloat16>()[i].bits, float_to_bf16(px[i]).bits) << "bf16 at " << i;
    ASSERT_EQ(h.data<Half>()[i].bits, float_to_half(px[i]).bits) << "f16 at " << i;
  }
  EXPECT_TRUE(std::isinf(half_to_float(h.data<Half>()[300])));  // 70000 > f16's largest
  EXPECT_EQ(half_to_float(h.data<Half>()[305]), 65504.0f);
  EXPECT_TRUE(std::isnan(bf16_to_float(b.data<BFloat16>()[304])));
  // Back to f32: exact.
  const Tensor back = cast(ctx, b, DType::kF32);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = bf16_to_float(b.data<BFloat16>()[i]);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(back.data<float>()[i]));
    } else {
      ASSERT_EQ(back.data<float>()[i], v) << i;
    }
  }
  // cast of a tensor already in the dtype is that tensor.
  EXPECT_TRUE(cast(ctx, b, DType::kBF16).shares_storage(b));
  EXPECT_THROW(cast_copy_(ctx, Tensor::empty({3}, DType::kBF16), x), Error);  // sizes differ
  EXPECT_THROW(cast_copy_(ctx, Tensor::empty({4096}, DType::kI32), x), Error);
}

TEST(Precision, MoveAddAddsInF32AndClearsTheSource) {
  ExecContext ctx(Device::cpu());
  const Tensor master = random_f32({1000}, 1, -2.0, 2.0);
  const Tensor before = master.clone();
  for (DType d : {DType::kBF16, DType::kF16}) {
    const Tensor work = cast(ctx, random_f32({1000}, 2, -0.01, 0.01), d);
    const std::vector<double> w = work.to_vector<double>();
    master.copy_from(before);
    move_add_(ctx, master, work);
    for (int64_t i = 0; i < 1000; ++i) {
      const float expect = before.data<float>()[i] + static_cast<float>(w[i]);
      ASSERT_EQ(master.data<float>()[i], expect) << dtype_name(d) << " at " << i;
    }
    for (double v : work.to_vector<double>()) ASSERT_EQ(v, 0.0);
  }
  // Overlapping ranges of one buffer are refused.
  const Tensor flat = Tensor::zeros({100});
  EXPECT_THROW(move_add_(ctx, flat.narrow(0, 0, 60), flat.narrow(0, 40, 60)), Error);
  move_add_(ctx, flat.narrow(0, 0, 50), flat.narrow(0, 50, 50));  // adjacent: fine
}

// The f32 kernel on the (rounded) 16-bit inputs, its result rounded: what the CPU must give.
Tensor rounded(const Tensor& x, DType d) { return x.to(d).to(DType::kF32); }

TEST(Precision, CpuKernelsTake16BitTensors) {
  ExecContext ctx(Device::cpu());
  for (DType d : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(d));
    const Tensor x = random_f32({6, 10}, 11), w = random_f32({7, 10}, 12), b = random_f32({7}, 13);
    const Tensor y = linear_forward(ctx, x.to(d), w.to(d), b.to(d));
    ASSERT_EQ(y.dtype(), d);
    const Tensor y_ref = linear_forward(ctx, rounded(x, d), rounded(w, d), rounded(b, d)).to(d);
    EXPECT_TRUE(identical(ctx, y, y_ref, "linear_forward"));

    // In-place accumulation into 16-bit gradients reaches the 16-bit tensors.
    const Tensor dy = random_f32({6, 7}, 14);
    const Tensor dw = random_f32({7, 10}, 15).to(d), db = random_f32({7}, 16).to(d);
    const Tensor dw_ref = dw.to(DType::kF32), db_ref = db.to(DType::kF32);
    const Tensor dx = linear_backward(ctx, dy.to(d), x.to(d), w.to(d), dw, db, true);
    const Tensor dx_ref =
        linear_backward(ctx, rounded(dy, d), rounded(x, d), rounded(w, d), dw_ref, db_ref, true);
    EXPECT_EQ(dx.dtype(), d);
    EXPECT_TRUE(identical(ctx, dx, dx_ref.to(d), "dx"));
    EXPECT_TRUE(identical(ctx, dw, dw_ref.to(d), "dweight accumulated"));
    EXPECT_TRUE(identical(ctx, db, db_ref.to(d), "dbias accumulated"));

    // The same tensor as two arguments: one copy, so dst += dst doubles it.
    const Tensor t = random_f32({33}, 17).to(d);
    const std::vector<double> t0 = t.to_vector<double>();
    add_(ctx, t, t, 1.0);
    const std::vector<double> t1 = t.to_vector<double>();
    for (size_t i = 0; i < t0.size(); ++i) ASSERT_EQ(t1[i], 2.0 * t0[i]) << i;

    // Cross-entropy of 16-bit logits: the loss stays f32, dlogits are 16-bit.
    const Tensor logits = random_f32({5, 9}, 18, -3.0, 3.0);
    const Tensor targets = Tensor::zeros({5}, DType::kI64);
    CrossEntropyOptions o;
    const Tensor loss = cross_entropy_forward(ctx, logits.to(d), targets, o);
    EXPECT_EQ(loss.dtype(), DType::kF32);
    EXPECT_EQ(loss.item<float>(),
              cross_entropy_forward(ctx, rounded(logits, d), targets, o).item<float>());
    EXPECT_EQ(cross_entropy_backward(ctx, logits.to(d), targets, o, 1.0).dtype(), d);
  }
}

// Normalization statistics stay f32 under bf16/f16 (ops/batch_norm.h, ops/layer_norm.h): the
// emulation returns the f32 kernel's statistics of the rounded inputs bit for bit, unrounded,
// updates f32 running statistics in place in f32, and rounds only y and dx.
TEST(Precision, NormalizationStatisticsStayF32) {
  ExecContext ctx(Device::cpu());
  for (DType d : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(d));
    EXPECT_EQ(batch_norm_stat_dtype(d), DType::kF32);
    const Tensor x = random_f32({4, 3, 5}, 21, -2.0, 2.0), g = random_f32({3}, 22, 0.5, 1.5),
                 b = random_f32({3}, 23);
    const Tensor rm = random_f32({3}, 24), rv = random_f32({3}, 25, 0.5, 2.0);
    const Tensor rm_ref = rm.clone(), rv_ref = rv.clone();
    const BatchNormTrainResult r =
        batch_norm_forward_train(ctx, x.to(d), g.to(d), b.to(d), rm, rv, 0.1, 1e-5);
    const BatchNormTrainResult ref = batch_norm_forward_train(
        ctx, rounded(x, d), rounded(g, d), rounded(b, d), rm_ref, rv_ref, 0.1, 1e-5);
    EXPECT_EQ(r.y.dtype(), d);
    EXPECT_TRUE(identical(ctx, r.y, ref.y.to(d), "y"));
    ASSERT_EQ(r.save_mean.dtype(), DType::kF32);
    ASSERT_EQ(r.save_invstd.dtype(), DType::kF32);
    EXPECT_TRUE(identical(ctx, r.save_mean, ref.save_mean, "save_mean"));
    EXPECT_TRUE(identical(ctx, r.save_invstd, ref.save_invstd, "save_invstd"));
    EXPECT_TRUE(identical(ctx, rm, rm_ref, "running_mean"));
    EXPECT_TRUE(identical(ctx, rv, rv_ref, "running_var"));
    bool off_grid = false;  // the f32 statistics are not rounded to 16 bits
    for (float v : rv.to_vector<float>())
      off_grid = off_grid || rounded(Tensor::full({1}, v), d).item<float>() != v;
    EXPECT_TRUE(off_grid);
    // Backward with the f32 statistics; gradients of gamma and beta accumulate in 16 bits.
    const Tensor dy = random_f32({4, 3, 5}, 26);
    const Tensor dg = Tensor::zeros({3}, d), db = Tensor::zeros({3}, d);
    const Tensor dg_ref = Tensor::zeros({3}), db_ref = Tensor::zeros({3});
    const Tensor dx =
        batch_norm_backward(ctx, dy.to(d), x.to(d), g.to(d), r.save_mean, r.save_invstd, dg, db);
    const Tensor dx_ref = batch_norm_backward(ctx, rounded(dy, d), rounded(x, d), rounded(g, d),
                                              ref.save_mean, ref.save_invstd, dg_ref, db_ref);
    EXPECT_TRUE(identical(ctx, dx, dx_ref.to(d), "dx"));
    EXPECT_TRUE(identical(ctx, dg, dg_ref.to(d), "dgamma"));
    EXPECT_TRUE(identical(ctx, db, db_ref.to(d), "dbeta"));
    // Evaluation normalizes with the f32 running statistics.
    EXPECT_TRUE(identical(ctx,
                          batch_norm_forward_eval(ctx, x.to(d), g.to(d), b.to(d), rm, rv, 1e-5),
                          batch_norm_forward_eval(ctx, rounded(x, d), rounded(g, d), rounded(b, d),
                                                  rm_ref, rv_ref, 1e-5)
                              .to(d),
                          "eval y"));
    // 16-bit statistics are refused, naming the dtype they must have.
    try {
      batch_norm_forward_train(ctx, x.to(d), g.to(d), b.to(d), rm.to(d), rv.to(d), 0.1, 1e-5);
      ADD_FAILURE() << "16-bit running statistics accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("running_mean"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("f32"), std::string::npos) << e.what();
    }

    // Layer norm: mean and rstd f32, bit for bit the f32 kernel's; y and dx rounded.
    const Tensor lx = random_f32({6, 16}, 27, -2.0, 2.0), lg = random_f32({16}, 28),
                 lb = random_f32({16}, 29);
    const LayerNormResult l = layer_norm_forward(ctx, lx.to(d), lg.to(d), lb.to(d), 1e-5);
    const LayerNormResult lref =
        layer_norm_forward(ctx, rounded(lx, d), rounded(lg, d), rounded(lb, d), 1e-5);
    ASSERT_EQ(l.mean.dtype(), DType::kF32);
    ASSERT_EQ(l.rstd.dtype(), DType::kF32);
    EXPECT_TRUE(identical(ctx, l.mean, lref.mean, "layer norm mean"));
    EXPECT_TRUE(identical(ctx, l.rstd, lref.rstd, "layer norm rstd"));
    EXPECT_TRUE(identical(ctx, l.y, lref.y.to(d), "layer norm y"));
    const Tensor ldy = random_f32({6, 16}, 30);
    const Tensor ldx =
        layer_norm_backward(ctx, ldy.to(d), lx.to(d), lg.to(d), l.mean, l.rstd, Tensor(), Tensor());
    const Tensor ldx_ref = layer_norm_backward(ctx, rounded(ldy, d), rounded(lx, d), rounded(lg, d),
                                               lref.mean, lref.rstd, Tensor(), Tensor());
    EXPECT_TRUE(identical(ctx, ldx, ldx_ref.to(d), "layer norm dx"));
    EXPECT_THROW(layer_norm_backward(ctx, ldy.to(d), lx.to(d), lg.to(d), l.mean.to(d), l.rstd.to(d),
                                     Tensor(), Tensor()),
                 Error);
  }
}

TEST(CudaPrecision, ConversionsMatchTheCpuBitForBit) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu(Device::cpu());
  ExecContext gpu(Device::cuda(0));
  const Tensor x = awkward_values(/*nan=*/false);
  for (DType d : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(d));
    const Tensor narrow_gpu = cast(gpu, to_device(x, gpu), d);
    EXPECT_TRUE(identical(gpu, narrow_gpu, cast(cpu, x, d), "f32 -> 16 bits"));
    EXPECT_TRUE(identical(gpu, cast(gpu, narrow_gpu, DType::kF32),
                          cast(cpu, cast(cpu, x, d), DType::kF32), "16 bits -> f32"));
    const Tensor master = random_f32({5000}, 3);
    const Tensor work = cast(cpu, random_f32({5000}, 4, -0.01, 0.01), d);
    const Tensor master_gpu = to_device(master, gpu), work_gpu = to_device(work, gpu);
    move_add_(gpu, master_gpu, work_gpu);
    move_add_(cpu, master, work);
    EXPECT_TRUE(identical(gpu, master_gpu, master, "move_add_ sum"));
    EXPECT_TRUE(identical(gpu, work_gpu, work, "move_add_ cleared"));
  }
}

}  // namespace
}  // namespace strata::ops
