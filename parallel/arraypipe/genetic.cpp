// Generational GA: evaluate, keep the elite, then fill the next population with offspring of
// tournament-selected pairs (POX with probability crossover_rate, then a swap mutation with
// probability mutation_rate each). Fitness is the decoded makespan (lower is fitter), so no
// inversion is needed as it would be for the paper's roulette wheel.
#include "parallel/arraypipe/genetic.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "engine/check.h"

namespace strata::parallel::arraypipe {

GaDecoding parse_ga_decoding(const std::string& name) {
  if (name == "semi-active") return GaDecoding::kSemiActive;
  if (name == "active") return GaDecoding::kActive;
  STRATA_THROW() << "ArrayPipe GA decoding: unknown '" << name << "'; valid: semi-active, active";
}

std::vector<int> pox_crossover(const std::vector<int>& keep, const std::vector<int>& fill,
                               const std::vector<bool>& job_set) {
  STRATA_CHECK_EQ(keep.size(), fill.size()) << "POX: parents of different lengths";
  std::vector<int> child(keep.size(), -1);
  for (size_t i = 0; i < keep.size(); ++i) {
    if (job_set.at(keep[i])) child[i] = keep[i];
  }
  size_t next = 0;
  for (int gene : fill) {
    if (job_set.at(gene)) continue;
    while (next < child.size() && child[next] >= 0) ++next;
    STRATA_CHECK_LT(next, child.size()) << "POX: parents hold different multisets of jobs";
    child[next++] = gene;
  }
  return child;
}

void swap_mutation(std::vector<int>* sequence, std::mt19937_64* rng) {
  if (sequence->size() < 2) return;
  std::uniform_int_distribution<size_t> pick(0, sequence->size() - 1);
  const size_t a = pick(*rng);
  size_t b = pick(*rng);
  while (b == a) b = pick(*rng);
  std::swap((*sequence)[a], (*sequence)[b]);
}

std::vector<int> active_sequence(const Instance& instance, const std::vector<int>& chromosome) {
  const int jobs = instance.jobs();
  const int ops = instance.operations_per_job();
  STRATA_CHECK_EQ(chromosome.size(), static_cast<size_t>(jobs) * ops)
      << "ArrayPipe GA: chromosome of the wrong length";
  // position[j][k]: where job j's k-th gene is; its priority for operation k.
  std::vector<int> seen(jobs, 0);
  std::vector<int> position(chromosome.size());
  for (size_t i = 0; i < chromosome.size(); ++i) {
    const int j = chromosome[i];
    STRATA_CHECK(j >= 0 && j < jobs && seen[j] < ops)
        << "ArrayPipe GA: chromosome holds job " << j << " too often or outside the array";
    position[static_cast<size_t>(j) * ops + seen[j]++] = static_cast<int>(i);
  }
  std::vector<int> next_op(jobs, 0);
  std::vector<double> job_ready(jobs, 0.0);
  std::vector<double> device_free(instance.stages(), 0.0);
  std::vector<int> out;
  out.reserve(chromosome.size());
  for (size_t step = 0; step < chromosome.size(); ++step) {
    int star = -1;
    double star_end = 0;
    for (int j = 0; j < jobs; ++j) {
      if (next_op[j] >= ops) continue;
      const int op = next_op[j];
      const double end =
          std::max(job_ready[j], device_free[instance.stage_of(op)]) + instance.occupancy(j, op);
      if (star < 0 || end < star_end) {
        star = j;
        star_end = end;
      }
    }
    const int device = instance.stage_of(next_op[star]);
    int pick = -1;
    for (int j = 0; j < jobs; ++j) {
      const int op = next_op[j];
      if (op >= ops || instance.stage_of(op) != device) continue;
      if (std::max(job_ready[j], device_free[device]) >= star_end) continue;
      if (pick < 0 || position[static_cast<size_t>(j) * ops + op] <
                          position[static_cast<size_t>(pick) * ops + next_op[pick]]) {
        pick = j;
      }
    }
    const int op = next_op[pick]++;
    const double e = std::max(job_ready[pick], device_free[device]);
    device_free[device] = e + instance.occupancy(pick, op);
    job_ready[pick] = e + instance.lag(pick, op);
    out.push_back(pick);
  }
  return out;
}

std::vector<int> random_sequence(int jobs, int copies, std::mt19937_64* rng) {
  std::vector<int> s;
  s.reserve(static_cast<size_t>(jobs) * copies);
  for (int j = 0; j < jobs; ++j) s.insert(s.end(), copies, j);
  std::shuffle(s.begin(), s.end(), *rng);
  return s;
}

GaResult genetic_schedule(const Instance& instance, const GaOptions& options,
                          const std::vector<std::vector<int>>& seeds) {
  validate_instance(instance);
  STRATA_CHECK(options.population >= 2 && options.generations >= 0)
      << "ArrayPipe GA: population " << options.population << " (at least 2) and generations "
      << options.generations << " (not negative)";
  STRATA_CHECK(options.tournament_size >= 1 && options.elite >= 0 &&
               options.elite < options.population)
      << "ArrayPipe GA: tournament size " << options.tournament_size << " (at least 1) and elite "
      << options.elite << " (0 to population - 1)";
  STRATA_CHECK(options.crossover_rate >= 0 && options.crossover_rate <= 1 &&
               options.mutation_rate >= 0 && options.mutation_rate <= 1)
      << "ArrayPipe GA: crossover rate " << options.crossover_rate << " and mutation rate "
      << options.mutation_rate << " must lie in [0, 1]";
  const auto start = std::chrono::steady_clock::now();
  const int jobs = instance.jobs();
  const int copies = instance.operations_per_job();
  std::mt19937_64 rng(options.seed);

  std::vector<std::vector<int>> population;
  for (const auto& s : seeds) {
    if (static_cast<int>(population.size()) < options.population) population.push_back(s);
  }
  while (static_cast<int>(population.size()) < options.population) {
    population.push_back(random_sequence(jobs, copies, &rng));
  }
  auto fitness_of = [&](const std::vector<int>& chromosome) {
    return options.decoding == GaDecoding::kActive
               ? decode_makespan(instance, active_sequence(instance, chromosome))
               : decode_makespan(instance, chromosome);
  };
  std::vector<double> fitness(population.size());
  for (size_t i = 0; i < population.size(); ++i) fitness[i] = fitness_of(population[i]);

  GaResult result;
  auto best_index = [&] {
    return static_cast<size_t>(std::min_element(fitness.begin(), fitness.end()) - fitness.begin());
  };
  result.sequence = population[best_index()];
  result.makespan = fitness[best_index()];

  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::uniform_int_distribution<size_t> any(0, population.size() - 1);
  auto tournament = [&]() -> const std::vector<int>& {
    size_t winner = any(rng);
    for (int k = 1; k < options.tournament_size; ++k) {
      const size_t other = any(rng);
      if (fitness[other] < fitness[winner]) winner = other;
    }
    return population[winner];
  };

  std::vector<size_t> order(population.size());
  std::vector<bool> job_set(jobs);
  for (int g = 0; g < options.generations; ++g) {
    if (options.time_limit_s > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >=
            options.time_limit_s) {
      break;
    }
    std::vector<std::vector<int>> next;
    next.reserve(population.size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + options.elite, order.end(),
                      [&](size_t a, size_t b) { return fitness[a] < fitness[b]; });
    for (int e = 0; e < options.elite; ++e) next.push_back(population[order[e]]);
    while (next.size() < population.size()) {
      const std::vector<int>& a = tournament();
      const std::vector<int>& b = tournament();
      std::vector<int> c1 = a;
      std::vector<int> c2 = b;
      if (coin(rng) < options.crossover_rate) {
        for (int j = 0; j < jobs; ++j) job_set[j] = coin(rng) < 0.5;
        c1 = pox_crossover(a, b, job_set);
        c2 = pox_crossover(b, a, job_set);
      }
      for (auto* c : {&c1, &c2}) {
        if (coin(rng) < options.mutation_rate) swap_mutation(c, &rng);
        if (next.size() < population.size()) next.push_back(std::move(*c));
      }
    }
    population = std::move(next);
    for (size_t i = 0; i < population.size(); ++i) fitness[i] = fitness_of(population[i]);
    const size_t b = best_index();
    if (fitness[b] < result.makespan) {
      result.makespan = fitness[b];
      result.sequence = population[b];
    }
    result.best_per_generation.push_back(result.makespan);
    ++result.generations_run;
  }
  if (options.decoding == GaDecoding::kActive) {
    result.sequence = active_sequence(instance, result.sequence);
  }
  result.schedule = decode(instance, result.sequence);
  result.makespan = makespan(instance, result.schedule);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace strata::parallel::arraypipe
