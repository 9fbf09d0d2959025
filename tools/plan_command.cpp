// `strata plan`: per-layer costs (a profile JSON, or a short profiling run at the micro-batch
// size), then the balanced partition (parallel/partition), the uniform one and optionally a
// manual one, and GroPipe's projection partition (AMPA, parallel/partition/projection.h), each
// with per-stage compute, send time and memory. The step time is predicted by
// simulating the schedule's instruction lists with each stage's cost per micro-batch (forward +
// send of its activations, backward), so the bubble of the chosen schedule and the imbalance of
// the stages are both in it. `--planner dynpipe` adds DynPipe's plan (tools/plan_dynpipe.h).
#include "tools/plan_command.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/exec_context.h"
#include "parallel/partition/partition.h"
#include "parallel/partition/projection.h"
#include "parallel/runtime/copy_engine.h"
#include "parallel/schedule/schedule.h"
#include "parallel/vpipe/swap_recompute_planner.h"
#include "tools/common.h"
#include "tools/plan_dynpipe.h"

namespace strata::tools {

CLI::App* add_plan_command(CLI::App& app, PlanOptions& o) {
  CLI::App* cmd =
      app.add_subcommand("plan", "Partition a model into pipeline stages and predict step time");
  cmd->option_defaults()->always_capture_default();
  add_model_flags(cmd, o.model);
  cmd->add_option("--stages", o.stages, "Pipeline stages S");
  cmd->add_option("--micro-batches", o.micro_batches, "Micro-batches M per step");
  cmd->add_option("--batch-size", o.batch_size, "Samples per step (M micro-batches)");
  cmd->add_option("--schedule", o.schedule, "Pipeline schedule: gpipe, 1f1b, async-1f1b, 2bw");
  cmd->add_option("--profile", o.profile,
                  "Profile JSON from `strata profile --output` (empty = profile now)");
  cmd->add_option("--profile-steps", o.profile_steps, "Steps when profiling now");
  cmd->add_option("--bandwidth", o.bandwidth_gbps, "Link bandwidth between stages, GB/s");
  cmd->add_option("--mem-limit", o.mem_limit, "Memory per stage, e.g. 2GiB (empty = no limit)");
  cmd->add_option("--optimizer-slots", o.optimizer_slots,
                  "Optimizer state tensors per parameter (AdamW 2, SGD momentum 1)");
  cmd->add_option("--partition", o.partition,
                  "Evaluate this partition too: FIRST-LAST per stage, by index or name");
  cmd->add_option("--memory-policy", o.memory_policy,
                  "keep (every layer keeps its saved tensors), or auto: vPIPE's swap/recompute "
                  "plan per stage of the balanced partition under --mem-limit, with each stage's "
                  "predicted peak memory and step time")
      ->check(CLI::IsMember({"keep", "auto"}));
  cmd->add_option("--swap-bandwidth", o.swap_bandwidth_gbps,
                  "Host-device copy bandwidth for swap, GB/s (0 = measure this machine's)");
  cmd->add_option("--precision", o.precision,
                  "fp32, or bf16/fp16 (16-bit working copies of the weights in the memory model)")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
  cmd->add_option("--ampa-normalize", o.ampa_normalize,
                  "The projection partition: balance min-max normalized layer times (on, "
                  "GroPipe's Eq. 9) or raw ones (off)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--ampa-threshold", o.ampa_threshold,
                  "The projection partition: AMPA stops when PD / mean of the stage times is at "
                  "most this");
  cmd->add_option("--ampa-guard", o.ampa_guard,
                  "The projection partition: even (the even split when AMPA's is slower), dp (the "
                  "fastest of AMPA's, the even split and the balanced one), off (AMPA's alone)")
      ->check(CLI::IsMember({"off", "even", "dp"}));
  add_dynpipe_flags(cmd, o);
  cmd->add_option("--threads", o.model.threads, "CPU threads when profiling now (0 = all)");
  cmd->add_option("--seed", o.model.seed, "Seed of the weights when profiling now");
  return cmd;
}

namespace {

struct Prediction {
  parallel::PartitionPlan plan;
  parallel::Simulation simulation;
};

// The plan's stages, run through the schedule's simulation.
Prediction predict(parallel::PartitionPlan plan, const parallel::PartitionOptions& po) {
  Prediction p{std::move(plan), {}};
  std::vector<double> forward, backward;
  for (const parallel::StageEstimate& e : p.plan.stages) {
    forward.push_back(e.forward_ms + e.send_ms);
    backward.push_back(e.backward_ms);
  }
  const parallel::Schedule schedule = parallel::make_schedule(
      po.schedule, static_cast<int>(p.plan.partition.size()), po.micro_batches);
  p.simulation = parallel::simulate_schedule(schedule, forward, backward);
  return p;
}

void print_prediction(const std::string& title, const Prediction& p,
                      const std::vector<std::string>& names, const parallel::PartitionOptions& po) {
  const parallel::PartitionPlan& plan = p.plan;
  std::printf("\n%s: --partition %s\n", title.c_str(),
              parallel::partition_string(plan.partition, names).c_str());
  std::printf("  %-5s %-24s %9s %9s %9s %9s %9s %12s\n", "stage", "layers", "fwd ms", "bwd ms",
              "send ms", "time ms", "in flight", "memory");
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const parallel::StageEstimate& e = plan.stages[s];
    const size_t count = e.layers.end - e.layers.begin;
    const std::string range = std::to_string(e.layers.begin) + "-" +
                              std::to_string(e.layers.end - 1) + " (" + std::to_string(count) +
                              (count == 1 ? " layer)" : " layers)");
    const bool over = po.mem_limit_bytes > 0 && e.memory_bytes > po.mem_limit_bytes;
    std::printf("  %-5zu %-24s %9.3f %9.3f %9.3f %9.3f %9lld %12s%s\n", s, range.c_str(),
                e.forward_ms, e.backward_ms, e.send_ms, e.time_ms,
                static_cast<long long>(e.in_flight),
                format_bytes(static_cast<size_t>(e.memory_bytes)).c_str(), over ? " !" : "");
  }
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    std::string layer_names;
    for (size_t l = plan.stages[s].layers.begin; l < plan.stages[s].layers.end; ++l) {
      layer_names += " " + names[l];
    }
    std::printf("  stage %zu:%s\n", s, layer_names.c_str());
  }
  std::printf("  slowest stage: %zu, %.3f ms per micro-batch\n", plan.slowest_stage,
              plan.slowest_ms);
  std::vector<double> forward, backward;
  for (const parallel::StageEstimate& e : plan.stages) {
    forward.push_back(e.forward_ms + e.send_ms);
    backward.push_back(e.backward_ms);
  }
  std::printf("  GroPipe projection (Eqs. 1-7, T_F + T_B): %.3f ms\n",
              parallel::projected_step_time(forward, backward, po.micro_batches));
  const double ideal = static_cast<double>(po.micro_batches) * plan.slowest_ms;
  std::printf(
      "  predicted %s: %.3f ms (bubble %.1f%%); %lld x slowest stage = %.3f ms\n",
      parallel::is_synchronous(po.schedule) ? "step time" : "time of a run of M micro-batches",
      p.simulation.makespan, 100.0 * p.simulation.bubble_fraction,
      static_cast<long long>(po.micro_batches), ideal);
  if (!plan.memory_error.empty())
    std::printf("  over the memory limit: %s\n", plan.memory_error.c_str());
}

