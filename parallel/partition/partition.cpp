// Partitions of a model's layers into pipeline stages: parsing, uniform, and the balanced DP.
//
// The balanced partition is the classic min-max contiguous split. best[k][j] = the smallest
// possible slowest-stage time when layers [0, j) run on stages 0..k:
//   best[0][j] = cost(0, 0, j)
//   best[k][j] = min over i in [k, j) of max(best[k-1][i], cost(k, i, j))
// where cost(k, i, j) is stage k's time on layers [i, j), or +inf when that stage would not fit
// the memory limit (memory depends on k through the micro-batches in flight). The answer is
// best[S-1][L]; O(S L^2) evaluations of cost, each O(1) from prefix sums. Scanning i upwards and
// keeping only strict improvements picks the earliest cut among the minimizers, which gives the
// tie-break documented in partition.h. The same DP over memory instead of time finds the
// partition needing the least memory, which is what an infeasibility error reports.
//
// Numerics: stage sums come from prefix sums in double, and every caller (the DP, the
// evaluation of a given partition, the tests' brute force) goes through the same StageModel, so
// equal partitions get bit-identical times and ties are compared exactly.
#include "parallel/partition/partition.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "engine/allocator.h"
#include "engine/check.h"
#include "graph/model.h"
#include "graph/profiler.h"

namespace strata::parallel {

std::vector<LayerCost> layer_costs(const std::vector<graph::LayerProfile>& profile) {
  std::vector<LayerCost> costs;
  for (const graph::LayerProfile& p : profile) {
    LayerCost c;
    c.name = p.name;
    c.forward_ms = p.forward_ms_per_sample();
    c.backward_ms = p.backward_ms_per_sample();
    c.output_bytes = p.last_batch > 0 ? static_cast<double>(p.output_bytes) / p.last_batch : 0.0;
    c.activation_bytes = p.activation_bytes_per_sample();
    c.param_bytes = static_cast<double>(p.param_bytes);
    auto per_sample = [&p](size_t bytes) {
      return p.last_batch > 0 ? static_cast<double>(bytes) / p.last_batch : 0.0;
    };
    c.saved_bytes = per_sample(p.saved_bytes);
    c.shared_bytes = per_sample(p.shared_bytes);
    c.input_bytes = per_sample(p.input_bytes);
    c.forward_peak_bytes = per_sample(p.forward_peak_bytes);
    c.backward_peak_bytes = per_sample(p.backward_peak_bytes);
    costs.push_back(c);
  }
  return costs;
}

std::vector<LayerCost> parse_profile_json(const std::string& json_text, const std::string& source) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    STRATA_THROW() << "profile " << source << " is not valid JSON: " << e.what()
                   << " (write one with `strata profile --output FILE`)";
  }
  STRATA_CHECK(doc.is_object() && doc.contains("layers") && doc["layers"].is_array())
      << "profile " << source << ": expected an object with a \"layers\" array, as "
      << "`strata profile --output` writes";
  std::vector<LayerCost> costs;
  const nlohmann::json& layers = doc["layers"];
  for (size_t i = 0; i < layers.size(); ++i) {
    const nlohmann::json& l = layers[i];
    auto number = [&](const char* key) {
      STRATA_CHECK(l.is_object() && l.contains(key) && l[key].is_number())
          << "profile " << source << ": layers[" << i << "] lacks the number \"" << key << "\"";
      const double v = l[key].get<double>();
      STRATA_CHECK(v >= 0.0) << "profile " << source << ": layers[" << i << "]." << key
                             << " is negative (" << v << ")";
      return v;
    };
    STRATA_CHECK(l.is_object() && l.contains("name") && l["name"].is_string())
        << "profile " << source << ": layers[" << i << "] lacks the string \"name\"";
    LayerCost c;
    c.name = l["name"].get<std::string>();
    c.forward_ms = number("forward_ms_per_sample");
    c.backward_ms = number("backward_ms_per_sample");
    c.output_bytes = number("output_bytes_per_sample");
    c.activation_bytes = number("activation_bytes_per_sample");
    c.param_bytes = number("param_bytes");
    // Memory planning's fields, absent from older profiles (zero: nothing known).
    auto optional = [&](const char* key) { return l.contains(key) ? number(key) : 0.0; };
    c.saved_bytes = optional("saved_bytes_per_sample");
    c.shared_bytes = optional("shared_bytes_per_sample");
    c.input_bytes = optional("input_bytes_per_sample");
    c.forward_peak_bytes = optional("forward_peak_bytes_per_sample");
    c.backward_peak_bytes = optional("backward_peak_bytes_per_sample");
    costs.push_back(c);
  }
  return costs;
}

