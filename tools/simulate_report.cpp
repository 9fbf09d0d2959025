// Tables and JSON of `strata simulate` (see simulate_report.h).
#include "tools/simulate_report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/allocator.h"
#include "parallel/schedule/schedule.h"

namespace strata::tools {

namespace sim = parallel::sim;

namespace {

std::string bytes(double b) { return format_bytes(static_cast<size_t>(std::max(0.0, b))); }

std::string link_text(const sim::LinkSpec& l) {
  char text[96];
  std::snprintf(text, sizeof(text), "%s %.4g GB/s %.3g us", sim::link_class_name(l.kind),
                l.bandwidth / 1e9, l.latency_s * 1e6);
  return text;
}

std::string range_text(const parallel::LayerRange& r, const std::vector<std::string>& names) {
  return names.at(r.begin) + (r.end - r.begin > 1 ? "-" + names.at(r.end - 1) : "") + " (" +
         std::to_string(r.end - r.begin) + ")";
}

}  // namespace

Throughput throughput(const SimContext& ctx, const sim::SimResult& r, int ranks) {
  Throughput t;
  if (r.step_time_s <= 0) return t;
  t.samples_per_s = static_cast<double>(ctx.batch_size) / r.step_time_s;
  t.tokens_per_s = t.samples_per_s * static_cast<double>(ctx.tokens_per_sample);
  if (ctx.peak_flops > 0) t.mfu = t.samples_per_s * ctx.flops_per_sample / (ranks * ctx.peak_flops);
  return t;
}

void print_simulation(const SimContext& ctx, const sim::SimConfig& c, const sim::SimResult& r) {
  const sim::Cluster& cl = ctx.cluster;
  const int ranks = c.groups * c.stages;
  std::printf(
      "simulate %s: G=%d groups x S=%d stages = %d ranks on %d GPUs (%d nodes x %d), "
      "%s, M=%lld, batch %lld (micro-batches of %g), memory policy %s, %s\n",
      ctx.model.c_str(), c.groups, c.stages, ranks, cl.gpus, cl.nodes(), cl.gpus_per_node,
      parallel::schedule_name(c.schedule), static_cast<long long>(c.micro_batches),
      static_cast<long long>(ctx.batch_size), c.micro_batch_rows, ctx.memory_policy.c_str(),
      ctx.precision.c_str());
  std::printf("costs: %s\n", ctx.cost_source.c_str());
  std::printf(
      "links: %s inside a node, %s between nodes; all-reduce %s, buckets %s MiB, overlap "
      "%s, delay %d\n",
      link_text(cl.intra).c_str(), link_text(cl.inter).c_str(), sim::all_reduce_name(c.all_reduce),
      c.grad_sync.bucket_mb > 0 ? std::to_string(c.grad_sync.bucket_mb).substr(0, 5).c_str()
                                : "one per stage",
      c.grad_sync.overlap ? "on" : "off", c.grad_sync.delay);
  std::printf("\n%-5s %-34s %9s %9s %8s %6s %10s %10s %10s %10s %9s %9s\n", "stage", "layers",
              "fwd ms", "bwd ms", "opt ms", "busy", "peak mem", "weights+", "acts/mb", "dp ar ms",
              "dp exp", "p2p exp");
  for (const sim::StageResult& st : r.stages) {
    std::printf("%-5d %-34s %9.3f %9.3f %8.3f %5.1f%% %10s %10s %10s %10.3f %9.3f %9.3f\n",
                st.stage, range_text(st.layers, ctx.layer_names).c_str(), 1e3 * st.forward_s,
                1e3 * st.backward_s, 1e3 * st.optimizer_s, 100 * (1 - st.idle_fraction),
                bytes(st.peak_bytes).c_str(), bytes(st.static_memory.total()).c_str(),
                bytes(st.micro_batch.keep + st.micro_batch.swap).c_str(), 1e3 * st.dp_seconds,
                1e3 * st.dp_exposed_s, 1e3 * st.p2p_exposed_s);
  }
  const Throughput t = throughput(ctx, r, ranks);
  std::printf("\nstep time %.4g ms | %.4g samples/s", 1e3 * r.step_time_s, t.samples_per_s);
  if (ctx.tokens_per_sample > 0) std::printf(" | %.4g tokens/s", t.tokens_per_s);
  if (ctx.peak_flops > 0) std::printf(" | MFU %.1f%%", 100 * t.mfu);
  std::printf(" | bubble %.1f%% (ideal (S-1)/(M+S-1) = %.1f%%)\n", 100 * r.bubble,
              100 * parallel::theoretical_bubble_fraction(c.schedule, c.stages, c.micro_batches));
  double dp = 0, dp_exposed = 0, p2p_wait = 0, p2p_exposed = 0, swap = 0, tied = 0;
  for (const sim::StageResult& st : r.stages) {
    dp = std::max(dp, st.dp_seconds);
    dp_exposed = std::max(dp_exposed, st.dp_exposed_s);
    p2p_wait = std::max(p2p_wait, st.p2p_wait_s);
    p2p_exposed = std::max(p2p_exposed, st.p2p_exposed_s);
    swap = std::max(swap, st.swap_exposed_s);
    tied = std::max(tied, st.tied_exposed_s);
  }
  std::printf(
      "communication (most on a stage, per step): dp all-reduce %.3f ms, exposed %.3f ms "
      "(hidden %.0f%%); receives waited %.3f ms, %.3f ms of it in transit; tied %.3f ms; "
      "swap waited %.3f ms\n",
      1e3 * dp, 1e3 * dp_exposed, dp > 0 ? 100 * (1 - std::min(1.0, dp_exposed / dp)) : 100.0,
      1e3 * p2p_wait, 1e3 * p2p_exposed, 1e3 * tied, 1e3 * swap);
  size_t worst = 0;
  for (size_t s = 0; s < r.stages.size(); ++s) {
    if (r.stages[s].peak_bytes > r.stages[worst].peak_bytes) worst = s;
  }
  std::printf("peak memory %s on stage %zu", bytes(r.peak_bytes).c_str(), worst);
  if (ctx.capacity > 0) {
    std::printf(" of %s per GPU (%.0f%%)%s", bytes(ctx.capacity).c_str(),
                100 * r.peak_bytes / ctx.capacity,
                r.peak_bytes > ctx.capacity ? ": DOES NOT FIT" : "");
  }
  std::printf("\n(simulated %d of %d groups, %lld instructions)\n", r.simulated_groups, c.groups,
              static_cast<long long>(r.instructions));
}

namespace {

nlohmann::json stages_json(const sim::SimResult& r) {
  nlohmann::json stages = nlohmann::json::array();
  for (const sim::StageResult& st : r.stages) {
    stages.push_back({{"stage", st.stage},
                      {"layers", {st.layers.begin, st.layers.end}},
                      {"forward_s", st.forward_s},
                      {"backward_s", st.backward_s},
                      {"optimizer_s", st.optimizer_s},
                      {"idle_fraction", st.idle_fraction},
                      {"peak_memory_bytes", st.peak_bytes},
                      {"param_bytes", st.static_memory.params},
                      {"grad_bytes", st.static_memory.grads},
                      {"optimizer_state_bytes", st.static_memory.optimizer},
                      {"working_copy_bytes", st.static_memory.working},
                      {"stash_bytes", st.static_memory.stash},
                      {"delayed_grad_bytes", st.static_memory.delayed},
                      {"activation_bytes_per_micro_batch", st.micro_batch.keep},
                      {"swapped_bytes_per_micro_batch", st.micro_batch.swap},
                      {"max_in_flight", st.max_in_flight},
                      {"dp_all_reduce_s", st.dp_seconds},
                      {"dp_exposed_s", st.dp_exposed_s},
                      {"tied_exposed_s", st.tied_exposed_s},
                      {"p2p_wait_s", st.p2p_wait_s},
                      {"p2p_exposed_s", st.p2p_exposed_s},
                      {"swap_exposed_s", st.swap_exposed_s}});
  }
  return stages;
}

nlohmann::json result_json(const SimContext& ctx, const sim::SimResult& r, int ranks) {
  const Throughput t = throughput(ctx, r, ranks);
  nlohmann::json j{{"step_time_s", r.step_time_s},      {"throughput", t.samples_per_s},
                   {"tokens_per_s", t.tokens_per_s},    {"bubble", r.bubble},
                   {"peak_memory_bytes", r.peak_bytes}, {"stages", stages_json(r)}};
  j["mfu"] = ctx.peak_flops > 0 ? nlohmann::json(t.mfu) : nlohmann::json(nullptr);
  return j;
}

nlohmann::json cluster_json(const SimContext& ctx) {
  const sim::Cluster& c = ctx.cluster;
  return {{"device", c.device.name},
          {"gpus", c.gpus},
          {"gpus_per_node", c.gpus_per_node},
          {"memory_bytes", ctx.capacity},
          {"intra_link",
           {{"class", sim::link_class_name(c.intra.kind)},
            {"bandwidth", c.intra.bandwidth},
            {"latency_s", c.intra.latency_s}}},
          {"inter_link",
           {{"class", sim::link_class_name(c.inter.kind)},
            {"bandwidth", c.inter.bandwidth},
            {"latency_s", c.inter.latency_s}}}};
}

nlohmann::json candidate_json(const SimContext& ctx, const sim::Candidate& c) {
  nlohmann::json j{{"groups", c.groups},
                   {"stages", c.stages},
                   {"micro_batches", c.micro_batches},
                   {"schedule", parallel::schedule_name(c.schedule)},
                   {"memory_policy", sim::memory_policy_name(c.policy)},
                   {"partitioner", c.partitioner},
                   {"fits", c.fits},
                   {"reason", c.reason}};
  if (c.simulated) {
    nlohmann::json r = result_json(ctx, c.result, c.groups * c.stages);
    r.erase("stages");  // the per-stage table; "stages" here is S
    j.update(r);
  }
  return j;
}

}  // namespace

std::string simulation_json(const SimContext& ctx, const sim::SimConfig& c,
                            const sim::SimResult& r) {
  nlohmann::json j = result_json(ctx, r, c.groups * c.stages);
  j["model"] = ctx.model;
  j["costs"] = ctx.cost_source;
  j["layout"] = {{"groups", c.groups},
                 {"stages", c.stages},
                 {"micro_batches", c.micro_batches},
                 {"batch_size", ctx.batch_size},
                 {"schedule", parallel::schedule_name(c.schedule)},
                 {"memory_policy", ctx.memory_policy},
                 {"precision", ctx.precision}};
  j["cluster"] = cluster_json(ctx);
  return j.dump(2);
}

void print_search(const SimContext& ctx, const std::vector<sim::Candidate>& ranked, int top) {
  std::printf("\nsearch %s on %d x %s (%d per node), batch %lld: %zu layouts\n", ctx.model.c_str(),
              ctx.cluster.gpus, ctx.cluster.device.name.c_str(), ctx.cluster.gpus_per_node,
              static_cast<long long>(ctx.batch_size), ranked.size());
  std::printf("  %-4s %-48s %11s %9s %7s %7s %10s  %s\n", "rank", "layout", "samples/s", "step ms",
              "MFU", "bubble", "peak mem", "why it loses to #1");
  std::map<std::string, int> tally;
  int shown = 0;
  for (size_t i = 0; i < ranked.size(); ++i) {
    const sim::Candidate& c = ranked[i];
    const std::string cause =
        c.fits ? (i == 0 ? "" : c.reason.substr(0, c.reason.find(':'))) : "out of memory";
    if (i > 0) ++tally[cause];
    if (shown >= top) continue;
    ++shown;
    if (!c.simulated) {
      std::printf("  %-4zu %-48s %11s %9s %7s %7s %10s  %s\n", i + 1, sim::describe(c).c_str(), "-",
                  "-", "-", "-", "-", c.reason.c_str());
      continue;
    }
    const Throughput t = throughput(ctx, c.result, c.groups * c.stages);
    char mfu[16] = "-";
    if (ctx.peak_flops > 0) std::snprintf(mfu, sizeof(mfu), "%.1f%%", 100 * t.mfu);
    std::printf("  %-4zu %-48s %11.4g %9.4g %7s %6.1f%% %10s  %s\n", i + 1,
                sim::describe(c).c_str(), c.fits ? t.samples_per_s : 0.0,
                1e3 * c.result.step_time_s, mfu, 100 * c.result.bubble,
                bytes(c.result.peak_bytes).c_str(), i == 0 ? "(best)" : c.reason.c_str());
  }
  if (ranked.size() > 1) {
    std::printf("  the other %zu lose on:", ranked.size() - 1);
    const char* sep = " ";
    for (const auto& [cause, n] : tally) {
      std::printf("%s%s %d", sep, cause.c_str(), n);
      sep = ", ";
    }
    std::printf("\n");
  }
  for (const sim::Candidate& c : ranked) {
    if (!c.fits) {
      std::printf("  e.g. %s: %s\n", sim::describe(c).c_str(), c.out_of_memory.c_str());
      break;
    }
  }
}

void print_scaling(const std::vector<ScaleRow>& rows) {
  if (rows.empty()) return;
  std::printf("\n%s on %s: the best layout at each scale (tokens/s where the model takes text)\n",
              rows.front().ctx.model.c_str(), rows.front().ctx.cluster.device.name.c_str());
  std::printf("  %6s %7s  %-46s %11s %11s %6s %7s | %-24s | %-24s\n", "GPUs", "batch",
              "best layout", "samples/s", "tokens/s", "MFU", "bubble", "plain DP (S=1) samples/s",
              "plain PP (G=1) samples/s");
  for (const ScaleRow& r : rows) {
    auto other = [&](const sim::Candidate* c, const char* none) {
      if (c == nullptr) return std::string(none);
      char text[64];
      std::snprintf(text, sizeof(text), "%.4g (M=%lld %s)",
                    throughput(r.ctx, c->result, c->groups * c->stages).samples_per_s,
                    static_cast<long long>(c->micro_batches), sim::memory_policy_name(c->policy));
      return std::string(text);
    };
    if (r.best == nullptr) {
      std::printf("  %6d %7lld  %-46s\n", r.gpus, static_cast<long long>(r.batch_size),
                  "no layout fits");
      continue;
    }
    const Throughput t = throughput(r.ctx, r.best->result, r.best->groups * r.best->stages);
    std::printf(
        "  %6d %7lld  %-46s %11.4g %11.4g %5.1f%% %6.1f%% | %-24s | %-24s\n", r.gpus,
        static_cast<long long>(r.batch_size), sim::describe(*r.best).c_str(), t.samples_per_s,
        t.tokens_per_s, 100 * t.mfu, 100 * r.best->result.bubble,
        other(r.data_parallel, "does not fit").c_str(),
        other(r.pipeline,
              r.gpus > static_cast<int>(r.ctx.layer_names.size()) ? "S > layers" : "does not fit")
            .c_str());
  }
}

std::string search_json(const std::vector<ScaleRow>& rows,
                        const std::vector<std::vector<sim::Candidate>>& all) {
  nlohmann::json scales = nlohmann::json::array();
  for (size_t i = 0; i < rows.size(); ++i) {
    const ScaleRow& r = rows[i];
    nlohmann::json candidates = nlohmann::json::array();
    for (const sim::Candidate& c : all[i]) candidates.push_back(candidate_json(r.ctx, c));
    nlohmann::json s{{"gpus", r.gpus},
                     {"batch_size", r.batch_size},
                     {"cluster", cluster_json(r.ctx)},
                     {"candidates", candidates}};
    s["best"] = r.best ? candidate_json(r.ctx, *r.best) : nlohmann::json(nullptr);
    s["data_parallel"] =
        r.data_parallel ? candidate_json(r.ctx, *r.data_parallel) : nlohmann::json(nullptr);
    s["pipeline"] = r.pipeline ? candidate_json(r.ctx, *r.pipeline) : nlohmann::json(nullptr);
    scales.push_back(s);
  }
  return nlohmann::json{{"model", rows.empty() ? "" : rows.front().ctx.model}, {"scales", scales}}
      .dump(2);
}

}  // namespace strata::tools
