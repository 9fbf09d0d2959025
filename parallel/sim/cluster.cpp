// Device and link tables, and the placement of ranks on a cluster (see cluster.h).
#include "parallel/sim/cluster.h"

#include "engine/check.h"

namespace strata::parallel::sim {

DeviceSpec builtin_device(const std::string& name) {
  DeviceSpec d;
  d.name = name;
  d.launch_seconds = 4e-6;
  if (name == "h100") {
    d.peak_flops = 989e12;
    d.peak_flops_tf32 = 494e12;
    d.peak_flops_fp32 = 67e12;
    d.memory_bandwidth = 3.35e12;
    d.memory_bytes = 80e9;
    d.nvlink_bandwidth = 450e9;
    d.host_bandwidth = 50e9;  // PCIe 5 x16, measured host-to-device in practice
    return d;
  }
  if (name == "h200") {
    d.peak_flops = 989e12;
    d.peak_flops_tf32 = 494e12;
    d.peak_flops_fp32 = 67e12;
    d.memory_bandwidth = 4.8e12;
    d.memory_bytes = 141e9;
    d.nvlink_bandwidth = 450e9;
    d.host_bandwidth = 50e9;
    return d;
  }
  if (name == "a100") {
    d.peak_flops = 312e12;
    d.peak_flops_tf32 = 156e12;
    d.peak_flops_fp32 = 19.5e12;
    d.memory_bandwidth = 2.039e12;
    d.memory_bytes = 80e9;
    d.nvlink_bandwidth = 300e9;
    d.host_bandwidth = 25e9;  // PCIe 4 x16
    return d;
  }
  STRATA_THROW() << "unknown device model '" << name << "' (valid: h100, h200, a100)";
}

std::vector<std::string> builtin_device_names() { return {"h100", "h200", "a100"}; }

LinkClass parse_link_class(const std::string& name) {
  if (name == "same-device") return LinkClass::kSameDevice;
  if (name == "nvlink") return LinkClass::kNvlink;
  if (name == "pcie") return LinkClass::kPcie;
  if (name == "infiniband" || name == "ib") return LinkClass::kInfiniband;
  if (name == "ethernet") return LinkClass::kEthernet;
  STRATA_THROW() << "unknown link '" << name
                 << "' (valid: same-device, nvlink, pcie, infiniband, ethernet)";
}

const char* link_class_name(LinkClass kind) {
  switch (kind) {
    case LinkClass::kSameDevice:
      return "same-device";
    case LinkClass::kNvlink:
      return "nvlink";
    case LinkClass::kPcie:
      return "pcie";
    case LinkClass::kInfiniband:
      return "infiniband";
    case LinkClass::kEthernet:
      return "ethernet";
  }
  return "?";
}

double LinkSpec::message_seconds(double bytes) const {
  return latency_s + (bytes > 0.0 ? bytes / bandwidth : 0.0);
}

LinkSpec default_link(LinkClass kind, const DeviceSpec& device) {
  LinkSpec l;
  l.kind = kind;
  switch (kind) {
    case LinkClass::kSameDevice:
      l.latency_s = 1e-6;
      l.bandwidth = device.memory_bandwidth > 0 ? device.memory_bandwidth / 2 : 100e9;
      break;
    case LinkClass::kNvlink:
      STRATA_CHECK(device.nvlink_bandwidth > 0.0)
          << "device " << device.name << " has no NVLink (give its bandwidth, or another link)";
      l.latency_s = 3e-6;
      l.bandwidth = device.nvlink_bandwidth;
      break;
    case LinkClass::kPcie:
      l.latency_s = 5e-6;
      l.bandwidth = 25e9;
      break;
    case LinkClass::kInfiniband:
      l.latency_s = 6e-6;
      l.bandwidth = 50e9;
      break;
    case LinkClass::kEthernet:
      l.latency_s = 25e-6;
      l.bandwidth = 12.5e9;
      break;
  }
  return l;
}

const LinkSpec& Cluster::link(int rank_a, int rank_b) const {
  if (rank_a == rank_b) return local;
  return node_of(rank_a) == node_of(rank_b) ? intra : inter;
}

Cluster make_cluster(const DeviceSpec& device, int gpus, int gpus_per_node) {
  STRATA_CHECK(gpus >= 1) << "--gpus must be at least 1, got " << gpus;
  STRATA_CHECK(gpus_per_node >= 1) << "--gpus-per-node must be at least 1, got " << gpus_per_node;
  Cluster c;
  c.device = device;
  c.gpus = gpus;
  c.gpus_per_node = gpus_per_node;
  c.intra =
      default_link(device.nvlink_bandwidth > 0 ? LinkClass::kNvlink : LinkClass::kPcie, device);
  c.inter = default_link(LinkClass::kInfiniband, device);
  c.local = default_link(LinkClass::kSameDevice, device);
  return c;
}

void check_fits(const Cluster& cluster, int ranks) {
  STRATA_CHECK(ranks <= cluster.gpus)
      << "the layout needs " << ranks << " ranks (--groups x --stages) but the cluster has "
      << cluster.gpus << " GPUs (--gpus " << cluster.gpus << "): one rank per GPU";
}

}  // namespace strata::parallel::sim
