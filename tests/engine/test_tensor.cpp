#include <gtest/gtest.h>

#include "engine/tensor.h"

namespace strata {
namespace {

Tensor iota(const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return Tensor::from_vector(v, shape);
}

TEST(Tensor, ContiguousBasics) {
  Tensor t = iota({2, 3, 4});
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.str(), "f32 cpu (2, 3, 4)");
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = iota({2, 3});
  Tensor v = t.view({3, 2});
  EXPECT_TRUE(v.shares_storage(t));
  v.data<float>()[0] = 42.0f;
  EXPECT_EQ(t.data<float>()[0], 42.0f);
  EXPECT_EQ(t.view({-1}).shape(), Shape{6});
}

TEST(Tensor, TransposeIsAStridedView) {
  Tensor t = iota({2, 3});
  Tensor tt = t.transpose(0, 1);
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.shape(), (Shape{3, 2}));
  EXPECT_EQ(tt.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor c = tt.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.shares_storage(t));
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_THROW(tt.view({6}), Error);
  EXPECT_EQ(tt.reshape({6}).to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, PermuteNarrowSelect) {
  Tensor t = iota({2, 3, 4});
  Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.to_vector<float>()[1], 4.0f);  // p[0][0][1] = t[0][1][0]
  Tensor n = t.narrow(2, 1, 2);
  EXPECT_EQ(n.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(n.to_vector<float>()[0], 1.0f);
  EXPECT_EQ(n.to_vector<float>()[2], 5.0f);
  Tensor s = t.select(1, 2);
  EXPECT_EQ(s.shape(), (Shape{2, 4}));
  EXPECT_EQ(s.to_vector<float>()[0], 8.0f);
  EXPECT_EQ(t.unsqueeze(0).shape(), (Shape{1, 2, 3, 4}));
  EXPECT_EQ(t.unsqueeze(-1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(t.unsqueeze(1).squeeze(1).shape(), t.shape());
  EXPECT_THROW(t.narrow(0, 1, 2), Error);
  EXPECT_THROW(t.select(3, 0), Error);
}

TEST(Tensor, FlattenAndReshape) {
  Tensor t = iota({2, 3, 4});
  EXPECT_EQ(t.flatten().shape(), Shape{24});
  EXPECT_EQ(t.flatten(1).shape(), (Shape{2, 12}));
  EXPECT_EQ(t.flatten(0, 1).shape(), (Shape{6, 4}));
  EXPECT_THROW(t.view({5, -1}), Error);
  EXPECT_THROW(t.view({-1, -1}), Error);
}

TEST(Tensor, CopyConvertsDtypesThroughStrides) {
  Tensor t = iota({3, 2});
  Tensor d = Tensor::empty({2, 3}, DType::kF64);
  d.copy_from(t.transpose(0, 1));
  EXPECT_EQ(d.to_vector<double>(), (std::vector<double>{0, 2, 4, 1, 3, 5}));
  Tensor h = t.to(DType::kF16);
  Tensor b = t.to(DType::kBF16);
  Tensor i = t.to(DType::kI32);
  EXPECT_EQ(h.to_vector<float>(), t.to_vector<float>());
  EXPECT_EQ(b.to_vector<float>(), t.to_vector<float>());
  EXPECT_EQ(i.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_THROW(d.copy_from(t), Error);  // shape mismatch
}

TEST(Tensor, FillAndZeroOnViews) {
  Tensor t = Tensor::zeros({3, 4});
  t.narrow(1, 1, 2).fill_(7.0);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 7, 7, 0, 0, 7, 7, 0, 0, 7, 7, 0}));
  t.transpose(0, 1).select(0, 1).zero_();
  EXPECT_EQ(t.to_vector<float>()[1], 0.0f);
  EXPECT_EQ(t.to_vector<float>()[2], 7.0f);
  EXPECT_EQ(Tensor::full({2}, 3.5, DType::kF64).to_vector<double>(),
            (std::vector<double>{3.5, 3.5}));
}

TEST(Tensor, LargeStridedCopyUsesEveryRow) {
  // Big enough to take the OpenMP path in the row walker.
  Tensor t = iota({64, 33, 40});
  Tensor p = t.permute({2, 0, 1}).contiguous();
  const float* pp = p.data<float>();
  const float* pt = t.data<float>();
  for (int64_t a = 0; a < 40; ++a)
    for (int64_t b = 0; b < 64; ++b)
      for (int64_t c = 0; c < 33; ++c)
        ASSERT_EQ(pp[(a * 64 + b) * 33 + c], pt[(b * 33 + c) * 40 + a]);
}

TEST(Tensor, DataChecksDtype) {
  Tensor t = iota({2});
  EXPECT_THROW(t.data<double>(), Error);
  EXPECT_FALSE(Tensor().defined());
  EXPECT_THROW(Tensor().data<float>(), Error);
}

TEST(Tensor, StorageReturnsBytesToItsAllocator) {
  CpuAllocator alloc;
  {
    Tensor a = Tensor::empty({1000}, DType::kF32, &alloc);
    Tensor view = a.narrow(0, 10, 10);
    a = Tensor();
    EXPECT_EQ(alloc.stats().current, 4000u);  // the view keeps the storage alive
  }
  EXPECT_EQ(alloc.stats().current, 0u);
  EXPECT_EQ(alloc.stats().peak, 4000u);
}

TEST(Tensor, ScalarTensor) {
  Tensor s = Tensor::full({}, 2.5);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item<float>(), 2.5f);
}

}  // namespace
}  // namespace strata
