#include "tools/bench/roofline.h"

#include <algorithm>
#include <cctype>

#include "engine/check.h"

namespace strata::tools {
namespace {

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

DevicePeaks device_peaks(const std::string& device_name) {
  std::string n = device_name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::toupper(c); });
  DevicePeaks p;
  if (has(n, "NVL") || has(n, "GH200")) return p;  // other clocks and memory: not in the table
  if (has(n, "H200")) {
    p = {true, "H200", 989.4, 494.7, 66.9, 4.8};
  } else if (has(n, "H100") && has(n, "PCIE")) {
    p = {true, "H100 PCIe", 756.0, 378.0, 51.2, 2.0};
  } else if (has(n, "H100")) {  // "NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 ..."
    p = {true, "H100 SXM", 989.4, 494.7, 66.9, 3.35};
  } else if (has(n, "A100")) {
    const bool gb40 = has(n, "40GB");
    p = {true, gb40 ? "A100 40GB" : "A100 80GB", 312.0, 156.0, 19.5, gb40 ? 1.55 : 2.0};
  }
  return p;
}

double peak_flops(const DevicePeaks& peaks, const std::string& precision) {
  if (!peaks.known) return 0.0;
  if (precision == "fp32") return peaks.fp32_tflops * 1e12;
  if (precision == "tf32") return peaks.tf32_tflops * 1e12;
  if (precision == "bf16" || precision == "fp16") return peaks.bf16_tflops * 1e12;
  return 0.0;
}

double peak_bytes_per_second(const DevicePeaks& peaks) {
  return peaks.known ? peaks.hbm_tbytes_per_s * 1e12 : 0.0;
}

double roofline_seconds(double flops, double bytes, double peak_flops_per_s,
                        double peak_bytes_per_s) {
  if (peak_flops_per_s <= 0 || peak_bytes_per_s <= 0) return 0.0;
  return std::max(flops / peak_flops_per_s, bytes / peak_bytes_per_s);
}

void check_precision(const std::string& precision) {
  if (precision == "fp32" || precision == "tf32" || precision == "bf16" || precision == "fp16") {
    return;
  }
  STRATA_THROW() << "--precision " << precision << " is not one of fp32, tf32, bf16, fp16";
}

}  // namespace strata::tools