// vPIPE's plan for each stage of `p`: the layers' policies, predicted peak against the limit, and
// the step time of the schedule with each stage's Eq. 2 costs.
void print_memory_plan(const PlanOptions& o, const std::vector<parallel::LayerCost>& costs,
                       const std::vector<std::string>& names, const Prediction& p,
                       const parallel::PartitionOptions& po) {
  parallel::StageSetting setting;
  setting.schedule = po.schedule;
  setting.micro_batches = po.micro_batches;
  setting.optimizer_slots = o.optimizer_slots;
  setting.mixed = o.precision == "bf16" || o.precision == "fp16";
  if (o.swap_bandwidth_gbps > 0) {
    setting.bandwidth = o.swap_bandwidth_gbps * 1e9;
  } else {
    CpuAllocator device, pool;
    ExecContext ctx(Device::cpu(), &device, 1);
    setting.bandwidth = parallel::measure_copy_bandwidth(ctx, pool);
  }
  const std::vector<parallel::LayerMemoryCost> layers =
      parallel::layer_memory_costs(costs, po.micro_batch_size);
  const double limit = o.mem_limit.empty() ? 0.0 : static_cast<double>(parse_bytes(o.mem_limit));
  const parallel::PipelinePlan plan =
      parallel::plan_pipeline(layers, p.plan.partition, setting, limit);
  std::printf(
      "\nmemory plan (--memory-policy auto, vPIPE Algorithm 2) of the partition %s, "
      "host-device copies at %s GB/s%s:\n",
      parallel::partition_string(p.plan.partition, names).c_str(),
      format_number(setting.bandwidth / 1e9).c_str(),
      o.swap_bandwidth_gbps > 0 ? "" : " (measured)");
  std::printf("  %-5s %12s %12s %12s %10s %10s  %s\n", "stage", "keep peak", "planned peak",
              "limit", "fwd ms", "bwd ms", "plan");
  std::vector<double> forward, backward;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const parallel::StagePlan& sp = plan.stages[s];
    const parallel::LayerRange& r = p.plan.partition[s];
    parallel::StageSetting at = setting;
    at.stage = static_cast<int>(s);
    at.stages = static_cast<int>(plan.stages.size());
    const std::vector<parallel::LayerMemoryCost> stage(layers.begin() + r.begin,
                                                       layers.begin() + r.end);
    const double keep =
        parallel::estimate_stage_memory(
            stage, r.begin,
            parallel::MemoryPlan::uniform(names.size(), parallel::MemoryPolicy::kKeep), at)
            .peak_bytes;
    std::printf("  %-5zu %12s %12s %12s %10.3f %10.3f  %s%s\n", s,
                format_bytes(static_cast<size_t>(keep)).c_str(),
                format_bytes(static_cast<size_t>(sp.memory.peak_bytes)).c_str(),
                o.mem_limit.empty() ? "none" : o.mem_limit.c_str(), 1e3 * sp.time.forward_s,
                1e3 * sp.time.backward_s,
                parallel::describe_memory_plan(plan.plan, r.begin, r.end, names).c_str(),
                sp.feasible ? "" : " (does not fit)");
    forward.push_back(1e3 * sp.time.forward_s + p.plan.stages[s].send_ms);
    backward.push_back(1e3 * sp.time.backward_s);
  }
  const parallel::Schedule schedule = parallel::make_schedule(
      po.schedule, static_cast<int>(p.plan.partition.size()), po.micro_batches);
  const parallel::Simulation sim = parallel::simulate_schedule(schedule, forward, backward);
  std::printf("  predicted %s with the plan: %.3f ms (keep: %.3f ms)%s\n",
              parallel::is_synchronous(po.schedule) ? "step time" : "run of M micro-batches",
              sim.makespan, p.simulation.makespan,
              plan.feasible ? "" : "; no plan fits every stage under the limit");
}

}  // namespace

