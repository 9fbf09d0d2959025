// `strata plan --planner dynpipe --slowdown ...`: DynPipe's interference-aware re-partition
// (Algorithm 2, parallel/dynpipe/repartition.h) of the current plan, one rank per stage, shown as
// a plan a user can read: each rank's slowdown, its layers and stage time now and proposed, and
// the predicted cycle times. The slowdowns come from one of
//   --slowdown RANK:FACTOR,...  factors per rank (unlisted ranks: 1);
//   --stage-ms MS,...           each stage's measured time per iteration (dynpipe-no-rf: the last
//                               measured slowdown, measured / solo);
//   --slowdown-model FILE --rank-counters FILE.json
//                               the forest of `strata fit-slowdown`, per layer, from the layer's
//                               profile and each rank's counters (a JSON list of one object of
//                               counter values per rank).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/check.h"
#include "parallel/dynpipe/repartition.h"
#include "parallel/dynpipe/slowdown_features.h"
#include "parallel/dynpipe/slowdown_model.h"
#include "tools/common.h"
#include "tools/plan_dynpipe.h"

namespace strata::tools {

namespace dp = parallel::dynpipe;

void add_repartition_flags(CLI::App* cmd, PlanOptions& o) {
  cmd->add_option("--slowdown", o.slowdown,
                  "dynpipe: re-partition (Algorithm 2) the current plan (--partition, else dp) "
                  "with these slowdowns per rank, RANK:FACTOR,... (others 1)");
  cmd->add_option("--stage-ms", o.stage_ms,
                  "dynpipe: re-partition with the slowdowns of measured stage times, ms per "
                  "iteration, one per stage (dynpipe-no-rf: the last measured slowdown)");
  cmd->add_option("--slowdown-model", o.slowdown_model,
                  "dynpipe: re-partition with the slowdowns the forest of `strata fit-slowdown` "
                  "predicts from --rank-counters");
  cmd->add_option("--rank-counters", o.rank_counters,
                  "dynpipe: JSON file, a list of one object of counters per rank (the features "
                  "of --slowdown-model that are not the layer's)");
  cmd->add_option("--repartition-top-k", o.repartition_top_k,
                  "dynpipe: anchors of Algorithm 2's condensation (0 = every layer a block)");
}

void check_repartition_options(const PlanOptions& o) {
  const int sources = (o.slowdown.empty() ? 0 : 1) + (o.stage_ms.empty() ? 0 : 1) +
                      (o.slowdown_model.empty() ? 0 : 1);
  if (o.planner != "dynpipe") {
    STRATA_CHECK(sources == 0 && o.rank_counters.empty() && o.repartition_top_k == 0)
        << "--slowdown, --stage-ms, --slowdown-model, --rank-counters and --repartition-top-k "
           "are flags of --planner dynpipe";
    return;
  }
  STRATA_CHECK(sources <= 1) << "give one of --slowdown, --stage-ms and --slowdown-model";
  STRATA_CHECK(o.slowdown_model.empty() == o.rank_counters.empty())
      << "--slowdown-model and --rank-counters go together";
  STRATA_CHECK(o.repartition_top_k >= 0)
      << "--repartition-top-k must be >= 0, got " << o.repartition_top_k;
  STRATA_CHECK(sources == 1 || o.repartition_top_k == 0)
      << "--repartition-top-k needs --slowdown, --stage-ms or --slowdown-model";
}

namespace {

double parse_positive(const std::string& text, const std::string& flag) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  STRATA_CHECK(!text.empty() && end == text.c_str() + text.size() && std::isfinite(v) && v > 0)
      << flag << ": '" << text << "' is not a positive number";
  return v;
}

std::vector<double> parse_slowdown(const std::string& text, size_t ranks) {
  std::vector<double> f(ranks, 1.0);
  for (const std::string& item : dp::split_names(text)) {
    const size_t colon = item.find(':');
    STRATA_CHECK(colon != std::string::npos) << "--slowdown: '" << item << "' is not RANK:FACTOR";
    const std::string rank = item.substr(0, colon);
    char* end = nullptr;
    const long r = std::strtol(rank.c_str(), &end, 10);
    STRATA_CHECK(!rank.empty() && end == rank.c_str() + rank.size() && r >= 0 &&
                 static_cast<size_t>(r) < ranks)
        << "--slowdown: rank '" << rank << "' is not one of the plan's ranks 0-" << ranks - 1;
    f[static_cast<size_t>(r)] = parse_positive(item.substr(colon + 1), "--slowdown");
  }
  return f;
}

std::vector<std::map<std::string, double>> read_rank_counters(const std::string& path,
                                                              size_t ranks) {
  std::ifstream in(path);
  STRATA_CHECK(in.good()) << "cannot read --rank-counters '" << path << "'";
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    STRATA_THROW() << "--rank-counters '" << path << "' is not JSON: " << e.what();
  }
  STRATA_CHECK(doc.is_array() && doc.size() == ranks)
      << "--rank-counters '" << path << "' must be a list of " << ranks
      << " objects (one per rank of the plan)";
  std::vector<std::map<std::string, double>> out;
  for (size_t r = 0; r < ranks; ++r) {
    STRATA_CHECK(doc[r].is_object())
        << "--rank-counters '" << path << "': rank " << r << " is not an object of counters";
    std::map<std::string, double> m;
    for (const auto& [key, value] : doc[r].items()) {
      STRATA_CHECK(value.is_number())
          << "--rank-counters '" << path << "': rank " << r << "'s '" << key << "' is not a number";
      m[key] = value.get<double>();
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::string range_text(const parallel::LayerRange& r, const std::vector<std::string>& names) {
  return names[r.begin] + (r.end - r.begin > 1 ? "-" + names[r.end - 1] : "") + " (" +
         std::to_string(r.end - r.begin) + ")";
}

}  // namespace

void print_repartition(const PlanOptions& o, const std::vector<parallel::LayerCost>& costs,
                       const std::vector<std::string>& names, const parallel::PartitionOptions& po,
                       const PlannedPartition& current) {
  if (o.slowdown.empty() && o.stage_ms.empty() && o.slowdown_model.empty()) return;
  const size_t ranks = current.partition.size();
  dp::RepartitionOptions ro;
  ro.top_k = static_cast<size_t>(o.repartition_top_k);
  ro.micro_batch_size = static_cast<double>(po.micro_batch_size);
  ro.bandwidth_bps = o.bandwidth_gbps * 1e9;
  ro.rule = dp::parse_two_stage_rule(o.dynpipe_rule);
  dp::SlowdownFn slowdown;
  std::string source;
  if (!o.slowdown.empty()) {
    slowdown = dp::per_rank_slowdown(parse_slowdown(o.slowdown, ranks));
    source = "--slowdown factors";
  } else if (!o.stage_ms.empty()) {
    std::vector<double> measured;
    for (const std::string& v : dp::split_names(o.stage_ms)) {
      measured.push_back(parse_positive(v, "--stage-ms"));
    }
    STRATA_CHECK(measured.size() == ranks)
        << "--stage-ms has " << measured.size() << " times for the " << ranks
        << " stages of the current plan (" << current.planner << ")";
    slowdown =
        dp::per_rank_slowdown(dp::measured_slowdowns(costs, current.partition, measured, ro));
    source = "dynpipe-no-rf: measured stage times over solo";
  } else {
    const dp::ForestModel forest = dp::ForestModel::load(o.slowdown_model, dp::slowdown_features());
    slowdown = dp::make_forest_slowdown(forest, costs, read_rank_counters(o.rank_counters, ranks));
    source = "random forest " + o.slowdown_model + " (" + std::to_string(forest.features().size()) +
             " features)";
  }
  const dp::Proposal p = dp::propose(current.partition, costs, slowdown, ro);
  std::vector<double> now_ms;
  dp::simulate_cycle(costs, current.partition, slowdown, ro, &now_ms);

  std::printf(
      "\ndynpipe re-partition (Algorithm 2; slowdowns: %s): the %s plan on %zu ranks, one per "
      "stage, %zu blocks (--repartition-top-k %d), micro-batches of %lld samples, links %s GB/s\n",
      source.c_str(), current.planner.c_str(), ranks, p.blocks, o.repartition_top_k,
      static_cast<long long>(po.micro_batch_size), format_number(o.bandwidth_gbps).c_str());
  std::printf("  %-4s %9s %-28s %10s   %9s %-28s %10s\n", "rank", "slowdown", "current layers",
              "stage ms", "slowdown", "proposed layers", "stage ms");
  for (size_t r = 0; r < ranks; ++r) {
    const int rank = static_cast<int>(r);
    std::printf("  %-4zu %9.3f %-28s %10.3f   %9.3f %-28s %10.3f\n", r,
                slowdown(rank, current.partition[r]),
                range_text(current.partition[r], names).c_str(), now_ms[r],
                slowdown(rank, p.partition[r]), range_text(p.partition[r], names).c_str(),
                p.stage_ms[r]);
  }
  std::printf("  predicted cycle time: current %.3f ms, proposed %.3f ms", p.current_cycle_ms,
              p.cycle_ms);
  if (p.changed) {
    std::printf(" (%.1f%% lower)\n  proposed: --partition %s\n",
                100.0 * (1.0 - p.cycle_ms / p.current_cycle_ms),
                parallel::partition_string(p.partition, names).c_str());
  } else {
    std::printf("\n  the current plan is kept: no candidate is faster\n");
  }
}

}  // namespace strata::tools
