// Parsing and printing per-layer memory policies.
#include "parallel/runtime/memory_plan.h"

#include <sstream>

#include "engine/check.h"
#include "parallel/partition/partition.h"

namespace strata::parallel {
namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  const size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

const char* memory_policy_name(MemoryPolicy policy) {
  switch (policy) {
    case MemoryPolicy::kKeep:
      return "keep";
    case MemoryPolicy::kSwap:
      return "swap";
    case MemoryPolicy::kRecompute:
      return "recompute";
  }
  return "?";
}

MemoryPolicy parse_memory_policy(const std::string& name, const std::string& flag) {
  if (name == "keep") return MemoryPolicy::kKeep;
  if (name == "swap") return MemoryPolicy::kSwap;
  if (name == "recompute") return MemoryPolicy::kRecompute;
  STRATA_THROW() << flag << ": unknown memory policy '" << name
                 << "' (valid: keep, swap, recompute)";
}

MemoryPlan MemoryPlan::uniform(size_t layers, MemoryPolicy policy) {
  MemoryPlan plan;
  plan.layers.assign(layers, policy);
  return plan;
}

bool MemoryPlan::uses(MemoryPolicy policy, size_t begin, size_t end) const {
  for (size_t i = begin; i < end; ++i) {
    if (at(i) == policy) return true;
  }
  return false;
}

MemoryPlan parse_memory_plan(const std::string& spec, const std::vector<std::string>& names,
                             const MemoryPlan& base) {
  MemoryPlan plan = base;
  plan.layers.resize(names.size(), MemoryPolicy::kKeep);
  if (trim(spec).empty()) return plan;
  std::stringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    item = trim(item);
    const size_t colon = item.rfind(':');
    STRATA_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < item.size())
        << "--memory-plan '" << spec << "': item '" << item
        << "' is not RANGE:POLICY (e.g. blocks.0-blocks.3:recompute or 4:swap)";
    const MemoryPolicy policy =
        parse_memory_policy(trim(item.substr(colon + 1)), "--memory-plan item '" + item + "'");
    const auto [first, last] =
        parse_layer_range(trim(item.substr(0, colon)), names, "--memory-plan");
    STRATA_CHECK(first <= last) << "--memory-plan item '" << item << "' is an empty range";
    for (size_t i = first; i <= last; ++i) plan.layers[i] = policy;
  }
  return plan;
}

std::string describe_memory_plan(const MemoryPlan& plan, size_t begin, size_t end,
                                 const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = begin; i < end;) {
    size_t j = i + 1;
    while (j < end && plan.at(j) == plan.at(i)) ++j;
    if (!text.empty()) text += ", ";
    text += std::string(memory_policy_name(plan.at(i))) + " " + names.at(i);
    if (j - i > 1) text += "-" + names.at(j - 1);
    i = j;
  }
  return text;
}

std::vector<RecomputeSegment> recompute_segments(const MemoryPlan& plan, size_t begin, size_t end) {
  std::vector<RecomputeSegment> segments;
  for (size_t i = begin; i < end; ++i) {
    if (plan.at(i) != MemoryPolicy::kRecompute) continue;
    if (segments.empty() || segments.back().end != i) segments.push_back({i, i});
    segments.back().end = i + 1;
  }
  return segments;
}

}  // namespace strata::parallel
