// What a stage does with the tensors each layer saves for its backward (vPIPE's per-tensor
// policy, ../shared/papers/vpipe.md §2.1, applied per layer):
//
//   keep       the saved tensors stay on the device until the layer's backward (D_i = 1);
//   swap       they move to a host pool after the layer's forward and are copied back before
//              its backward, while the stage computes other work (S_i = 1);
//   recompute  they are dropped, and so is the layer's output; before the backward, the forward
//              of the run of consecutive recompute layers is replayed from that run's input,
//              which is kept (R_i = 1; recompute everywhere is GPipe's re-materialization of a
//              stage from its input).
//
// `--memory-policy keep|swap|recompute` sets every layer; `--memory-plan SPEC` then sets layers
// by name or index range: "blocks.0-blocks.3:recompute,blocks.4:swap" or "1-6:swap".
// `--memory-policy auto` asks vPIPE's planner (parallel/vpipe/) for a plan under --mem-limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace strata::parallel {

enum class MemoryPolicy : uint8_t { kKeep, kSwap, kRecompute };

const char* memory_policy_name(MemoryPolicy policy);  // "keep", "swap", "recompute"
// keep|swap|recompute; throws naming `flag` and the valid values otherwise.
MemoryPolicy parse_memory_policy(const std::string& name, const std::string& flag);

// One policy per layer of the model (not per stage: a layer keeps its policy on any stage).
struct MemoryPlan {
  std::vector<MemoryPolicy> layers;

  static MemoryPlan uniform(size_t layers, MemoryPolicy policy);
  MemoryPolicy at(size_t layer) const { return layer < layers.size() ? layers[layer] : kKeepAll; }
  // Whether any layer of [begin, end) has `policy`.
  bool uses(MemoryPolicy policy, size_t begin, size_t end) const;
  bool operator==(const MemoryPlan& o) const { return layers == o.layers; }

 private:
  static constexpr MemoryPolicy kKeepAll = MemoryPolicy::kKeep;
};

// `base` with the layers named by `spec` ("RANGE:POLICY,RANGE:POLICY", ranges as --partition
// writes them) set. An empty spec returns `base`. Errors name --memory-plan, the item, and for
// an unknown layer list the layers.
MemoryPlan parse_memory_plan(const std::string& spec, const std::vector<std::string>& names,
                             const MemoryPlan& base);

// Layers [begin, end) as runs of one policy: "keep embed-blocks.1, recompute blocks.2-head".
std::string describe_memory_plan(const MemoryPlan& plan, size_t begin, size_t end,
                                 const std::vector<std::string>& names);

// A run of consecutive recompute layers, [begin, end), within a stage: replayed as one segment.
struct RecomputeSegment {
  size_t begin = 0;
  size_t end = 0;
};
// The recompute segments of layers [begin, end) under `plan`, in order.
std::vector<RecomputeSegment> recompute_segments(const MemoryPlan& plan, size_t begin, size_t end);

}  // namespace strata::parallel
