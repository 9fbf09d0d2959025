// Peak throughput of the GPUs the benchmarks know, and the roofline bound of an op.
//
// Peaks are dense (no 2:4 sparsity), from NVIDIA's data sheets: H100 SXM and H200 bf16 989.4,
// tf32 494.7, fp32 66.9 TFLOP/s with 3.35 (H100) / 4.8 (H200) TB/s of HBM; H100 PCIe 756, 378,
// 51.2 TFLOP/s and 2.0 TB/s; A100 312, 156, 19.5 TFLOP/s and 2.0 (80 GB) / 1.55 (40 GB) TB/s.
// Any other device (and the CPU) is unknown: no MFU and no roofline.
#pragma once

#include <string>

namespace strata::tools {

struct DevicePeaks {
  bool known = false;
  std::string name;        // the table's name, e.g. "H100 SXM"
  double bf16_tflops = 0;  // tensor cores
  double tf32_tflops = 0;  // tensor cores
  double fp32_tflops = 0;  // CUDA cores (no tensor cores)
  double hbm_tbytes_per_s = 0;
};

// The peaks of a device from its name as the CUDA driver reports it ("NVIDIA H100 80GB HBM3",
// "NVIDIA H200", "NVIDIA A100-SXM4-40GB", ...); known == false for anything else.
DevicePeaks device_peaks(const std::string& device_name);

// Peak FLOP/s of `precision` (fp32, tf32, bf16, fp16 = bf16's), 0 when unknown.
double peak_flops(const DevicePeaks& peaks, const std::string& precision);
// Peak memory bandwidth in bytes/s, 0 when unknown.
double peak_bytes_per_second(const DevicePeaks& peaks);

// The roofline's lower bound on an op's time: max(flops / peak FLOP/s, bytes / peak bandwidth)
// seconds, 0 when a peak is unknown (0).
double roofline_seconds(double flops, double bytes, double peak_flops_per_s,
                        double peak_bytes_per_s);

// The precisions a benchmark may be asked for: fp32, tf32 (f32 tensors, TF32 tensor-core
// products), bf16 and fp16 (mixed precision: 16-bit tensors, f32 master weights); anything else
// is an error listing the valid ones. Where each runs is the benchmark's to check (the CPU: fp32).
void check_precision(const std::string& precision);

}  // namespace strata::tools
