#include "tools/plan_dynpipe.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/check.h"
#include "engine/exec_context.h"
#include "graph/param_store.h"
#include "graph/train_step.h"
#include "io/data_loader.h"
#include "parallel/dynpipe/cost_model.h"
#include "parallel/schedule/schedule.h"
#include "tools/common.h"

namespace strata::tools {

namespace dp = parallel::dynpipe;

void add_dynpipe_flags(CLI::App* cmd, PlanOptions& o) {
  cmd->add_option("--planner", o.planner,
                  "default (the dp, projection and uniform partitions), or dynpipe: those and "
                  "DynPipe's plan over --gpus (Eqs. 4-7, stage count by Algorithm 1 when "
                  "--dynpipe-epsilon is given), each priced by Eq. 5")
      ->check(CLI::IsMember({"default", "dynpipe"}));
  cmd->add_option("--gpus", o.gpus, "dynpipe: GPUs N to plan for (0 = --stages)");
  cmd->add_option("--gpus-per-node", o.gpus_per_node,
                  "dynpipe: GPUs per machine; a stage's GPUs lie in one machine or are whole "
                  "machines (0 = all on one)");
  cmd->add_option("--node-bandwidth", o.node_bandwidth_gbps,
                  "dynpipe: links inside a machine, GB/s (0 = --bandwidth, which is then the "
                  "links between machines)");
  cmd->add_option("--tensor-parallel", o.tensor_parallel,
                  "dynpipe: also price tensor-parallel meshes inside a machine (on), or data "
                  "parallelism alone (off)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--dynpipe-rule", o.dynpipe_rule,
                  "dynpipe: Eq. 4/5 as corrected, max(W_prefix, W_last, (c + W_prefix + "
                  "W_last) / 2), or as printed in the paper (paper)")
      ->check(CLI::IsMember({"corrected", "paper"}));
  cmd->add_option("--dynpipe-search", o.dynpipe_search,
                  "dynpipe: Algorithm 1 over every S (full), or stop at the first S where T x W "
                  "rises (turning-point)")
      ->check(CLI::IsMember({"full", "turning-point"}));
  cmd->add_option("--dynpipe-lr", o.dynpipe_lr,
                  "dynpipe: learning rate eta of Eq. 3 and of the warm-up's SGD");
  cmd->add_option("--dynpipe-epsilon", o.dynpipe_epsilon,
                  "dynpipe: target error of Eq. 3 (0 = no convergence target: S = --stages)");
  cmd->add_option("--dynpipe-smoothness", o.dynpipe_smoothness,
                  "dynpipe: smoothness L of the loss (negative = measure by --warmup-steps)");
  cmd->add_option("--dynpipe-noise", o.dynpipe_noise,
                  "dynpipe: gradient second moment xi^2 (negative = measure by --warmup-steps)");
  cmd->add_option("--dynpipe-initial-loss", o.dynpipe_initial_loss,
                  "dynpipe: initial loss f(w0) (negative = measure by --warmup-steps)");
  cmd->add_option("--warmup-steps", o.warmup_steps,
                  "dynpipe: SGD steps at --dynpipe-lr on micro-batches of the model's data that "
                  "measure L, xi^2 and f(w0) (0 = take them from the flags)");
  add_repartition_flags(cmd, o);
}

void check_dynpipe_options(const PlanOptions& o) {
  check_repartition_options(o);
  if (o.planner != "dynpipe") {
    const PlanOptions d;  // the defaults: any other value was given on the command line
    const std::pair<bool, const char*> flags[] = {
        {o.gpus != d.gpus, "--gpus"},
        {o.gpus_per_node != d.gpus_per_node, "--gpus-per-node"},
        {o.node_bandwidth_gbps != d.node_bandwidth_gbps, "--node-bandwidth"},
        {o.tensor_parallel != d.tensor_parallel, "--tensor-parallel"},
        {o.dynpipe_rule != d.dynpipe_rule, "--dynpipe-rule"},
        {o.dynpipe_search != d.dynpipe_search, "--dynpipe-search"},
        {o.dynpipe_lr != d.dynpipe_lr, "--dynpipe-lr"},
        {o.dynpipe_epsilon != d.dynpipe_epsilon, "--dynpipe-epsilon"},
        {o.dynpipe_smoothness != d.dynpipe_smoothness, "--dynpipe-smoothness"},
        {o.dynpipe_noise != d.dynpipe_noise, "--dynpipe-noise"},
        {o.dynpipe_initial_loss != d.dynpipe_initial_loss, "--dynpipe-initial-loss"},
        {o.warmup_steps != d.warmup_steps, "--warmup-steps"}};
    for (const auto& [given, flag] : flags) {
      STRATA_CHECK(!given) << flag << " is a flag of --planner dynpipe";
    }
    return;
  }
  STRATA_CHECK(o.gpus >= 0 && o.gpus <= 64)
      << "--gpus must be 0 (= --stages) to 64, got " << o.gpus;
  const int gpus = o.gpus == 0 ? o.stages : o.gpus;
  STRATA_CHECK(o.gpus_per_node >= 0) << "--gpus-per-node must be >= 0, got " << o.gpus_per_node;
  STRATA_CHECK(o.gpus_per_node == 0 || gpus % o.gpus_per_node == 0)
      << "--gpus " << gpus << " must be a multiple of --gpus-per-node " << o.gpus_per_node
      << " (whole machines)";
  STRATA_CHECK(std::isfinite(o.node_bandwidth_gbps) && o.node_bandwidth_gbps >= 0)
      << "--node-bandwidth must be >= 0 (GB/s; 0 = --bandwidth), got " << o.node_bandwidth_gbps;
  STRATA_CHECK(std::isfinite(o.dynpipe_epsilon) && o.dynpipe_epsilon >= 0)
      << "--dynpipe-epsilon must be >= 0 (0 = no convergence target), got " << o.dynpipe_epsilon;
  STRATA_CHECK(std::isfinite(o.dynpipe_lr) && o.dynpipe_lr > 0)
      << "--dynpipe-lr must be positive, got " << o.dynpipe_lr;
  STRATA_CHECK(o.warmup_steps == 0 || o.warmup_steps >= 3)
      << "--warmup-steps must be 0 or at least 3 (two steps give one sample of L), got "
      << o.warmup_steps;
  if (o.dynpipe_epsilon > 0 && o.warmup_steps == 0) {
    STRATA_CHECK(o.dynpipe_smoothness >= 0 && o.dynpipe_noise >= 0 && o.dynpipe_initial_loss >= 0)
        << "--dynpipe-epsilon needs the warm-up statistics: --dynpipe-smoothness, --dynpipe-noise "
           "and --dynpipe-initial-loss, or --warmup-steps K to measure them";
  }
  STRATA_CHECK(o.dynpipe_epsilon > 0 || (o.warmup_steps == 0 && o.dynpipe_smoothness < 0 &&
                                         o.dynpipe_noise < 0 && o.dynpipe_initial_loss < 0))
      << "the warm-up statistics (--warmup-steps, --dynpipe-smoothness, --dynpipe-noise, "
         "--dynpipe-initial-loss) choose the stage count only with a target --dynpipe-epsilon";
}

dp::WarmupEstimate measure_warmup(const ProfileOptions& o, int64_t batch_size, int64_t steps,
                                  double lr) {
  std::shared_ptr<const io::Dataset> data = open_profile_dataset(o);
  ExecContext ctx(Device::cpu(), nullptr, o.threads);
  std::unique_ptr<graph::Model> model = build_cli_model(o.model, o.size, o.model_spec, *data);
  graph::ParamStore store(*model, 0, model->size(), ctx.allocator());
  store.initialize(o.seed);
  const int64_t n = store.params().numel();
  STRATA_CHECK(static_cast<double>(steps) * static_cast<double>(n) * 32.0 <= 4.0 * (1 << 30))
      << "--warmup-steps " << steps << " keeps 4 x " << steps << " vectors of the " << n
      << " weights (over 4 GiB); use fewer steps";
  io::DataLoaderOptions lo;
  lo.batch_size = batch_size;
  lo.seed = o.seed;
  io::DataLoader loader(data, lo);
  io::Batch batch;
  int64_t epoch = 0;
  loader.start_epoch(epoch);
  std::vector<dp::WarmupStep> measured;
  // Forward and backward at the current weights on `batch`; the gradient (and loss) in `step`.
  const auto gradient_at = [&](int64_t step, std::vector<double>* grad, double* loss) {
    store.zero_grads(ctx);
    graph::ForwardOptions fwd;
    fwd.seed = o.seed;
    fwd.step = step;
    const graph::BatchMetrics m =
        graph::train_forward_backward(ctx, *model, batch.input, batch.target, {}, fwd);
    const float* g = store.grads().data<float>();
    grad->assign(g, g + n);
    if (loss != nullptr) *loss = m.loss;
  };
  for (int64_t step = 0; step < steps; ++step) {
    if (!loader.next(&batch)) {
      loader.start_epoch(++epoch);
      STRATA_CHECK(loader.next(&batch)) << "dataset " << data->name() << " yields no batches";
    }
    dp::WarmupStep s;
    float* w = store.params().data<float>();
    s.weights.assign(w, w + n);
    gradient_at(step, &s.gradient, &s.loss);
    for (int64_t k = 0; k < n; ++k) w[k] -= static_cast<float>(lr * s.gradient[k]);
    s.next_weights.assign(w, w + n);
    gradient_at(step, &s.next_gradient, nullptr);  // the same batch (and dropout masks)
    measured.push_back(std::move(s));
  }
  return dp::estimate_warmup(measured);
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string ms_text(double ms) {
  if (!std::isfinite(ms)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", ms);
  return buf;
}

std::string number_text(double v) { return std::isfinite(v) ? format_number(v) : "inf"; }

std::string widths_text(const std::vector<int>& widths) {
  std::string s;
  for (int w : widths) s += (s.empty() ? "" : ",") + std::to_string(w);
  return s;
}

// The schedule simulation of a partition of one GPU per stage, as `strata plan` prices the
// others (compute + send per micro-batch).
double simulate(const std::vector<parallel::LayerCost>& costs, const parallel::Partition& p,
                const parallel::PartitionOptions& po) {
  const parallel::PartitionPlan plan = parallel::evaluate_partition(costs, p, po);
  std::vector<double> forward, backward;
  for (const parallel::StageEstimate& e : plan.stages) {
    forward.push_back(e.forward_ms + e.send_ms);
    backward.push_back(e.backward_ms);
  }
  const parallel::Schedule schedule =
      parallel::make_schedule(po.schedule, static_cast<int>(p.size()), po.micro_batches);
  return parallel::simulate_schedule(schedule, forward, backward).makespan;
}

void print_stages(const dp::Plan& plan) {
  std::printf("  %-5s %-12s %-10s %-10s %10s %10s %10s %10s %10s %10s\n", "stage", "layers", "GPUs",
              "mesh", "compute", "gather", "reduce", "stage ms", "comm in", "cycle ms");
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const dp::Stage& st = plan.stages[s];
    const std::string layers =
        std::to_string(st.layers.begin) + "-" + std::to_string(st.layers.end - 1);
    const std::string gpus =
        std::to_string(st.first_gpu) + "-" + std::to_string(st.first_gpu + st.gpus - 1);
    const std::string mesh =
        "dp" + std::to_string(st.cost.shape.data) + " tp" + std::to_string(st.cost.shape.tensor);
    std::printf("  %-5zu %-12s %-10s %-10s %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f\n", s,
                layers.c_str(), gpus.c_str(), mesh.c_str(), st.cost.compute_ms,
                st.cost.all_gather_ms, st.cost.all_reduce_ms, st.cost.time_ms, st.comm_in_ms,
                st.cycle_ms);
  }
}

}  // namespace

void print_dynpipe_plan(const PlanOptions& o, const std::vector<parallel::LayerCost>& costs,
                        const std::vector<std::string>& names, const parallel::PartitionOptions& po,
                        const std::vector<PlannedPartition>& others) {
  const int gpus = o.gpus == 0 ? o.stages : o.gpus;
  const int per_node = o.gpus_per_node == 0 ? gpus : o.gpus_per_node;
  const double inter = o.bandwidth_gbps * 1e9;
  const double intra = o.node_bandwidth_gbps > 0 ? o.node_bandwidth_gbps * 1e9 : inter;
  const dp::Cluster cluster = dp::Cluster::machines(gpus, per_node, intra, inter);
  dp::CostOptions co;
  co.micro_batch_size = static_cast<double>(po.micro_batch_size);
  co.tensor_parallel = o.tensor_parallel == "on";
  co.rule = dp::parse_two_stage_rule(o.dynpipe_rule);
  const std::vector<dp::Plan> plans = dp::plan_all_stages(costs, cluster, gpus, co);

  std::printf(
      "\ndynpipe (--planner dynpipe: Eqs. 4-7, %s rule): %d GPUs, %d per machine, links %s GB/s "
      "inside a machine, %s GB/s between; %s; an iteration is one micro-batch of %lld samples\n",
      dp::two_stage_rule_name(co.rule), gpus, per_node, format_number(intra / 1e9).c_str(),
      format_number(inter / 1e9).c_str(),
      co.tensor_parallel ? "data and tensor parallel meshes" : "data-parallel meshes",
      static_cast<long long>(po.micro_batch_size));

  // Algorithm 1's inputs, when there is a target.
  std::vector<double> iteration_ms;
  for (const dp::Plan& p : plans) iteration_ms.push_back(p.iteration_ms);
  const bool convergence = o.dynpipe_epsilon > 0;
  dp::ConvergenceInputs in;
  dp::StageChoice choice;
  if (convergence) {
    in.lr = o.dynpipe_lr;
    in.epsilon = o.dynpipe_epsilon;
    in.smoothness = o.dynpipe_smoothness;
    in.second_moment = o.dynpipe_noise;
    in.initial_loss = o.dynpipe_initial_loss;
    std::string from_l = "--dynpipe-smoothness", from_xi = "--dynpipe-noise",
                from_f0 = "--dynpipe-initial-loss";
    if (o.warmup_steps > 0) {
      const dp::WarmupEstimate w =
          measure_warmup(o.model, po.micro_batch_size, o.warmup_steps, o.dynpipe_lr);
      char buf[256];
      std::printf("warm-up: %d steps of SGD at lr %s on micro-batches of %lld samples\n",
                  w.iterations, format_number(o.dynpipe_lr).c_str(),
                  static_cast<long long>(po.micro_batch_size));
      if (in.smoothness < 0) {
        in.smoothness = w.smoothness.median;
        std::snprintf(buf, sizeof(buf), "warm-up: median of %zu samples (mean %s, max %s)",
                      w.smoothness.samples.size(), format_number(w.smoothness.mean).c_str(),
                      format_number(w.smoothness.max).c_str());
        from_l = buf;
      }
      if (in.second_moment < 0) {
        in.second_moment = w.second_moment;
        from_xi = "warm-up: mean squared gradient norm";
      }
      if (in.initial_loss < 0) {
        in.initial_loss = w.initial_loss;
        from_f0 = "warm-up: first loss";
      }
    }
    choice = dp::choose_stages(in, iteration_ms, o.dynpipe_search == "turning-point");
    std::printf("Algorithm 1 inputs: lr %s, epsilon %s, L %s (%s), xi^2 %s (%s), f(w0) %s (%s)\n",
                format_number(in.lr).c_str(), format_number(in.epsilon).c_str(),
                format_number(in.smoothness).c_str(), from_l.c_str(),
                format_number(in.second_moment).c_str(), from_xi.c_str(),
                format_number(in.initial_loss).c_str(), from_f0.c_str());
    if (in.lr * in.smoothness > 1) {
      std::printf("  note: lr x L = %s > 1, outside Theorem 1's assumption eta L <= 1\n",
                  format_number(in.lr * in.smoothness).c_str());
    }
  }
  std::printf("  %-3s %12s %16s %16s %14s  %s\n", "S", "W(S) ms", "staleness err", "updates T(S)",
              "T x W s", "plan (GPUs per stage)");
  for (size_t k = 0; k < plans.size(); ++k) {
    const int S = static_cast<int>(k) + 1;
    if (convergence && k >= choice.evaluated.size()) {
      std::printf("  %-3d (not searched: the turning point was S = %zu)\n", S,
                  choice.evaluated.size());
      break;
    }
    std::string err = "-", updates = "-", total = "-";
    if (convergence) {
      const dp::StageCandidate& c = choice.evaluated[k];
      err = number_text(dp::staleness_error(in, S));
      updates = number_text(c.updates);
      total = number_text(c.total_ms / 1e3);
    }
    std::printf("  %-3d %12s %16s %16s %14s  %s\n", S, ms_text(plans[k].iteration_ms).c_str(),
                err.c_str(), updates.c_str(), total.c_str(),
                dp::describe_plan(plans[k], names).c_str());
  }
  int chosen = 0;
  if (convergence) {
    STRATA_CHECK(choice.stages > 0)
        << "--dynpipe-epsilon " << format_number(in.epsilon)
        << ": no stage count converges (epsilon must exceed 2 lr^2 S^3 L^2 xi^2 = "
        << number_text(dp::staleness_error(in, 1)) << " at S = 1) or has a plan";
    chosen = choice.stages;
    std::printf("chosen: S = %d, least T(S) x W(S) = %s s (--dynpipe-search %s)\n", chosen,
                number_text(choice.evaluated[chosen - 1].total_ms / 1e3).c_str(),
                o.dynpipe_search.c_str());
  } else {
    STRATA_CHECK(o.stages <= static_cast<int>(plans.size()) && plans[o.stages - 1].feasible())
        << "--stages " << o.stages << ": no DynPipe plan of that many stages on --gpus " << gpus;
    chosen = o.stages;
    std::printf(
        "chosen: S = %d (--stages; give --dynpipe-epsilon with the warm-up statistics to "
        "choose S by Algorithm 1)\n",
        chosen);
  }
  const dp::Plan& plan = plans[chosen - 1];
  std::printf("\ndynpipe plan: --partition %s, GPUs per stage %s\n",
              parallel::partition_string(plan.partition(), names).c_str(),
              widths_text(plan.widths()).c_str());
  print_stages(plan);
  std::printf("  W(S) = %s ms per iteration (Eq. 5)\n", ms_text(plan.iteration_ms).c_str());

  // Every planner's partition by Eq. 5 (one GPU per stage on the first S GPUs for the others).
  std::printf(
      "\npredicted step time per planner: Eq. 5's W per iteration, x %lld micro-batches per step, "
      "and the %s schedule simulation (one GPU per stage, links of --bandwidth)\n",
      static_cast<long long>(po.micro_batches), parallel::schedule_name(po.schedule));
  std::printf("  %-11s %6s %5s %12s %14s %16s  %s\n", "planner", "stages", "GPUs", "W ms",
              "M x W ms", "simulation ms", "partition");
  const auto row = [&](const std::string& planner, const dp::Plan& p, double simulated) {
    std::printf("  %-11s %6zu %5d %12s %14s %16s  %s\n", planner.c_str(), p.stages.size(),
                p.stages.empty() ? 0 : p.stages.back().first_gpu + p.stages.back().gpus,
                ms_text(p.iteration_ms).c_str(),
                ms_text(p.iteration_ms * static_cast<double>(po.micro_batches)).c_str(),
                std::isfinite(simulated) ? ms_text(simulated).c_str() : "n/a",
                parallel::partition_string(p.partition(), names).c_str());
  };
  for (const PlannedPartition& other : others) {
    const int S = static_cast<int>(other.partition.size());
    if (S > gpus) {
      std::printf("  %-11s %6d: more stages than --gpus %d\n", other.planner.c_str(), S, gpus);
      continue;
    }
    const dp::Plan p = dp::evaluate_plan(costs, cluster.first(S), other.partition,
                                         std::vector<int>(static_cast<size_t>(S), 1), {}, co);
    row(other.planner, p, other.simulated_ms);
  }
  const std::vector<int> widths = plan.widths();
  bool single = true, equal = true;
  for (const dp::Stage& st : plan.stages) {
    single = single && st.gpus == 1;
    equal = equal && st.gpus == widths[0] && st.cost.shape.tensor == 1;
  }
  row("dynpipe", plan, single ? simulate(costs, plan.partition(), po) : kInf);
  const std::string partition = parallel::partition_string(plan.partition(), names);
  if (equal) {
    // Every stage data parallel over the same width: that many groups of the S-stage pipeline.
    std::printf(
        "  train the dynpipe plan: mpirun -np %d strata train --stages %zu --groups %d "
        "--partition %s (or --local)\n",
        gpus, plan.stages.size(), widths[0], partition.c_str());
  } else {
    std::printf(
        "  (strata train runs equal data-parallel groups of one GPU per stage, so this "
        "plan's stage widths %s are a prediction; its --partition %s trains with one "
        "GPU per stage)\n",
        widths_text(widths).c_str(), partition.c_str());
  }
  // The current plan of a re-partition: the given partition, else dp's, else the uniform one.
  const PlannedPartition* current = nullptr;
  for (const char* name : {"given", "dp", "uniform"}) {
    for (const PlannedPartition& other : others) {
      if (current == nullptr && other.planner == name) current = &other;
    }
  }
  if (current != nullptr) print_repartition(o, costs, names, po, *current);
}

}  // namespace strata::tools
