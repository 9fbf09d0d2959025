// Channels-last (NHWC) tensors (ops/layout.h): the conversion round trip is exact, the memory is
// (N, H, W, C) while the logical indexing stays (N, C, H, W), and the ops that pass channels-last
// activations along (element-wise, batch norm) give what they give on NCHW, bit for bit, on the
// CPU; other ops take NCHW copies. On CUDA the same conversions match the CPU (skipped without a
// device; the convolutions' NHWC path is in test_cuda_cnn).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "ops/activation.h"
#include "ops/batch_norm.h"
#include "ops/conv2d.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/pooling.h"
#include "testing/cuda_parity.h"

namespace strata::ops {
namespace {

using testing::identical;
using testing::random_f32;
using testing::to_device;

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(Layout, ChannelsLastRoundTripIsExact) {
  ExecContext ctx;
  for (DType d : {DType::kF32, DType::kBF16, DType::kF64}) {
    SCOPED_TRACE(dtype_name(d));
    const Tensor x = random_f32({2, 3, 4, 5}, 1).to(d);
    const Tensor cl = to_channels_last(ctx, x);
    EXPECT_TRUE(is_channels_last(cl));
    EXPECT_FALSE(is_channels_last(x));
    EXPECT_EQ(cl.shape(), x.shape());
    EXPECT_EQ(cl.strides(), (Shape{60, 1, 15, 3}));  // (H W C, 1, W C, C)
    // The same logical elements; the memory is (N, H, W, C).
    EXPECT_EQ(cl.to_vector<double>(), x.to_vector<double>());
    EXPECT_TRUE(same_bytes(detail::nhwc_view(cl), x.permute({0, 2, 3, 1}).contiguous()));
    // Back, bit for bit, and contiguous() is the same conversion.
    const Tensor back = to_channels_first(ctx, cl);
    EXPECT_TRUE(back.is_contiguous());
    EXPECT_TRUE(same_bytes(back, x));
    EXPECT_TRUE(same_bytes(cl.contiguous(), x));
    // Converting a tensor already in the layout is the tensor itself.
    EXPECT_EQ(to_channels_last(ctx, cl).raw_data(), cl.raw_data());
    EXPECT_EQ(to_channels_first(ctx, x).raw_data(), x.raw_data());
  }
  // One channel, or a 1 x 1 image: the same memory either way; it counts as NCHW.
  EXPECT_FALSE(is_channels_last(to_channels_last(ctx, random_f32({2, 1, 3, 3}, 2))));
  EXPECT_FALSE(is_channels_last(to_channels_last(ctx, random_f32({2, 4, 1, 1}, 3))));
  EXPECT_THROW(to_channels_last(ctx, random_f32({2, 3, 4}, 4)), Error);
  const Tensor e = empty_channels_last(ctx, {2, 3, 4, 5}, DType::kF32);
  EXPECT_TRUE(is_channels_last(e));
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4, 5}));
}