std::vector<LayerCost> read_profile_file(const std::string& path) {
  std::ifstream in(path);
  STRATA_CHECK(in.good()) << "cannot read profile '" << path
                          << "' (write one with `strata profile --output " << path << "`)";
  std::stringstream text;
  text << in.rdbuf();
  return parse_profile_json(text.str(), "'" + path + "'");
}

void check_profile_matches(const std::vector<LayerCost>& costs, const graph::Model& model,
                           const std::string& source) {
  const size_t n = std::min(costs.size(), model.size());
  for (size_t i = 0; i < n; ++i) {
    STRATA_CHECK(costs[i].name == model.layer(i).name())
        << "profile " << source << " does not match model " << model.name() << ": layer " << i
        << " is '" << costs[i].name << "' in the profile but '" << model.layer(i).name()
        << "' in the model";
  }
  STRATA_CHECK_EQ(costs.size(), model.size())
      << "profile " << source << " does not match model " << model.name() << ": the profile has "
      << costs.size() << " layers, the model " << model.size() << "; the first without a match is "
      << "layer " << n << " '" << (costs.size() > n ? costs[n].name : model.layer(n).name()) << "'";
}

// ---- partitions ----

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  const size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

bool is_number(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

std::string layer_label(size_t i, const std::vector<std::string>& names) {
  return std::to_string(i) + " (" + names[i] + ")";
}

// A layer given by index or name, or nothing.
std::optional<size_t> find_layer(const std::string& text, const std::vector<std::string>& names) {
  const auto it = std::find(names.begin(), names.end(), text);
  if (it != names.end()) return static_cast<size_t>(it - names.begin());
  if (is_number(text) && text.size() < 10) {
    const size_t index = std::stoul(text);
    if (index < names.size()) return index;
  }
  return std::nullopt;
}

size_t resolve_layer(const std::string& text, const std::string& range,
                     const std::vector<std::string>& names, const std::string& flag) {
  if (const std::optional<size_t> i = find_layer(text, names)) return *i;
  std::ostringstream o;
  o << flag << " range '" << range << "': ";
  if (is_number(text)) {
    o << "layer index " << text << " is out of range (the model has " << names.size()
      << " layers, 0-" << names.size() - 1 << ")";
  } else {
    o << "no layer is named '" << text << "' (layers:";
    for (const std::string& n : names) o << " " << n;
    o << ")";
  }
  STRATA_THROW() << o.str();
}

}  // namespace

// FIRST-LAST, or one layer; names may themselves hold dashes, so every split is tried.
std::pair<size_t, size_t> parse_layer_range(const std::string& range,
                                            const std::vector<std::string>& names,
                                            const std::string& flag) {
  if (const std::optional<size_t> one = find_layer(range, names)) return {*one, *one};
  for (size_t p = range.find('-'); p != std::string::npos; p = range.find('-', p + 1)) {
    const std::optional<size_t> a = find_layer(trim(range.substr(0, p)), names);
    const std::optional<size_t> b = find_layer(trim(range.substr(p + 1)), names);
    if (a && b) return {*a, *b};
  }
  const size_t dash = range.find('-');
  if (dash == std::string::npos) {
    const size_t one = resolve_layer(range, range, names, flag);  // throws: names no layer
    return {one, one};
  }
  const size_t first = resolve_layer(trim(range.substr(0, dash)), range, names, flag);
  return {first, resolve_layer(trim(range.substr(dash + 1)), range, names, flag)};
}

