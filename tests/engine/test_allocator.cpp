#include <gtest/gtest.h>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/device.h"
#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata {
namespace {

TEST(Allocator, AccountsCurrentAndPeak) {
  CpuAllocator alloc;
  void* a = alloc.allocate(1000);
  void* b = alloc.allocate(500);
  EXPECT_EQ(alloc.stats().current, 1500u);
  alloc.deallocate(a, 1000);
  EXPECT_EQ(alloc.stats().current, 500u);
  EXPECT_EQ(alloc.stats().peak, 1500u);
  EXPECT_EQ(alloc.stats().allocations, 2u);
  alloc.reset_peak();
  EXPECT_EQ(alloc.stats().peak, 500u);
  alloc.deallocate(b, 500);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
}

TEST(Allocator, LimitGivesOutOfMemoryWithContext) {
  CpuAllocator alloc;
  alloc.set_limit(parse_bytes("1MiB"));
  Tensor keep = Tensor::empty({100000}, DType::kF32, &alloc);  // 400000 bytes
  try {
    Tensor::empty({200000}, DType::kF32, &alloc);  // 800000 more: past 1 MiB
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("out of memory on cpu"), std::string::npos) << m;
    EXPECT_NE(m.find("781.25 KiB"), std::string::npos) << m;  // the request
    EXPECT_NE(m.find("limit 1.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("peak 390.62 KiB"), std::string::npos) << m;
    EXPECT_NE(m.find("--mem-limit"), std::string::npos) << m;
  }
  // The refused allocation left no trace in the accounting.
  EXPECT_EQ(alloc.stats().current, 400000u);
}

TEST(Allocator, ParseAndFormatBytes) {
  EXPECT_EQ(parse_bytes("512"), 512u);
  EXPECT_EQ(parse_bytes("2KiB"), 2048u);
  EXPECT_EQ(parse_bytes("1.5GiB"), 1610612736u);
  EXPECT_EQ(parse_bytes("3GB"), 3000000000u);
  EXPECT_EQ(parse_bytes("4M"), 4194304u);
  EXPECT_THROW(parse_bytes("lots"), Error);
  EXPECT_THROW(parse_bytes("3 parsecs"), Error);
  EXPECT_THROW(parse_bytes("-1GiB"), Error);
  EXPECT_EQ(format_bytes(100), "100 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
}

TEST(Device, ParseAndAvailability) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:3"), Device::cuda(3));
  EXPECT_EQ(parse_device("cuda:3").str(), "cuda:3");
  EXPECT_THROW(parse_device("gpu"), Error);
  EXPECT_THROW(parse_device("cuda:x"), Error);
  EXPECT_THROW(parse_device("cuda:-1"), Error);
  const int n = cuda_device_count();
  EXPECT_GE(n, 0);
  try {
    check_device_available(Device::cuda(n));  // one past the last device
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("available: cpu"), std::string::npos) << e.what();
  }
}

TEST(ExecContext, DefaultsToTheProcessCpuAllocator) {
  ExecContext ctx;
  EXPECT_EQ(&ctx.allocator(), &default_cpu_allocator());
  CpuAllocator mine;
  ExecContext ctx2(Device::cpu(), &mine, 1);
  EXPECT_EQ(&ctx2.allocator(), &mine);
  EXPECT_EQ(ctx2.threads(), 1);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

TEST(CpuAllocatorCache, ReusesFreedBlocksOfTheSameSize) {
  CpuAllocator alloc;
  void* a = alloc.allocate(100000);
  alloc.deallocate(a, 100000);
  EXPECT_EQ(alloc.stats().current, 0u);
  EXPECT_EQ(alloc.stats().cached, 102400u);  // rounded up to 4 KiB
  void* b = alloc.allocate(99000);           // same rounded size
  EXPECT_EQ(a, b);
  EXPECT_EQ(alloc.stats().cached, 0u);
  void* c = alloc.allocate(200000);
  EXPECT_NE(c, b);
  alloc.deallocate(b, 99000);
  alloc.deallocate(c, 200000);
  alloc.release_cached();
  EXPECT_EQ(alloc.stats().cached, 0u);
}

TEST(CpuAllocatorCache, LimitCountsTensorsNotTheCache) {
  CpuAllocator alloc;
  alloc.set_limit(1 << 20);
  void* a = alloc.allocate(700000);
  alloc.deallocate(a, 700000);       // cached, not in use
  void* b = alloc.allocate(800000);  // fits the limit once the cache is given back
  EXPECT_EQ(alloc.stats().current, 800000u);
  EXPECT_LE(alloc.stats().current + alloc.stats().cached, size_t{1} << 20);
  alloc.deallocate(b, 800000);
  CpuAllocator plain(false);
  void* p = plain.allocate(1000);
  plain.deallocate(p, 1000);
  EXPECT_EQ(plain.stats().cached, 0u);
}

}  // namespace
}  // namespace strata
