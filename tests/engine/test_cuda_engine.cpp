// The CUDA engine: contexts, the caching allocator, pinned memory, events, and the host-staged
// tensor helpers on device tensors. Tests that need a GPU skip without one; the size classes and
// the device-selection errors are checked everywhere.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/cuda_runtime.h"
#include "engine/device.h"
#include "engine/exec_context.h"
#include "engine/tensor.h"
#include "engine/uploader.h"
#include "testing/cuda_parity.h"

namespace strata {
namespace {

TEST(CudaEngine, SizeClasses) {
  if (!cuda::built_with_cuda()) STRATA_SKIP_WITHOUT_GPU("this build has no CUDA support");
  EXPECT_EQ(cuda::CachingAllocator::round_size(0), 512u);
  EXPECT_EQ(cuda::CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(cuda::CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(cuda::CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(cuda::CachingAllocator::round_size(size_t{1} << 20), size_t{1} << 20);
  EXPECT_EQ(cuda::CachingAllocator::round_size((size_t{1} << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(cuda::CachingAllocator::round_size((size_t{5} << 20) + 7), size_t{6} << 20);
}

TEST(CudaEngine, AMissingDeviceNamesTheDevicesThatExist) {
  const int n = cuda_device_count();
  try {
    ExecContext ctx(Device::cuda(n + 2));
    FAIL() << "cuda:" << n + 2 << " accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda:" + std::to_string(n + 2)), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;  // the devices that exist
  }
}

TEST(CudaEngine, ContextOwnsAStreamAndACachingAllocator) {
  STRATA_REQUIRE_CUDA();
  ExecContext ctx(Device::cuda(0));
  ASSERT_NE(ctx.cuda(), nullptr);
  EXPECT_NE(cuda::exec_stream(ctx.cuda()), nullptr);  // never the legacy default stream
  EXPECT_EQ(ctx.allocator().device(), Device::cuda(0));
  ExecContext cpu;
  EXPECT_EQ(cpu.cuda(), nullptr);
  cpu.synchronize();  // a no-op on the CPU
}

TEST(CudaEngine, FreedBlocksAreReusedWithoutCudaMalloc) {
  STRATA_REQUIRE_CUDA();
  ExecContext ctx(Device::cuda(0));
  auto& alloc = dynamic_cast<cuda::CachingAllocator&>(ctx.allocator());
  void* a = alloc.allocate(1000);
  alloc.deallocate(a, 1000);
  EXPECT_EQ(alloc.cached_bytes(), 1024u);
  void* b = alloc.allocate(900);  // the same 1024-byte class
  EXPECT_EQ(a, b);
  EXPECT_EQ(alloc.caching_stats().cache_hits, 1u);
  EXPECT_EQ(alloc.caching_stats().device_mallocs, 1u);
  void* c = alloc.allocate(3000);  // another class: a new block
  EXPECT_NE(c, b);
  EXPECT_EQ(alloc.caching_stats().device_mallocs, 2u);
  alloc.deallocate(b, 900);
  alloc.deallocate(c, 3000);
  const MemoryStats s = alloc.stats();
  EXPECT_EQ(s.current, 0u);
  EXPECT_EQ(s.peak, 3900u);
  alloc.release_cached();
  EXPECT_EQ(alloc.cached_bytes(), 0u);
  EXPECT_EQ(alloc.caching_stats().reserved, 0u);
}

TEST(CudaEngine, LargeBlocksFitWithinAQuarter) {
  STRATA_REQUIRE_CUDA();
  ExecContext ctx(Device::cuda(0));
  auto& alloc = dynamic_cast<cuda::CachingAllocator&>(ctx.allocator());
  const size_t mib = size_t{1} << 20;
  void* big = alloc.allocate(16 * mib);
  alloc.deallocate(big, 16 * mib);
  void* fits = alloc.allocate(14 * mib);  // 16 <= 14 + 14/4: reused
  EXPECT_EQ(fits, big);
  alloc.deallocate(fits, 14 * mib);
  void* small = alloc.allocate(4 * mib);  // 16 > 4 + 1: a new block
  EXPECT_NE(small, big);
  alloc.deallocate(small, 4 * mib);
}

TEST(CudaEngine, TheLimitNamesTheOpRequestLimitAndPeak) {
  STRATA_REQUIRE_CUDA();
  ExecContext ctx(Device::cuda(0));
  ctx.allocator().set_limit(size_t{1} << 20);
  try {
    Tensor::empty({1 << 20}, DType::kF32, &ctx.allocator());  // 4 MiB
    FAIL() << "allocation past the limit accepted";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("4.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("limit 1.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("peak"), std::string::npos) << msg;
  }
  // Cached blocks do not count against the limit: they go back to the device first.
  ctx.allocator().set_limit(size_t{3} << 20);
  for (int i = 0; i < 4; ++i) {
    Tensor t = Tensor::empty({(1 << 19) + i * 1024}, DType::kF32, &ctx.allocator());  // ~2 MiB
  }
}

TEST(CudaEngine, BlocksUsedOnAnotherStreamWaitForIt) {
  STRATA_REQUIRE_CUDA();
  ExecContext ctx(Device::cuda(0));
  ExecContext other(Device::cuda(0));
  auto& alloc = dynamic_cast<cuda::CachingAllocator&>(ctx.allocator());
  void* a = alloc.allocate(4096);
  alloc.record_use(a, cuda::exec_stream(other.cuda()));
  alloc.deallocate(a, 4096);
  other.synchronize();
  // Once the other stream is idle the block is reusable.
  void* b = alloc.allocate(4096);
  EXPECT_EQ(a, b);
  alloc.deallocate(b, 4096);
}

TEST(CudaEngine, TensorHelpersStageThroughTheHost) {
  STRATA_REQUIRE_CUDA();
  ExecContext ctx(Device::cuda(0));
  Tensor z = Tensor::zeros({3, 5}, DType::kF32, &ctx.allocator());
  EXPECT_EQ(z.device(), Device::cuda(0));
  for (float v : z.to_vector<float>()) EXPECT_EQ(v, 0.0f);
  Tensor f = Tensor::full({7}, 2.5, DType::kF32, &ctx.allocator());
  for (float v : f.to_vector<float>()) EXPECT_EQ(v, 2.5f);
  Tensor h = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor d = Tensor::empty({2, 3}, DType::kF32, &ctx.allocator());
  d.copy_from(h);
  EXPECT_EQ(d.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  // A converting copy and a strided source.
  Tensor d64 = d.to(DType::kF64);
  EXPECT_EQ(d64.device(), Device::cuda(0));
  EXPECT_EQ(d64.to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  Tensor t = Tensor::empty({3, 2}, DType::kF32, &ctx.allocator());
  t.copy_from(h.transpose(0, 1));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_DOUBLE_EQ(d.narrow(0, 1, 1).narrow(1, 2, 1).item<double>(), 6.0);
  Tensor dv = Tensor::from_vector<float>({9, 8}, {2}, &ctx.allocator());
  EXPECT_EQ(dv.device(), Device::cuda(0));
  EXPECT_EQ(dv.to_vector<float>(), (std::vector<float>{9, 8}));
}

TEST(CudaEngine, PinnedHostMemoryIsCachedBySize) {
  STRATA_REQUIRE_CUDA();
  cuda::PinnedHostAllocator pinned;
  EXPECT_TRUE(pinned.device().is_cpu());
  void* a = pinned.allocate(10000);
  pinned.deallocate(a, 10000);
  void* b = pinned.allocate(10000);
  EXPECT_EQ(a, b);
  pinned.deallocate(b, 10000);
  EXPECT_GT(pinned.cached_bytes(), 0u);
  Tensor t = Tensor::full({2500}, 1.5, DType::kF32, &pinned);
  EXPECT_EQ(t.to_vector<float>()[2499], 1.5f);
}

// Batches to the device: on the CPU the tensor itself; on CUDA a copy ordered on the stream
// (no host wait), whose pinned staging buffers are reclaimed once their copies are done and are
// never overwritten before: 64 uploads of distinct values all arrive intact.
TEST(Uploader, CpuTensorsStayAndCudaCopiesArriveIntact) {
  ExecContext cpu(Device::cpu());
  Uploader on_cpu(cpu);
  const Tensor h = Tensor::full({5}, 2.0);
  EXPECT_TRUE(on_cpu.upload(h).shares_storage(h));
  EXPECT_EQ(on_cpu.in_flight(), 0u);
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  Uploader up(gpu);
  std::vector<Tensor> on_device;
  for (int i = 0; i < 64; ++i) {
    Tensor batch = Tensor::full({3, 1000}, static_cast<double>(i), DType::kF32);
    on_device.push_back(up.upload(batch.transpose(0, 1)));  // a strided view is gathered
    batch.fill_(-1.0);  // the host batch may change at once: the bytes were staged
    EXPECT_LE(up.in_flight(), 16u);
  }
  const Tensor ids = Tensor::full({7}, 42.0, DType::kI64);
  const Tensor ids_gpu = up.upload(ids);
  gpu.synchronize();
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(on_device[i].device().is_cuda());
    ASSERT_EQ(on_device[i].shape(), (Shape{1000, 3}));
    for (float v : on_device[i].to_vector<float>()) ASSERT_EQ(v, static_cast<float>(i)) << i;
  }
  EXPECT_EQ(ids_gpu.dtype(), DType::kI64);
  EXPECT_EQ(ids_gpu.to_vector<int64_t>(), std::vector<int64_t>(7, 42));
}

}  // namespace
}  // namespace strata