Partition parse_partition(const std::string& text, const std::vector<std::string>& names,
                          int stages) {
  const size_t L = names.size();
  STRATA_CHECK(stages >= 1 && static_cast<size_t>(stages) <= L)
      << "cannot cut " << L << " layers into " << stages << " stages";
  std::vector<std::string> ranges;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) ranges.push_back(trim(item));
  if (!text.empty() && text.back() == ',') ranges.push_back("");
  STRATA_CHECK_EQ(ranges.size(), static_cast<size_t>(stages))
      << "--partition '" << text << "' has " << ranges.size() << " ranges for " << stages
      << " stages (one FIRST-LAST range of layer indices or names per stage, e.g. 0-3,4-11)";
  Partition partition;
  size_t next = 0;  // the first layer not yet in a stage
  for (const std::string& range : ranges) {
    STRATA_CHECK(!range.empty()) << "--partition '" << text << "': stage " << partition.size()
                                 << " has an empty range";
    const auto [first, last] = parse_layer_range(range, names, "--partition");
    STRATA_CHECK(first <= last) << "--partition range '" << range << "' is empty: it ends at layer "
                                << layer_label(last, names) << " before it begins at layer "
                                << layer_label(first, names);
    STRATA_CHECK(first <= next) << "--partition range '" << range << "' leaves a gap: layers "
                                << layer_label(next, names) << " to "
                                << layer_label(first - 1, names) << " belong to no stage";
    STRATA_CHECK(first >= next) << "--partition range '" << range
                                << "' overlaps the previous range: layer "
                                << layer_label(first, names) << " is already in stage "
                                << partition.size() - 1;
    partition.push_back({first, last + 1});
    next = last + 1;
  }
  STRATA_CHECK_EQ(next, L) << "--partition range '" << ranges.back() << "' ends at layer "
                           << layer_label(next - 1, names) << " but the model has " << L
                           << " layers: layers " << layer_label(next, names) << " to "
                           << layer_label(L - 1, names) << " belong to no stage";
  return partition;
}

Partition uniform_partition(size_t layers, int stages) {
  STRATA_CHECK(stages >= 1 && static_cast<size_t>(stages) <= layers)
      << "cannot cut " << layers << " layers into " << stages << " stages";
  Partition partition;
  const size_t S = static_cast<size_t>(stages), base = layers / S, extra = layers % S;
  size_t begin = 0;
  for (size_t s = 0; s < S; ++s) {
    const size_t end = begin + base + (s < extra ? 1 : 0);
    partition.push_back({begin, end});
    begin = end;
  }
  return partition;
}

std::string partition_string(const Partition& partition, const std::vector<std::string>& names) {
  std::string text;
  for (const LayerRange& r : partition) {
    STRATA_CHECK(r.begin < r.end && r.end <= names.size())
        << "partition_string: range [" << r.begin << ", " << r.end << ") of " << names.size()
        << " layers";
    if (!text.empty()) text += ",";
    text += names[r.begin];
    if (r.end - r.begin > 1) text += "-" + names[r.end - 1];
  }
  return text;
}

int64_t stage_in_flight(ScheduleKind kind, int stages, int stage, int64_t micro_batches) {
  STRATA_CHECK(stage >= 0 && stage < stages)
      << "stage_in_flight: stage " << stage << " of " << stages;
  if (kind == ScheduleKind::kGPipe) return micro_batches;
  return std::min<int64_t>(stages - stage, micro_batches);
}

// ---- stage costs ----

