// Genetic algorithm for large job-arrays (papers/arraypipe.md §2.6): operation-based encoding
// (each job's index appears 2S times; its k-th occurrence is its operation k), semi-active
// decoding (decode() in instance.h; every chromosome is feasible), Precedence Operation Crossover
// (POX), swap mutation and tournament selection, with the best individual kept (elitism) and a
// seeded generator, so a seed gives the same schedule on every machine.
//
// The paper gives none of the GA's parameters; the defaults are those of the FJSP GA in the
// authors' repository (population 200, crossover 0.8, mutation 0.3, 100 generations).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "parallel/arraypipe/instance.h"

namespace strata::parallel::arraypipe {

// How a chromosome becomes a schedule.
//   kSemiActive  the paper's: the k-th occurrence of job j appends j's operation k to its device
//                at the earliest time (decode() in instance.h).
//   kActive      Giffler-Thompson decoding with the chromosome as a priority list: the next
//                operation that can end first fixes the device, and among the operations that
//                could start on it before that end, the one whose gene comes first runs. Only
//                active schedules come out (no block could start earlier without delaying
//                another), which the semi-active decoding of a random chromosome seldom gives.
enum class GaDecoding { kSemiActive, kActive };
// "semi-active" | "active"; anything else throws strata::Error listing both.
GaDecoding parse_ga_decoding(const std::string& name);

struct GaOptions {
  int population = 200;
  int generations = 100;
  double crossover_rate = 0.8;  // a selected pair is recombined by POX, else copied
  double mutation_rate = 0.3;   // each offspring gets one swap of two random positions
  int tournament_size = 2;      // selection: the fittest of this many random individuals
  int elite = 1;                // the best individuals copied unchanged into the next generation
  uint64_t seed = 1;
  double time_limit_s = 0;  // stop after this long (0: run every generation)
  GaDecoding decoding = GaDecoding::kSemiActive;
};

struct GaResult {
  std::vector<int> sequence;  // the best schedule as an operation sequence (decode() it)
  TimedSchedule schedule;     // decode(instance, sequence)
  double makespan = 0;
  std::vector<double> best_per_generation;  // best-so-far makespan after each generation
  int generations_run = 0;
  double seconds = 0;
};

// Runs the GA. `seeds` are chromosomes placed in the first population (say a baseline's); the
// rest is random.
GaResult genetic_schedule(const Instance& instance, const GaOptions& options = {},
                          const std::vector<std::vector<int>>& seeds = {});

// POX: the child keeps parent `keep`'s genes of the jobs in `job_set` at their positions and
// fills the other positions, left to right, with parent `fill`'s genes of the other jobs in
// their order. job_set[j] says whether job j is in the set.
std::vector<int> pox_crossover(const std::vector<int>& keep, const std::vector<int>& fill,
                               const std::vector<bool>& job_set);
// Swaps two distinct random positions (no-op on sequences shorter than 2).
void swap_mutation(std::vector<int>* sequence, std::mt19937_64* rng);
// kActive's decoding of a chromosome: the operation sequence of the active schedule it stands for
// (decode() of it gives that schedule).
std::vector<int> active_sequence(const Instance& instance, const std::vector<int>& chromosome);
// A random chromosome: each job `copies` times, shuffled.
std::vector<int> random_sequence(int jobs, int copies, std::mt19937_64* rng);

}  // namespace strata::parallel::arraypipe
