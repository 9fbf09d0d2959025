// The peak table and roofline of the benchmarks (tools/bench/roofline.h), and the precisions
// they accept.
#include <gtest/gtest.h>

#include <string>

#include "engine/check.h"
#include "tools/bench/roofline.h"

namespace strata::tools {
namespace {

TEST(DevicePeaks, KnownDevicesByDriverName) {
  const DevicePeaks sxm = device_peaks("NVIDIA H100 80GB HBM3");
  ASSERT_TRUE(sxm.known);
  EXPECT_EQ(sxm.name, "H100 SXM");
  EXPECT_DOUBLE_EQ(peak_flops(sxm, "bf16"), 989.4e12);
  EXPECT_DOUBLE_EQ(peak_flops(sxm, "tf32"), 494.7e12);
  EXPECT_DOUBLE_EQ(peak_flops(sxm, "fp32"), 66.9e12);
  EXPECT_DOUBLE_EQ(peak_bytes_per_second(sxm), 3.35e12);

  const DevicePeaks h200 = device_peaks("NVIDIA H200");
  ASSERT_TRUE(h200.known);
  EXPECT_DOUBLE_EQ(peak_flops(h200, "tf32"), 494.7e12);
  EXPECT_DOUBLE_EQ(peak_bytes_per_second(h200), 4.8e12);

  const DevicePeaks pcie = device_peaks("NVIDIA H100 PCIe");
  ASSERT_TRUE(pcie.known);
  EXPECT_DOUBLE_EQ(peak_flops(pcie, "bf16"), 756e12);
  EXPECT_DOUBLE_EQ(peak_flops(pcie, "fp32"), 51.2e12);
  EXPECT_DOUBLE_EQ(peak_bytes_per_second(pcie), 2.0e12);

  const DevicePeaks a40 = device_peaks("NVIDIA A100-SXM4-40GB");
  ASSERT_TRUE(a40.known);
  EXPECT_DOUBLE_EQ(peak_flops(a40, "tf32"), 156e12);
  EXPECT_DOUBLE_EQ(peak_bytes_per_second(a40), 1.55e12);
  const DevicePeaks a80 = device_peaks("NVIDIA A100 80GB PCIe");
  ASSERT_TRUE(a80.known);
  EXPECT_DOUBLE_EQ(peak_flops(a80, "fp32"), 19.5e12);
  EXPECT_DOUBLE_EQ(peak_bytes_per_second(a80), 2.0e12);
}

TEST(DevicePeaks, UnknownDevicesHaveNoPeak) {
  for (const char* name : {"", "cpu", "NVIDIA GeForce RTX 4090", "NVIDIA H100 NVL",
                           "NVIDIA GH200 480GB", "Tesla V100-SXM2-16GB"}) {
    const DevicePeaks p = device_peaks(name);
    EXPECT_FALSE(p.known) << name;
    EXPECT_EQ(peak_flops(p, "tf32"), 0.0) << name;
    EXPECT_EQ(roofline_seconds(1e12, 1e9, peak_flops(p, "tf32"), peak_bytes_per_second(p)), 0.0);
  }
}

TEST(Roofline, BoundIsTheSlowerOfComputeAndMemory) {
  EXPECT_DOUBLE_EQ(roofline_seconds(1e12, 1e9, 1e14, 1e12), 1e-2);  // compute: 10 ms vs 1 ms
  EXPECT_DOUBLE_EQ(roofline_seconds(1e9, 1e12, 1e14, 1e12), 1.0);   // memory
}

TEST(Precision, MixedPrecisionIsAccepted) {
  for (const char* p : {"fp32", "tf32", "bf16", "fp16"}) EXPECT_NO_THROW(check_precision(p)) << p;
  for (const char* p : {"fp8", "f32", "BF16", ""}) {
    try {
      check_precision(p);
      ADD_FAILURE() << p << " accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("is not one of fp32, tf32, bf16, fp16"), std::string::npos) << what;
    }
  }
  // bf16 and fp16 are held to the dense bf16 tensor-core peak.
  const DevicePeaks sxm = device_peaks("NVIDIA H100 80GB HBM3");
  EXPECT_DOUBLE_EQ(peak_flops(sxm, "fp16"), peak_flops(sxm, "bf16"));
}

}  // namespace
}  // namespace strata::tools
