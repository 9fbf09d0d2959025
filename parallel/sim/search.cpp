// Layout search (see search.h).
#include "parallel/sim/search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "engine/allocator.h"
#include "engine/check.h"
#include "parallel/partition/projection.h"

namespace strata::parallel::sim {

Partition choose_partition(const CostModel& costs, int stages, double rows,
                           const std::string& partitioner, ScheduleKind schedule,
                           int64_t micro_batches, double link_bandwidth) {
  const size_t layers = costs.layers.size();
  STRATA_CHECK(stages >= 1 && static_cast<size_t>(stages) <= layers)
      << "--stages " << stages << ": the model has " << layers << " layers to cut";
  if (partitioner == "uniform") return uniform_partition(layers, stages);
  STRATA_CHECK(partitioner == "dp" || partitioner == "projection")
      << "unknown --partitioner '" << partitioner << "' (valid: dp, projection, uniform)";
  std::vector<LayerCost> lc;
  for (const LayerModel& l : costs.layers) {
    LayerCost c;
    c.name = l.work.name;
    c.forward_ms = l.forward_s.at(rows) / rows * 1e3;  // fixed costs spread over the rows
    c.backward_ms = l.backward_s.at(rows) / rows * 1e3;
    c.output_bytes = l.work.output_bytes;
    c.activation_bytes = l.work.own_saved.at(rows) / rows;
    c.param_bytes = l.work.param_bytes;
    lc.push_back(c);
  }
  PartitionOptions po;
  po.schedule = schedule;
  po.micro_batches = micro_batches;
  po.micro_batch_size = std::max<int64_t>(1, std::llround(rows));
  po.bandwidth_bytes_per_second = link_bandwidth;
  if (partitioner == "dp") return balanced_partition(lc, stages, po).partition;
  return projection_partition(lc, stages, po).partition;
}

std::string describe(const Candidate& c) {
  char text[160];
  std::snprintf(text, sizeof(text), "G=%d x S=%d, M=%lld, %s, %s, %s", c.groups, c.stages,
                static_cast<long long>(c.micro_batches), schedule_name(c.schedule),
                memory_policy_name(c.policy), c.partitioner.c_str());
  return text;
}

namespace {

std::string gb(double bytes) { return format_bytes(static_cast<size_t>(std::max(0.0, bytes))); }

}  // namespace

void evaluate_candidate(const CostModel& costs, const Cluster& cluster, const SimConfig& base,
                        double capacity, int64_t batch_size, Candidate* cand) {
  SimConfig c = base;
  c.groups = cand->groups;
  c.stages = cand->stages;
  c.micro_batches = cand->micro_batches;
  c.micro_batch_rows = cand->rows;
  c.schedule = cand->schedule;
  c.partition = cand->partition;
  c.policy.assign(costs.layers.size(), cand->policy);
  c.record_timeline = false;
  StaticOptions so{c.optimizer_slots, c.mixed_precision, 0, c.grad_sync.delay, c.groups > 1};
  for (int s = 0; s < c.stages && capacity > 0; ++s) {
    const StageStatic st = stage_static(costs.layers, c.partition[s], so);
    if (st.total() > capacity) {
      cand->out_of_memory = "stage " + std::to_string(s) + " needs " + gb(st.total()) +
                            " for parameters, gradients and optimizer state alone, more than the " +
                            gb(capacity) + " of a GPU";
      return;
    }
  }
  cand->result = simulate(c, costs, cluster);
  cand->simulated = true;
  const SimResult& r = cand->result;
  for (const StageResult& st : r.stages) {
    if (capacity > 0 && st.peak_bytes > capacity && cand->out_of_memory.empty()) {
      cand->out_of_memory = "stage " + std::to_string(st.stage) + " peaks at " + gb(st.peak_bytes) +
                            " (" + gb(st.static_memory.total()) +
                            " parameters, gradients and optimizer state), more than the " +
                            gb(capacity) + " of a GPU";
    }
  }
  cand->fits = cand->out_of_memory.empty();
  cand->samples_per_s = r.step_time_s > 0 ? static_cast<double>(batch_size) / r.step_time_s : 0.0;
  const StageResult* slowest = &r.stages.front();
  for (const StageResult& st : r.stages) {
    if (st.busy_s > slowest->busy_s) slowest = &st;
  }
  cand->compute_s = slowest->busy_s;
  cand->comm_s = slowest->p2p_exposed_s + slowest->dp_exposed_s + slowest->tied_exposed_s +
                 slowest->swap_exposed_s;
  cand->bubble_s = std::max(0.0, r.step_time_s - cand->compute_s - cand->comm_s);
}

std::vector<Candidate> search_layouts(const CostModel& costs, const Cluster& cluster,
                                      const SearchSpace& space, const SimConfig& base) {
  const int gpus = cluster.gpus;
  const size_t layers = costs.layers.size();
  const double capacity = space.memory_bytes > 0 ? space.memory_bytes : cluster.device.memory_bytes;
  std::vector<int> stage_counts = space.stages;
  if (stage_counts.empty()) {
    for (int s = 1; s <= gpus && static_cast<size_t>(s) <= layers; ++s) {
      if (gpus % s == 0) stage_counts.push_back(s);
    }
  }
  std::vector<Candidate> all;
  std::map<std::tuple<int, int64_t, std::string, int>, Partition> partitions;
  for (int S : stage_counts) {
    if (gpus % S != 0 || static_cast<size_t>(S) > layers) continue;
    const int G = gpus / S;
    if (space.batch_size % G != 0) continue;
    const int64_t per_group = space.batch_size / G;
    std::vector<int64_t> ms = space.micro_batches;
    if (ms.empty()) {
      for (int64_t m = 1; m <= per_group; m *= 2) ms.push_back(m);
    }
    for (int64_t M : ms) {
      if (M < 1 || per_group % M != 0) continue;
      const double rows = static_cast<double>(per_group / M);
      for (ScheduleKind kind : space.schedules) {
        if (S == 1 && kind == ScheduleKind::kGPipe &&
            std::find(space.schedules.begin(), space.schedules.end(), ScheduleKind::k1F1B) !=
                space.schedules.end()) {
          continue;  // one stage: gpipe is 1f1b
        }
        for (const std::string& partitioner : space.partitioners) {
          if (S == 1 && partitioner != space.partitioners.front()) continue;
          const auto key =
              std::make_tuple(S, static_cast<int64_t>(rows), partitioner, static_cast<int>(kind));
          auto it = partitions.find(key);
          if (it == partitions.end()) {
            it = partitions
                     .emplace(key, choose_partition(costs, S, rows, partitioner, kind, M,
                                                    cluster.intra.bandwidth))
                     .first;
          }
          for (MemoryPolicy policy : space.policies) {
            Candidate c;
            c.groups = G;
            c.stages = S;
            c.micro_batches = M;
            c.rows = rows;
            c.schedule = kind;
            c.policy = policy;
            c.partitioner = partitioner;
            c.partition = it->second;
            evaluate_candidate(costs, cluster, base, capacity, space.batch_size, &c);
            all.push_back(std::move(c));
          }
        }
      }
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    if (a.fits != b.fits) return a.fits;
    return a.samples_per_s > b.samples_per_s;
  });
  if (all.empty() || !all.front().fits) {
    for (Candidate& c : all) c.reason = "out of memory: " + c.out_of_memory;
    return all;
  }
  const Candidate& best = all.front();
  const double b = static_cast<double>(space.batch_size);
  for (size_t i = 1; i < all.size(); ++i) {
    Candidate& c = all[i];
    if (!c.fits) {
      c.reason = "out of memory: " + c.out_of_memory;
      continue;
    }
    const double parts[3] = {(c.compute_s - best.compute_s) / b, (c.comm_s - best.comm_s) / b,
                             (c.bubble_s - best.bubble_s) / b};
    const int k = static_cast<int>(std::max_element(parts, parts + 3) - parts);
    char text[200];
    const double step = c.result.step_time_s;
    const double best_step = best.result.step_time_s;
    if (k == 0) {
      std::snprintf(text, sizeof(text),
                    "compute: %.3g ms per sample on its slowest stage vs %.3g%s",
                    1e3 * c.compute_s / b, 1e3 * best.compute_s / b,
                    c.policy == MemoryPolicy::kRecompute ? " (recompute)" : "");
    } else if (k == 1) {
      std::snprintf(text, sizeof(text),
                    "communication: %.0f%% of its step exposed vs %.0f%% (%.3g vs %.3g ms per "
                    "sample)",
                    100 * c.comm_s / step, 100 * best.comm_s / best_step, 1e3 * c.comm_s / b,
                    1e3 * best.comm_s / b);
    } else {
      std::snprintf(text, sizeof(text), "bubble: %.0f%% of its step idle vs %.0f%%",
                    100 * c.bubble_s / step, 100 * best.bubble_s / best_step);
    }
    c.reason = text;
  }
  return all;
}

}  // namespace strata::parallel::sim
