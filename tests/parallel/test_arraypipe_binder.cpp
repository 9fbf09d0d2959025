// ArrayPipe's Binder: one layer structure, a block state per job, switched by binding views.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/exec_context.h"
#include "engine/tape.h"
#include "graph/model.h"
#include "graph/model_spec.h"
#include "graph/param_store.h"
#include "models/registry.h"
#include "parallel/arraypipe/binder.h"

namespace strata::parallel::arraypipe {
namespace {

std::unique_ptr<graph::Model> small_cnn() {
  return graph::build_model(models::model_spec("cnn", "tiny", {1, 28, 28}, 10));
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.numel() * dtype_size(a.dtype())) == 0;
}

TEST(ArrayPipeBinder, SwitchesViewsWithoutCopying) {
  auto model = small_cnn();
  CpuAllocator allocator;
  const size_t begin = 0, end = model->size();
  Binder binder(*model, begin, end, allocator);
  EXPECT_EQ(binder.add_job(1, 1), 0);
  EXPECT_EQ(binder.add_job(2, 1), 1);
  EXPECT_EQ(binder.add_job(3, 1), 2);
  // Each job's state is what a lone store of its seed holds.
  auto other = small_cnn();
  for (int j = 0; j < 3; ++j) {
    graph::ParamStore alone(*other, begin, end, allocator);
    alone.initialize(static_cast<uint64_t>(j + 1));
    EXPECT_TRUE(same_bytes(alone.params(), binder.store(j).params())) << "job " << j;
    EXPECT_TRUE(same_bytes(alone.buffers(), binder.store(j).buffers())) << "job " << j;
  }
  EXPECT_FALSE(same_bytes(binder.store(0).params(), binder.store(1).params()));
  // The layers compute with the bound job's state: its outputs are a lone store's of its seed.
  ExecContext ctx(Device::cpu(), &allocator, 1);
  std::vector<float> pixels(2 * 28 * 28);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>(i % 13) / 13.0f;
  const Tensor x = Tensor::from_vector(pixels, {2, 1, 28, 28});
  auto logits = [&](graph::Model& m) {
    Tape tape;
    graph::ForwardOptions options;
    options.training = false;
    options.keep_tape = false;
    return m.forward(ctx, 0, m.size(), {x}, tape, options).at(0);
  };
  const int64_t switches = binder.switches();
  for (int j : {0, 2, 2, 1, 0}) {
    binder.bind(j);
    EXPECT_EQ(binder.bound(), j);
    graph::ParamStore alone(*other, begin, end, allocator);
    alone.initialize(static_cast<uint64_t>(j + 1));
    EXPECT_TRUE(same_bytes(logits(*model), logits(*other))) << "job " << j;
  }
  // 2 was bound after add_job; 0, 2, (2 again: nothing), 1, 0.
  EXPECT_EQ(binder.switches() - switches, 4);
  // Views, not copies: a change to the bound job's store is what the layers compute with.
  binder.bind(1);
  const Tensor before = logits(*model).clone();
  binder.store(1).params().zero_();
  const Tensor after = logits(*model);
  EXPECT_FALSE(same_bytes(before, after));
  graph::ParamStore zero(*other, begin, end, allocator);
  zero.initialize(2);
  zero.params().zero_();
  EXPECT_TRUE(same_bytes(after, logits(*other)));
  EXPECT_THROW(binder.bind(3), Error);
}

}  // namespace
}  // namespace strata::parallel::arraypipe