namespace {

// Prefix sums over the layers: the cost of any stage in O(1).
class StageModel {
 public:
  StageModel(const std::vector<LayerCost>& costs, int stages, const PartitionOptions& o)
      : costs_(costs), stages_(stages), o_(o) {
    STRATA_CHECK_GE(o.micro_batches, 1) << "partition: micro-batches";
    STRATA_CHECK_GE(o.micro_batch_size, 1) << "partition: micro-batch size";
    STRATA_CHECK_GT(o.bandwidth_bytes_per_second, 0.0) << "partition: bandwidth";
    STRATA_CHECK_GE(o.optimizer_slots, 0) << "partition: optimizer slots";
    STRATA_CHECK_GE(o.mem_limit_bytes, 0.0) << "partition: memory limit";
    STRATA_CHECK(stages >= 1 && static_cast<size_t>(stages) <= costs.size())
        << "cannot cut " << costs.size() << " layers into " << stages << " stages";
    const size_t L = costs.size();
    forward_.assign(L + 1, 0.0);
    backward_ = compute_ = activation_ = param_ = forward_;
    for (size_t l = 0; l < L; ++l) {
      forward_[l + 1] = forward_[l] + costs[l].forward_ms;
      backward_[l + 1] = backward_[l] + costs[l].backward_ms;
      compute_[l + 1] = compute_[l] + costs[l].forward_ms + costs[l].backward_ms;
      activation_[l + 1] = activation_[l] + costs[l].activation_bytes;
      param_[l + 1] = param_[l] + costs[l].param_bytes;
    }
  }

  size_t layers() const { return costs_.size(); }

  StageEstimate estimate(int k, size_t i, size_t j) const {
    const double mbs = static_cast<double>(o_.micro_batch_size);
    StageEstimate e;
    e.layers = {i, j};
    e.forward_ms = mbs * (forward_[j] - forward_[i]);
    e.backward_ms = mbs * (backward_[j] - backward_[i]);
    e.send_ms = k < stages_ - 1
                    ? 1e3 * mbs * costs_[j - 1].output_bytes / o_.bandwidth_bytes_per_second
                    : 0.0;
    e.time_ms = mbs * (compute_[j] - compute_[i]) + e.send_ms;
    e.in_flight = stage_in_flight(o_.schedule, stages_, k, o_.micro_batches);
    const double params = param_[j] - param_[i];
    const int64_t stashed = stashed_weight_versions(o_.schedule, stages_, k, o_.micro_batches);
    e.param_memory_bytes = params * (2.0 + o_.optimizer_slots + static_cast<double>(stashed));
    e.activation_memory_bytes =
        mbs * (activation_[j] - activation_[i]) * static_cast<double>(e.in_flight);
    e.memory_bytes = e.param_memory_bytes + e.activation_memory_bytes;
    return e;
  }

  bool fits(const StageEstimate& e) const {
    return o_.mem_limit_bytes <= 0.0 || e.memory_bytes <= o_.mem_limit_bytes;
  }

  std::string range_names(const LayerRange& r) const {
    return costs_[r.begin].name + (r.end - r.begin > 1 ? "-" + costs_[r.end - 1].name : "");
  }

  // "stage 0 (layers conv1-pool1) needs 3.20 MiB (...)"
  std::string describe_memory(int k, const StageEstimate& e) const {
    std::ostringstream o;
    o << "stage " << k << " (layers " << range_names(e.layers) << ") needs "
      << format_bytes(static_cast<size_t>(e.memory_bytes)) << ": "
      << format_bytes(static_cast<size_t>(e.param_memory_bytes))
      << " for parameters, gradients and optimizer state"
      << (is_synchronous(o_.schedule) ? "" : " (with stashed weight versions)") << ", "
      << format_bytes(static_cast<size_t>(e.activation_memory_bytes)) << " for the activations of "
      << e.in_flight << " micro-batches of " << o_.micro_batch_size << " samples in flight";
    return o.str();
  }

  std::string partition_names(const Partition& partition) const {
    std::string text;
    for (const LayerRange& r : partition) text += (text.empty() ? "" : ",") + range_names(r);
    return text;
  }

  std::string limit() const {
    return format_bytes(static_cast<size_t>(o_.mem_limit_bytes)) + " per stage";
  }

