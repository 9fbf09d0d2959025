// DynPipe's convergence-aware choice of the number of stages (papers/dynpipe.md Secs. 2.3, 2.5;
// the paper's Eqs. 2-3 and Algorithm 1).
//
// Theorem 1 (L-smooth loss, E||g||^2 <= xi^2, eta L <= 1) bounds the mean squared gradient norm
// after T updates of asynchronous 1F1B with S stages by 2 (f(w0) - f(wT)) / (T eta)
// + 2 eta^2 S^3 L^2 xi^2 + 2 sigma^2 / B. Dropping the variance term and taking f(wT) = 0, the
// error is below epsilon after (Eq. 3)
//   T(S) = 2 f(w0) / (eta (epsilon - 2 eta^2 S^3 L^2 xi^2))
// updates, and never when epsilon <= 2 eta^2 S^3 L^2 xi^2 (T = infinity). Algorithm 1 picks the S
// of least T(S) x W(S), W(S) the iteration time of the best S-stage plan (cost_model.h).
//
// Warm-up estimates (what the paper leaves open, decided here):
//   L: samples ||g(w') - g(w)|| / ||w' - w|| (pairs with w' = w are skipped); their median is the
//      estimate (robust to a few tiny steps), mean and max are reported beside it. The paper takes
//      consecutive iterations, g_t and g_{t-1}; with stochastic gradients each on its own batch,
//      the difference is then mostly the batches' noise, which grows as the step shrinks
//      (Fashion-MNIST, cnn-tiny: L ~ 1.3 / lr). estimate_warmup therefore takes, per warm-up
//      step, the gradients before and after the update on the same batch (the full gradient's
//      difference, as Assumption 1 has it, without the noise); estimate_smoothness keeps the
//      consecutive form for deterministic gradients.
//   xi^2: the mean of ||g_t||^2 over the warm-up (the bounded second moment is an expectation).
//   f(w0): the first warm-up loss.
#pragma once

#include <string>
#include <vector>

namespace strata::parallel::dynpipe {

struct SmoothnessEstimate {
  std::vector<double> samples;  // one per pair of consecutive iterations with w_t != w_{t-1}
  int skipped = 0;              // pairs with w_t == w_{t-1}
  double median = 0.0;          // the estimate
  double mean = 0.0;
  double max = 0.0;
};

// From the weights and the gradients at them of consecutive iterations (same length vectors).
// Throws strata::Error for fewer than two iterations, vectors of different lengths, non-finite
// values or when every step is zero.
SmoothnessEstimate estimate_smoothness(const std::vector<std::vector<double>>& weights,
                                       const std::vector<std::vector<double>>& gradients);

// One warm-up step: the stochastic gradient at w_t on its batch, the update, and the gradient
// at w_{t+1} on the same batch.
struct WarmupStep {
  std::vector<double> weights;        // w_t
  std::vector<double> gradient;       // at w_t on batch t
  std::vector<double> next_weights;   // w_{t+1}
  std::vector<double> next_gradient;  // at w_{t+1} on batch t
  double loss = 0.0;                  // at w_t on batch t
};
// Mean of ||g_t||^2. Throws for no gradient or non-finite values.
double estimate_second_moment(const std::vector<std::vector<double>>& gradients);

// Eq. 3's inputs.
struct ConvergenceInputs {
  double lr = 0.0;             // eta
  double epsilon = 0.0;        // the target error
  double smoothness = 0.0;     // L
  double second_moment = 0.0;  // xi^2
  double initial_loss = 0.0;   // f(w0)
};

// The warm-up's estimates, with the lr and epsilon of the run.
struct WarmupEstimate {
  SmoothnessEstimate smoothness;
  double second_moment = 0.0;
  double initial_loss = 0.0;
  int iterations = 0;
};
// L from each step's same-batch pair, xi^2 from the gradients at w_t, f(w0) the first loss.
// Throws strata::Error (naming the step) for no step, vectors of different lengths, non-finite
// values, or when no step moved the weights.
WarmupEstimate estimate_warmup(const std::vector<WarmupStep>& steps);

// Throws strata::Error naming the flag (--dynpipe-lr, --dynpipe-epsilon, --dynpipe-smoothness,
// --dynpipe-noise, --dynpipe-initial-loss) for a value that is not finite, or not positive (lr,
// epsilon, initial loss) or negative (L, xi^2).
void check_convergence_inputs(const ConvergenceInputs& in);
// 2 eta^2 S^3 L^2 xi^2.
double staleness_error(const ConvergenceInputs& in, int stages);
// Eq. 3; infinity when epsilon <= the staleness error.
double required_updates(const ConvergenceInputs& in, int stages);

struct StageCandidate {
  int stages = 0;
  double updates = 0.0;       // T(S)
  double iteration_ms = 0.0;  // W(S)
  double total_ms = 0.0;      // T(S) x W(S) (infinity when either is)
};

struct StageChoice {
  int stages = 0;                         // the S of least T x W; 0 when none is finite
  std::vector<StageCandidate> evaluated;  // S = 1, 2, ... as far as the search went
  bool stopped_early = false;             // the turning-point rule ended the search
};

// Algorithm 1 over S = 1..iteration_ms.size() (iteration_ms[S - 1] = W(S), infinite where no
// plan exists). With `stop_at_turning_point` the search ends at the first S whose finite T x W
// exceeds the previous finite one, or whose T(S) is infinite (T grows with S). Ties keep the
// smaller S.
StageChoice choose_stages(const ConvergenceInputs& in, const std::vector<double>& iteration_ms,
                          bool stop_at_turning_point);

}  // namespace strata::parallel::dynpipe
