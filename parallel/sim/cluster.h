// The hardware a simulated run is laid out on: a device (peak rate, memory bandwidth, memory
// capacity, host link), link classes with a latency and a bandwidth, and a cluster of nodes x GPUs
// per node with one link class inside a node and one between nodes.
//
// Placement: rank r (= g * S + s, parallel/topology.h) runs on GPU r, and GPU r sits on node
// r / gpus_per_node, as mpirun/srun place consecutive ranks on a node. Two ranks on one node talk
// over the intra-node link, on two nodes over the inter-node link (one NIC per GPU: its bandwidth
// is per GPU).
//
// Built-in devices (dense 16-bit tensor-core peak; SXM parts; memory bandwidth and capacity as
// NVIDIA's data sheets give them):
//   h100  989 TFLOP/s bf16, 494 TF32, 67 fp32; 3.35 TB/s HBM3, 80 GB; NVLink 4 (450 GB/s per
//         direction); 50 GB/s to the host (PCIe 5)
//   h200  as h100 with 4.8 TB/s HBM3e and 141 GB
//   a100  312 TFLOP/s bf16, 156 TF32, 19.5 fp32; 2.039 TB/s HBM2e, 80 GB; NVLink 3 (300 GB/s
//         per direction); 25 GB/s to the host (PCIe 4)
// Every field can be overridden (tools/simulate_command.cpp: --device-tflops, ...), and a device
// of any name is made from flags alone.
//
// Link classes (latency per message, bandwidth per direction):
//   same-device   1 us, the device's memory bandwidth / 2 (a copy reads and writes)
//   nvlink        3 us, the device's NVLink bandwidth
//   pcie          5 us, 25 GB/s (PCIe 4 x16 in practice; 50 for PCIe 5: override)
//   infiniband    6 us, 50 GB/s (NDR 400 Gb/s, one NIC per GPU)
//   ethernet     25 us, 12.5 GB/s (100 GbE)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::parallel::sim {

struct DeviceSpec {
  std::string name;
  double peak_flops = 0.0;        // dense 16-bit tensor-core FLOP/s (bf16, fp16)
  double peak_flops_tf32 = 0.0;   // dense TF32 tensor-core FLOP/s (--precision tf32)
  double peak_flops_fp32 = 0.0;   // plain fp32 FLOP/s (--precision fp32)
  double memory_bandwidth = 0.0;  // bytes/s
  double memory_bytes = 0.0;      // capacity
  double nvlink_bandwidth = 0.0;  // bytes/s per direction
  double host_bandwidth = 0.0;    // bytes/s per direction to pinned host memory (swap)
  double launch_seconds = 0.0;    // per kernel launch (overhead of a layer's kernels)
};

// "h100", "h200", "a100"; anything else throws naming the valid ones.
DeviceSpec builtin_device(const std::string& name);
std::vector<std::string> builtin_device_names();

enum class LinkClass { kSameDevice, kNvlink, kPcie, kInfiniband, kEthernet };
LinkClass parse_link_class(const std::string& name);  // throws naming the valid ones
const char* link_class_name(LinkClass kind);

struct LinkSpec {
  LinkClass kind = LinkClass::kNvlink;
  double latency_s = 0.0;
  double bandwidth = 0.0;  // bytes/s per direction
  // Seconds for one message of `bytes` over this link: latency + bytes / bandwidth.
  double message_seconds(double bytes) const;
};

// The defaults of the table above for `kind` on `device`.
LinkSpec default_link(LinkClass kind, const DeviceSpec& device);

struct Cluster {
  DeviceSpec device;
  int gpus = 1;
  int gpus_per_node = 8;
  LinkSpec intra;  // between two GPUs of a node
  LinkSpec inter;  // between GPUs of two nodes
  LinkSpec local;  // same device (two ranks on one GPU; not used by the placement above)

  int nodes() const { return (gpus + gpus_per_node - 1) / gpus_per_node; }
  int node_of(int gpu) const { return gpu / gpus_per_node; }
  // The link between the GPUs of two ranks.
  const LinkSpec& link(int rank_a, int rank_b) const;
};

// A cluster of `gpus` GPUs of `device`, `gpus_per_node` each, NVLink inside a node (PCIe for a
// device without NVLink) and InfiniBand between nodes. Throws for gpus < 1 or gpus_per_node < 1.
Cluster make_cluster(const DeviceSpec& device, int gpus, int gpus_per_node);

// Throws strata::Error when `ranks` ranks do not fit the cluster (more ranks than GPUs), naming
// both numbers and the flags.
void check_fits(const Cluster& cluster, int ranks);

}  // namespace strata::parallel::sim