// The ops that keep channels-last activations: the results hold the NCHW results' values, bit
// for bit, and stay channels-last; an op that does not take them gets an NCHW copy.
TEST(Layout, OpsOnChannelsLastMatchNchw) {
  ExecContext ctx;
  const Tensor x = random_f32({2, 3, 4, 6}, 5, -1.0, 1.0), b = random_f32({2, 3, 4, 6}, 6);
  const Tensor xl = to_channels_last(ctx, x), bl = to_channels_last(ctx, b);
  auto same = [&](const Tensor& got, const Tensor& want, const char* what) {
    EXPECT_TRUE(is_channels_last(got)) << what;
    EXPECT_TRUE(identical(ctx, got.contiguous(), want, what));
  };
  same(relu_forward(ctx, xl), relu_forward(ctx, x), "relu");
  same(relu_backward(ctx, b, relu_forward(ctx, xl)), relu_backward(ctx, b, relu_forward(ctx, x)),
       "relu backward, NCHW dy");
  same(gelu_forward(ctx, xl), gelu_forward(ctx, x), "gelu");
  same(add(ctx, xl, bl), add(ctx, x, b), "add");
  same(add(ctx, xl, b), add(ctx, x, b), "add, mixed layouts");
  const Tensor bias = random_f32({3, 1, 1}, 7);
  same(add(ctx, xl, bias), add(ctx, x, bias), "add, broadcast");
  same(mul(ctx, xl, bias), mul(ctx, x, bias), "mul, broadcast");
  same(scale(ctx, xl, 0.5), scale(ctx, x, 0.5), "scale");
  Tensor acc = to_channels_last(ctx, b), acc_ref = b.clone();
  add_(ctx, acc, xl, 2.0);
  add_(ctx, acc_ref, x, 2.0);
  same(acc, acc_ref, "add_ into a channels-last tensor");
  // Batch norm: the (N H W, C) rows of the memory, the same statistics.
  const Tensor g = random_f32({3}, 8), beta = random_f32({3}, 9);
  Tensor rm = Tensor::zeros({3}), rv = Tensor::full({3}, 1.0);
  Tensor rm_ref = Tensor::zeros({3}), rv_ref = Tensor::full({3}, 1.0);
  const BatchNormTrainResult r = batch_norm_forward_train(ctx, xl, g, beta, rm, rv, 0.1, 1e-5);
  const BatchNormTrainResult ref =
      batch_norm_forward_train(ctx, x, g, beta, rm_ref, rv_ref, 0.1, 1e-5);
  EXPECT_TRUE(is_channels_last(r.y));
  for (int64_t c = 0; c < 3; ++c) {  // the reduction order differs: close, not bitwise
    EXPECT_NEAR(r.save_mean.to_vector<double>()[c], ref.save_mean.to_vector<double>()[c], 1e-6);
    EXPECT_NEAR(rv.to_vector<double>()[c], rv_ref.to_vector<double>()[c], 1e-6);
  }
  EXPECT_TRUE(testing::all_close(r.y.contiguous(), ref.y, 1e-5, 1e-5));
  const Tensor dx =
      batch_norm_backward(ctx, b, xl, g, r.save_mean, r.save_invstd, Tensor(), Tensor());
  const Tensor dx_ref =
      batch_norm_backward(ctx, b, x, g, ref.save_mean, ref.save_invstd, Tensor(), Tensor());
  EXPECT_TRUE(is_channels_last(dx));
  EXPECT_TRUE(testing::all_close(dx.contiguous(), dx_ref, 1e-5, 1e-5));
  // An op that does not take channels-last tensors gets an NCHW copy: the same result.
  Pool2dParams p;
  p.kernel_h = p.kernel_w = 2;
  p.stride_h = p.stride_w = 2;
  EXPECT_TRUE(identical(ctx, max_pool2d_forward(ctx, xl, p).y, max_pool2d_forward(ctx, x, p).y,
                        "max pool of a channels-last input"));
}

TEST(CudaLayout, ConversionsMatchTheCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu, gpu(Device::cuda(0));
  const Tensor x = random_f32({2, 5, 3, 7}, 11);
  const Tensor cl = to_channels_last(gpu, to_device(x, gpu));
  EXPECT_TRUE(is_channels_last(cl));
  EXPECT_TRUE(identical(gpu, cl.contiguous(), x, "to_channels_last on cuda:0"));
  EXPECT_TRUE(identical(gpu, to_channels_first(gpu, cl), x, "and back"));
  EXPECT_TRUE(identical(gpu, relu_forward(gpu, cl).contiguous(), relu_forward(cpu, x), "relu"));
  // A convolution's output is channels-last (NCHW input converted first); batch norm and ReLU
  // keep it so, and the values are the CPU's.
  Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  const Tensor w = random_f32({4, 5, 3, 3}, 12);
  const Tensor y = conv2d_forward(gpu, to_device(x, gpu), to_device(w, gpu), Tensor(), p);
  EXPECT_TRUE(is_channels_last(y));
  const Tensor y_cpu = conv2d_forward(cpu, x, w, Tensor(), p);
  EXPECT_TRUE(testing::parity(gpu, y, y_cpu, testing::parity_bound(testing::Precision::kF32)));
  const BatchNormTrainResult bn =
      batch_norm_forward_train(gpu, y, Tensor(), Tensor(), Tensor(), Tensor(), 0.1, 1e-5);
  EXPECT_TRUE(is_channels_last(bn.y));
  EXPECT_TRUE(is_channels_last(relu_forward(gpu, bn.y)));
  const BatchNormTrainResult bn_cpu =
      batch_norm_forward_train(cpu, y_cpu, Tensor(), Tensor(), Tensor(), Tensor(), 0.1, 1e-5);
  EXPECT_TRUE(testing::parity(gpu, bn.y, bn_cpu.y, 1e-4));
}

}  // namespace
}  // namespace strata::ops
