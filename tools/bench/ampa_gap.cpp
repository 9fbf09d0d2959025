// AMPA (GroPipe's Algorithm 1, parallel/partition/projection.h) against the exact min-max
// partition (parallel/partition/partition.h): the gap of its slowest stage in raw time, slowest /
// optimum - 1, over synthetic profile families (layer_profiles.h) and real profiles.
//
//   ampa_gap [--trials 100] [--layers 8,16,32,64,128] [--stages 2,4,8] [--profile p.json ...]
//
// For every family and AMPA variant (Eq. 9's normalization on or off, the stopping threshold),
// over trials x layer counts x stage counts: the mean, median, 90th percentile and largest gap of
// AMPA as the paper runs it (--ampa-guard off), how often it is slower than the even split, and
// the mean gap once guarded by the even split (--ampa-guard even, strata's default). A profile
// from `strata profile --output` is cut into each stage count with each variant.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/check.h"
#include "parallel/partition/partition.h"
#include "parallel/partition/projection.h"
#include "tools/bench/layer_profiles.h"

namespace strata {
namespace {

struct Variant {
  std::string name;
  bool normalize;
  double threshold;
};

struct Gaps {
  std::vector<double> paper, guarded;
  int slower_than_even = 0;
  void add(const std::vector<parallel::LayerCost>& costs, int k, const Variant& v) {
    parallel::PartitionOptions po;
    parallel::ProjectionOptions o;
    o.normalize = v.normalize;
    o.threshold = v.threshold;
    o.guard = parallel::AmpaGuard::kEven;
    parallel::AmpaResult r;
    const parallel::PartitionPlan guard = parallel::projection_partition(costs, k, po, o, &r);
    const double optimum = parallel::balanced_partition(costs, k, po).slowest_ms;
    paper.push_back(r.ampa_slowest_ms / optimum - 1.0);
    guarded.push_back(guard.slowest_ms / optimum - 1.0);
    slower_than_even += r.ampa_slowest_ms > r.even_slowest_ms;
  }
};

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}
double mean(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    out.push_back(std::stoll(text.substr(at, comma - at)));
    at = comma + 1;
  }
  return out;
}

void print_header() {
  std::printf("%-28s %-18s %6s %8s %8s %8s %8s %11s %9s\n", "profiles", "AMPA", "cases", "mean",
              "median", "p90", "max", ">even split", "guarded");
}
void print_row(const std::string& what, const std::string& variant, const Gaps& g) {
  std::printf("%-28s %-18s %6zu %7.1f%% %7.1f%% %7.1f%% %7.1f%% %10.1f%% %8.1f%%\n", what.c_str(),
              variant.c_str(), g.paper.size(), 100 * mean(g.paper), 100 * quantile(g.paper, 0.5),
              100 * quantile(g.paper, 0.9), 100 * quantile(g.paper, 1.0),
              100.0 * g.slower_than_even / std::max<size_t>(1, g.paper.size()),
              100 * mean(g.guarded));
}

int run(int argc, char** argv) {
  int trials = 100;
  std::string layers = "8,16,32,64,128", stages = "2,4,8";
  std::vector<std::string> profiles;
  uint64_t seed = 1;
  CLI::App app("AMPA's slowest stage against the exact min-max partition");
  app.option_defaults()->always_capture_default();
  app.add_option("--trials", trials, "Random profiles per family, layer count and stage count");
  app.add_option("--layers", layers, "Layer counts L of the synthetic profiles");
  app.add_option("--stages", stages, "Stage counts k");
  app.add_option("--profile", profiles, "Profiles from `strata profile --output` (repeatable)");
  app.add_option("--seed", seed, "Seed of the synthetic profiles");
  CLI11_PARSE(app, argc, argv);
  STRATA_CHECK(trials >= 0) << "--trials must be >= 0";
  const std::vector<int64_t> Ls = parse_list(layers), ks = parse_list(stages);
  const std::vector<Variant> variants = {
      {"normalized, 0.01", true, 0.01}, {"raw, 0.01", false, 0.01}, {"normalized, 0", true, 0.0}};
  std::printf(
      "gap = AMPA's slowest stage / the exact min-max partition's - 1 (raw time); AMPA as the "
      "paper runs it (--ampa-guard off); '>even split': share of cases where it is slower than "
      "the even split; 'guarded': mean gap with --ampa-guard even. L in {%s}, k in {%s}, %d "
      "trials each.\n\n",
      layers.c_str(), stages.c_str(), trials);
  print_header();
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<Gaps> all(variants.size());
  for (const bench::ProfileFamily& family : bench::profile_families()) {
    std::vector<Gaps> gaps(variants.size());
    for (int64_t L : Ls) {
      for (int64_t k : ks) {
        if (k >= L) continue;
        for (int t = 0; t < trials; ++t) {
          std::vector<parallel::LayerCost> costs;
          const std::vector<double> times = family.times(rng, static_cast<size_t>(L));
          for (size_t l = 0; l < times.size(); ++l) {
            costs.push_back({"l" + std::to_string(l), times[l], 2 * times[l]});
          }
          for (size_t v = 0; v < variants.size(); ++v) {
            gaps[v].add(costs, static_cast<int>(k), variants[v]);
          }
        }
      }
    }
    for (size_t v = 0; v < variants.size(); ++v) {
      print_row(family.name, variants[v].name, gaps[v]);
      all[v].paper.insert(all[v].paper.end(), gaps[v].paper.begin(), gaps[v].paper.end());
      all[v].guarded.insert(all[v].guarded.end(), gaps[v].guarded.begin(), gaps[v].guarded.end());
      all[v].slower_than_even += gaps[v].slower_than_even;
    }
  }
  for (size_t v = 0; v < variants.size(); ++v) print_row("all synthetic", variants[v].name, all[v]);
  for (const std::string& path : profiles) {
    const std::vector<parallel::LayerCost> costs = parallel::read_profile_file(path);
    for (int64_t k : ks) {
      if (static_cast<size_t>(k) >= costs.size()) continue;
      for (const Variant& v : variants) {
        Gaps g;
        g.add(costs, static_cast<int>(k), v);
        const std::string name = path.substr(path.find_last_of('/') + 1) + " (" +
                                 std::to_string(costs.size()) + "), k=" + std::to_string(k);
        print_row(name, v.name, g);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  try {
    return strata::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampa_gap: %s\n", e.what());
    return 1;
  }
}
