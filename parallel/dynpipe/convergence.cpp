#include "parallel/dynpipe/convergence.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "engine/check.h"

namespace strata::parallel::dynpipe {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double norm_of_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0.0;
  for (size_t k = 0; k < a.size(); ++k) sum += (a[k] - b[k]) * (a[k] - b[k]);
  return std::sqrt(sum);
}

// `what` names the vector ("the gradient of iteration 3") in errors.
void check_vector(const std::vector<double>& v, size_t length, const std::string& what) {
  STRATA_CHECK(v.size() == length) << "dynpipe warm-up: " << what << " has " << v.size()
                                   << " values, the first weights have " << length;
  for (size_t k = 0; k < v.size(); ++k) {
    STRATA_CHECK(std::isfinite(v[k]))
        << "dynpipe warm-up: " << what << " is not finite at element " << k << " (" << v[k] << ")";
  }
}

void check_vectors(const std::vector<std::vector<double>>& v, size_t length, const char* what) {
  for (size_t t = 0; t < v.size(); ++t) {
    check_vector(v[t], length, std::string(what) + " of iteration " + std::to_string(t));
  }
}

// The median, mean and max of the samples (throws when there is none).
SmoothnessEstimate summarize(std::vector<double> samples, int skipped, size_t steps) {
  STRATA_CHECK(!samples.empty())
      << "dynpipe warm-up: the weights never changed in " << steps
      << " steps, so the smoothness L cannot be estimated (is the learning rate 0?)";
  SmoothnessEstimate e;
  e.samples = samples;
  e.skipped = skipped;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  e.median = n % 2 == 1 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2.0;
  e.max = samples.back();
  for (double s : samples) e.mean += s;
  e.mean /= static_cast<double>(n);
  return e;
}

}  // namespace

SmoothnessEstimate estimate_smoothness(const std::vector<std::vector<double>>& weights,
                                       const std::vector<std::vector<double>>& gradients) {
  STRATA_CHECK(weights.size() >= 2)
      << "dynpipe warm-up: the smoothness L needs at least two iterations, got " << weights.size();
  STRATA_CHECK(gradients.size() == weights.size())
      << "dynpipe warm-up: " << gradients.size() << " gradients for " << weights.size()
      << " weight vectors";
  check_vectors(weights, weights[0].size(), "the weights");
  check_vectors(gradients, weights[0].size(), "the gradient");
  std::vector<double> samples;
  int skipped = 0;
  for (size_t t = 1; t < weights.size(); ++t) {
    const double dw = norm_of_difference(weights[t], weights[t - 1]);
    if (dw == 0.0) {
      ++skipped;
      continue;
    }
    samples.push_back(norm_of_difference(gradients[t], gradients[t - 1]) / dw);
  }
  return summarize(samples, skipped, weights.size());
}

double estimate_second_moment(const std::vector<std::vector<double>>& gradients) {
  STRATA_CHECK(!gradients.empty()) << "dynpipe warm-up: no gradient to estimate xi^2 from";
  check_vectors(gradients, gradients[0].size(), "the gradient");
  double mean = 0.0;
  for (const std::vector<double>& g : gradients) {
    double sq = 0.0;
    for (double v : g) sq += v * v;
    mean += sq;
  }
  return mean / static_cast<double>(gradients.size());
}

WarmupEstimate estimate_warmup(const std::vector<WarmupStep>& steps) {
  STRATA_CHECK(!steps.empty()) << "dynpipe warm-up: no step measured";
  const size_t n = steps[0].weights.size();
  std::vector<double> samples;
  std::vector<std::vector<double>> gradients;
  int skipped = 0;
  for (size_t t = 0; t < steps.size(); ++t) {
    const WarmupStep& s = steps[t];
    const std::string step = " of step " + std::to_string(t);
    check_vector(s.weights, n, "the weights" + step);
    check_vector(s.gradient, n, "the gradient" + step);
    check_vector(s.next_weights, n, "the next weights" + step);
    check_vector(s.next_gradient, n, "the next gradient" + step);
    STRATA_CHECK(std::isfinite(s.loss))
        << "dynpipe warm-up: the loss of step " << t << " is not finite (" << s.loss << ")";
    const double dw = norm_of_difference(s.next_weights, s.weights);
    if (dw == 0.0) {
      ++skipped;
    } else {
      samples.push_back(norm_of_difference(s.next_gradient, s.gradient) / dw);
    }
    gradients.push_back(s.gradient);
  }
  WarmupEstimate e;
  e.smoothness = summarize(samples, skipped, steps.size());
  e.second_moment = estimate_second_moment(gradients);
  e.initial_loss = steps[0].loss;
  e.iterations = static_cast<int>(steps.size());
  return e;
}

void check_convergence_inputs(const ConvergenceInputs& in) {
  STRATA_CHECK(std::isfinite(in.lr) && in.lr > 0)
      << "--dynpipe-lr (the learning rate eta) must be positive, got " << in.lr;
  STRATA_CHECK(std::isfinite(in.epsilon) && in.epsilon > 0)
      << "--dynpipe-epsilon (the target error) must be positive, got " << in.epsilon;
  STRATA_CHECK(std::isfinite(in.smoothness) && in.smoothness >= 0)
      << "--dynpipe-smoothness (L) must be >= 0, got " << in.smoothness;
  STRATA_CHECK(std::isfinite(in.second_moment) && in.second_moment >= 0)
      << "--dynpipe-noise (xi^2) must be >= 0, got " << in.second_moment;
  STRATA_CHECK(std::isfinite(in.initial_loss) && in.initial_loss > 0)
      << "--dynpipe-initial-loss (f(w0)) must be positive, got " << in.initial_loss;
}

double staleness_error(const ConvergenceInputs& in, int stages) {
  const double s = stages;
  return 2.0 * in.lr * in.lr * s * s * s * in.smoothness * in.smoothness * in.second_moment;
}

double required_updates(const ConvergenceInputs& in, int stages) {
  check_convergence_inputs(in);
  STRATA_CHECK(stages >= 1) << "dynpipe: at least one stage, got " << stages;
  const double room = in.epsilon - staleness_error(in, stages);
  if (!(room > 0)) return kInf;
  return 2.0 * in.initial_loss / (in.lr * room);
}

StageChoice choose_stages(const ConvergenceInputs& in, const std::vector<double>& iteration_ms,
                          bool stop_at_turning_point) {
  check_convergence_inputs(in);
  StageChoice choice;
  double best = kInf;
  double previous = kInf;
  for (size_t k = 0; k < iteration_ms.size(); ++k) {
    StageCandidate c;
    c.stages = static_cast<int>(k) + 1;
    c.updates = required_updates(in, c.stages);
    c.iteration_ms = iteration_ms[k];
    c.total_ms = std::isfinite(c.updates) && std::isfinite(c.iteration_ms)
                     ? c.updates * c.iteration_ms
                     : kInf;
    choice.evaluated.push_back(c);
    if (c.total_ms < best) {
      best = c.total_ms;
      choice.stages = c.stages;
    }
    if (stop_at_turning_point && k + 1 < iteration_ms.size()) {
      if (!std::isfinite(c.updates) || (std::isfinite(previous) && c.total_ms > previous)) {
        choice.stopped_early = true;
        break;
      }
    }
    if (std::isfinite(c.total_ms)) previous = c.total_ms;
  }
  return choice;
}

}  // namespace strata::parallel::dynpipe