 private:
  const std::vector<LayerCost>& costs_;
  int stages_;
  PartitionOptions o_;
  std::vector<double> forward_, backward_, compute_, activation_, param_;
};

PartitionPlan make_plan(const StageModel& model, const Partition& partition) {
  PartitionPlan plan;
  plan.partition = partition;
  for (size_t k = 0; k < partition.size(); ++k) {
    const StageEstimate e =
        model.estimate(static_cast<int>(k), partition[k].begin, partition[k].end);
    if (plan.stages.empty() || e.time_ms > plan.slowest_ms) {
      plan.slowest_ms = e.time_ms;
      plan.slowest_stage = k;
    }
    if (!model.fits(e) && plan.memory_error.empty()) {
      plan.memory_error =
          model.describe_memory(static_cast<int>(k), e) + ", over the limit of " + model.limit();
    }
    plan.stages.push_back(e);
  }
  return plan;
}

// min over partitions of max over stages of cost(k, i, j); +inf marks an infeasible stage.
// Returns an empty partition when none is feasible.
Partition min_max_partition(size_t L, int S,
                            const std::function<double(int, size_t, size_t)>& cost) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(S, std::vector<double>(L + 1, inf));
  std::vector<std::vector<size_t>> cut(S, std::vector<size_t>(L + 1, 0));
  for (size_t j = 1; j <= L; ++j) best[0][j] = cost(0, 0, j);
  for (int k = 1; k < S; ++k) {
    // The last stage must end at L; earlier ones leave a layer for each later stage.
    const size_t j_first = k == S - 1 ? L : static_cast<size_t>(k) + 1;
    const size_t j_last = L - static_cast<size_t>(S - 1 - k);
    for (size_t j = j_first; j <= j_last; ++j) {
      for (size_t i = static_cast<size_t>(k); i < j; ++i) {
        if (best[k - 1][i] == inf) continue;
        const double v = std::max(best[k - 1][i], cost(k, i, j));
        if (v < best[k][j]) {
          best[k][j] = v;
          cut[k][j] = i;
        }
      }
    }
  }
  if (best[S - 1][L] == inf) return {};
  Partition partition(S);
  size_t j = L;
  for (int k = S - 1; k > 0; --k) {
    partition[k] = {cut[k][j], j};
    j = cut[k][j];
  }
  partition[0] = {0, j};
  return partition;
}

}  // namespace

PartitionPlan evaluate_partition(const std::vector<LayerCost>& costs, const Partition& partition,
                                 const PartitionOptions& options) {
  const StageModel model(costs, static_cast<int>(partition.size()), options);
  size_t next = 0;
  for (size_t k = 0; k < partition.size(); ++k) {
    STRATA_CHECK(partition[k].begin == next && partition[k].end > partition[k].begin)
        << "partition: stage " << k << " holds layers [" << partition[k].begin << ", "
        << partition[k].end << "), expected a non-empty range starting at layer " << next;
    next = partition[k].end;
  }
  STRATA_CHECK_EQ(next, costs.size())
      << "partition: the stages end at layer " << next << " of " << costs.size();
  return make_plan(model, partition);
}

PartitionPlan balanced_partition(const std::vector<LayerCost>& costs, int stages,
                                 const PartitionOptions& options) {
  const StageModel model(costs, stages, options);
  const double inf = std::numeric_limits<double>::infinity();
  const Partition fastest =
      min_max_partition(model.layers(), stages, [&](int k, size_t i, size_t j) {
        const StageEstimate e = model.estimate(k, i, j);
        return model.fits(e) ? e.time_ms : inf;
      });
  if (!fastest.empty()) return make_plan(model, fastest);
  // Explain with the partition that needs the least memory: its largest stage is over the limit
  // (else that partition would have been feasible).
  const Partition leanest = min_max_partition(
      model.layers(), stages,
      [&](int k, size_t i, size_t j) { return model.estimate(k, i, j).memory_bytes; });
  const PartitionPlan plan = make_plan(model, leanest);
  size_t worst = 0;
  for (size_t k = 1; k < plan.stages.size(); ++k) {
    if (plan.stages[k].memory_bytes > plan.stages[worst].memory_bytes) worst = k;
  }
  STRATA_THROW() << "no partition of the " << costs.size() << " layers into " << stages
                 << " stages fits the memory limit of " << model.limit() << " ("
                 << schedule_name(options.schedule) << ", " << options.micro_batches
                 << " micro-batches): even the partition needing the least memory ("
                 << model.partition_names(leanest) << ") exceeds it: "
                 << model.describe_memory(static_cast<int>(worst), plan.stages[worst]);
}

}  // namespace strata::parallel