int run_plan(const PlanOptions& o) {
  const parallel::ScheduleKind kind = parallel::parse_schedule(o.schedule);
  STRATA_CHECK(o.stages >= 1) << "--stages must be at least 1, got " << o.stages;
  STRATA_CHECK(o.micro_batches >= 1)
      << "--micro-batches must be at least 1, got " << o.micro_batches;
  STRATA_CHECK(o.batch_size >= o.micro_batches && o.batch_size % o.micro_batches == 0)
      << "--batch-size " << o.batch_size << " must be a positive multiple of --micro-batches "
      << o.micro_batches;
  STRATA_CHECK(o.bandwidth_gbps > 0.0)
      << "--bandwidth must be positive (GB/s), got " << o.bandwidth_gbps;
  STRATA_CHECK(o.optimizer_slots >= 0) << "--optimizer-slots must be >= 0";
  STRATA_CHECK(o.profile_steps >= 1) << "--profile-steps must be at least 1";
  STRATA_CHECK(std::isfinite(o.ampa_threshold) && o.ampa_threshold >= 0)
      << "--ampa-threshold must be >= 0, got " << o.ampa_threshold;
  check_dynpipe_options(o);
  parallel::PartitionOptions po;
  po.schedule = kind;
  po.micro_batches = o.micro_batches;
  po.micro_batch_size = o.batch_size / o.micro_batches;
  po.bandwidth_bytes_per_second = o.bandwidth_gbps * 1e9;
  po.mem_limit_bytes = o.mem_limit.empty() ? 0.0 : static_cast<double>(parse_bytes(o.mem_limit));
  // With vPIPE's plan the memory limit is met per stage by swap and recompute, not by the cut.
  if (o.memory_policy == "auto") po.mem_limit_bytes = 0.0;
  po.optimizer_slots = o.optimizer_slots;

  std::unique_ptr<graph::Model> model;
  std::vector<parallel::LayerCost> costs;
  std::string dataset, source;
  if (o.profile.empty()) {
    ProfileOptions p = o.model;
    p.batch_size = po.micro_batch_size;
    p.steps = o.profile_steps;
    ModelProfile profile = profile_model(p);
    model = std::move(profile.model);
    dataset = profile.dataset;
    costs = parallel::layer_costs(profile.profiler->layers());
    source = "measured now: " + std::to_string(o.profile_steps) + " steps of " +
             std::to_string(po.micro_batch_size) + " samples, " + profile.threads;
  } else {
    model = load_cli_model(o.model, &dataset);
    costs = parallel::read_profile_file(o.profile);
    parallel::check_profile_matches(costs, *model, "'" + o.profile + "'");
    source = o.profile;
  }
  std::vector<std::string> names;
  for (size_t l = 0; l < model->size(); ++l) names.push_back(model->layer(l).name());
  STRATA_CHECK(static_cast<size_t>(o.stages) <= names.size())
      << "--stages " << o.stages << ": model " << model->name() << " has only " << names.size()
      << " layers to cut";

  std::printf("plan for %s on %s: %d stages, %s, batch %lld = %lld micro-batches of %lld\n",
              model->name().c_str(), dataset.c_str(), o.stages, parallel::schedule_name(kind),
              static_cast<long long>(o.batch_size), static_cast<long long>(o.micro_batches),
              static_cast<long long>(po.micro_batch_size));
  std::printf("costs: %s\n", source.c_str());
  std::printf("links %s GB/s, memory limit %s, %d optimizer slots per parameter\n",
              format_number(o.bandwidth_gbps).c_str(),
              o.mem_limit.empty()
                  ? "none"
                  : (format_bytes(static_cast<size_t>(po.mem_limit_bytes)) + " per stage").c_str(),
              o.optimizer_slots);

  std::optional<Prediction> manual;
  if (!o.partition.empty()) {
    const parallel::Partition p = parallel::parse_partition(o.partition, names, o.stages);
    manual = predict(parallel::evaluate_partition(costs, p, po), po);
    print_prediction("given partition", *manual, names, po);
  }
  std::optional<Prediction> balanced;
  try {
    balanced = predict(parallel::balanced_partition(costs, o.stages, po), po);
  } catch (const Error& e) {
    if (!manual) throw;  // nothing else to show
    std::printf("\nbalanced partition: none: %s\n", e.what());
  }
  if (balanced)
    print_prediction("balanced partition (--partitioner dp: slowest stage minimized)", *balanced,
                     names, po);
  parallel::ProjectionOptions projection_options;
  projection_options.normalize = o.ampa_normalize == "on";
  projection_options.threshold = o.ampa_threshold;
  projection_options.guard = parallel::parse_ampa_guard(o.ampa_guard);
  parallel::AmpaResult ampa;
  const Prediction projection =
      predict(parallel::projection_partition(costs, o.stages, po, projection_options, &ampa), po);
  if (ampa.chosen != "ampa") {
    print_prediction("AMPA's own partition (slower than the one --ampa-guard " + o.ampa_guard +
                         " returns below)",
                     predict(parallel::evaluate_partition(costs, ampa.ampa_partition, po), po),
                     names, po);
  }
  char title[256];
  std::snprintf(title, sizeof(title),
                "projection partition (--partitioner projection: GroPipe AMPA, %s after %lld "
                "moves, PD/mu %.4f; --ampa-guard %s: %s)",
                ampa.criterion_met ? "criterion met" : "best seen",
                static_cast<long long>(ampa.moves), ampa.dispersion, o.ampa_guard.c_str(),
                ampa.chosen == "ampa"   ? "AMPA's partition"
                : ampa.chosen == "even" ? "the even split, faster than AMPA's"
                                        : "the dp partition, faster than AMPA's");
  print_prediction(title, projection, names, po);
  const parallel::Partition uniform = parallel::uniform_partition(names.size(), o.stages);
  const Prediction even = predict(parallel::evaluate_partition(costs, uniform, po), po);
  print_prediction("uniform partition (by layer count)", even, names, po);
  if (o.memory_policy == "auto")
    print_memory_plan(o, costs, names, balanced ? *balanced : even, po);
  if (o.planner == "dynpipe") {
    std::vector<PlannedPartition> others;
    if (balanced) others.push_back({"dp", balanced->plan.partition, balanced->simulation.makespan});
    others.push_back({"projection", projection.plan.partition, projection.simulation.makespan});
    others.push_back({"uniform", even.plan.partition, even.simulation.makespan});
    if (manual) others.push_back({"given", manual->plan.partition, manual->simulation.makespan});
    print_dynpipe_plan(o, costs, names, po, others);
  }
  if (balanced) {
    std::printf("\nbalanced (dp) vs projection: %.3f ms vs %.3f ms predicted step time\n",
                balanced->simulation.makespan, projection.simulation.makespan);
    std::printf("balanced vs uniform: %.3f ms vs %.3f ms predicted (%.2fx)\n",
                balanced->simulation.makespan, even.simulation.makespan,
                balanced->simulation.makespan > 0
                    ? even.simulation.makespan / balanced->simulation.makespan
                    : 1.0);
  }
  return 0;
}

}  // namespace strata::tools
