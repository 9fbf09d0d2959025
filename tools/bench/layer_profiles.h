// Synthetic per-layer time profiles for partitioner tests and the AMPA-vs-optimum sweep
// (tests/parallel/test_projection.cpp, tools/bench/ampa_gap.cpp).
#pragma once

#include <functional>
#include <random>
#include <string>
#include <vector>

namespace strata::bench {

// Profiles a partitioner meets: random ones, near-uniform ones (where normalization hurts most),
// heavy-tailed ones, and the shapes of transformers (embedding, equal blocks or attention/MLP
// pairs, a large head) and ResNets (costs that change by stage).
struct ProfileFamily {
  std::string name;
  std::function<std::vector<double>(std::mt19937&, size_t)> times;
};

inline std::vector<ProfileFamily> profile_families() {
  auto u = [](std::mt19937& rng, double a, double b) {
    return std::uniform_real_distribution<double>(a, b)(rng);
  };
  std::vector<ProfileFamily> f;
  f.push_back({"uniform", [u](std::mt19937& rng, size_t L) {
                 std::vector<double> t(L);
                 for (double& v : t) v = u(rng, 0.0, 10.0);
                 return t;
               }});
  f.push_back({"near-uniform", [](std::mt19937& rng, size_t L) {
                 std::vector<double> t(L);
                 for (double& v : t) v = 10.0 + static_cast<double>(rng() % 3);
                 return t;
               }});
  f.push_back({"lognormal", [](std::mt19937& rng, size_t L) {
                 std::lognormal_distribution<double> d(0.0, 1.0);
                 std::vector<double> t(L);
                 for (double& v : t) v = d(rng);
                 return t;
               }});
  f.push_back({"one heavy layer", [u](std::mt19937& rng, size_t L) {
                 std::vector<double> t(L, 1.0);
                 t[rng() % L] = u(rng, 2.0, 3.0 * static_cast<double>(L));
                 return t;
               }});
  f.push_back({"transformer blocks", [u](std::mt19937& rng, size_t L) {
                 // embedding, L - 3 equal blocks (+-2%), final norm, LM head of 2-6 blocks.
                 std::vector<double> t{u(rng, 0.1, 0.5)};
                 const double block = u(rng, 5.0, 10.0);
                 while (t.size() + 2 < L) t.push_back(block * u(rng, 0.98, 1.02));
                 t.push_back(0.05);
                 t.push_back(block * u(rng, 2.0, 6.0));
                 return t;
               }});
  f.push_back({"transformer attention/MLP", [u](std::mt19937& rng, size_t L) {
                 // Blocks cut in two layers: attention (a) and MLP (b ~ 2a), then norm and head.
                 std::vector<double> t{u(rng, 0.1, 0.5)};
                 const double a = u(rng, 2.0, 5.0), b = a * u(rng, 1.5, 2.5);
                 while (t.size() + 2 < L) t.push_back(t.size() % 2 == 1 ? a : b);
                 t.push_back(0.05);
                 t.push_back(u(rng, 3.0, 20.0) * a);
                 return t;
               }});
  f.push_back({"resnet", [u](std::mt19937& rng, size_t L) {
                 // Stem, four stages whose convolutions cost about the same per layer but
                 // alternate with cheap batch norms and ReLUs, pooling and a small classifier.
                 std::vector<double> t{u(rng, 1.0, 3.0)};
                 while (t.size() + 2 < L) {
                   const size_t i = t.size();
                   const double conv =
                       u(rng, 3.0, 6.0) * (1.0 + 0.2 * static_cast<double>((4 * i) / L));
                   t.push_back(i % 3 == 1 ? conv : u(rng, 0.1, 0.4));
                 }
                 t.push_back(0.1);
                 t.push_back(u(rng, 0.2, 1.0));
                 return t;
               }});
  return f;
}

}  // namespace strata::bench
