// The sampler works on the host in double precision: the logits of one position (V floats) are
// copied from the device once per token, which costs little beside the model's forward.
#include "models/generation.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/check.h"
#include "engine/philox.h"

namespace strata::models {

void check_sampling(const SamplingOptions& o) {
  STRATA_CHECK(std::isfinite(o.temperature) && o.temperature >= 0)
      << "--temperature must be >= 0 (0 = always the most likely token), got " << o.temperature;
  STRATA_CHECK(o.top_k >= 0) << "--top-k must be >= 0 (0 = no limit), got " << o.top_k;
  STRATA_CHECK(o.top_p > 0 && o.top_p <= 1)
      << "--top-p must be in (0, 1] (1 = no limit), got " << o.top_p;
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& o, int64_t index) {
  STRATA_CHECK_GT(vocab, 0) << "sample_token: no logits";
  if (o.vocab_limit > 0) vocab = std::min(vocab, o.vocab_limit);
  if (o.temperature == 0) {
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  // Token ids by decreasing logit (ties: lower id first), cut to top_k.
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, vocab) : vocab;
  auto more_likely = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), more_likely);
  order.resize(static_cast<size_t>(k));
  // Softmax of logits / T over the kept tokens.
  const double top = logits[order[0]] / o.temperature;
  std::vector<double> p(order.size());
  double total = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    p[i] = std::exp(logits[order[i]] / o.temperature - top);
    total += p[i];
  }
  // Nucleus: the shortest head of the sorted list holding at least top_p of the mass.
  size_t keep = order.size();
  if (o.top_p < 1) {
    double mass = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      mass += p[i] / total;
      if (mass >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  // One uniform draw in [0, kept), from (seed, index).
  const PhiloxCounter bits = philox4x32_10(
      PhiloxCounter{{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0, 0}},
      philox_key(o.seed, 0x67656e));  // stream "gen"
  const double u =
      (static_cast<double>(bits.v[0] >> 5) * 67108864.0 + static_cast<double>(bits.v[1] >> 6)) /
      9007199254740992.0;  // 53 random bits in [0, 1)
  double target = u * kept;
  for (size_t i = 0; i < keep; ++i) {
    target -= p[i];
    if (target < 0) return order[i];
  }
  return order[keep - 1];
}

std::vector<int32_t> generate(ExecContext& ctx, graph::Decoder& decoder,
                              const std::vector<int32_t>& prompt, int64_t max_tokens,
                              const SamplingOptions& options,
                              const std::function<bool(int32_t)>& on_token) {
  STRATA_CHECK(!prompt.empty()) << "generate: the prompt needs at least one token";
  check_sampling(options);
  std::vector<int32_t> out;
  Tensor ids = Tensor::from_vector<int32_t>(prompt, {1, static_cast<int64_t>(prompt.size())});
  for (int64_t i = 0; i < max_tokens; ++i) {
    const Tensor logits = decoder.forward(ctx, {to_allocator(ids, ctx.allocator())})[0];
    const int64_t vocab = logits.size(2);  // logits (1, T, V): the last position's, on the host
    ctx.synchronize();
    const Tensor last =
        to_allocator(logits.select(1, logits.size(1) - 1).contiguous(), default_cpu_allocator())
            .to(DType::kF32);
    const int32_t next = sample_token(last.data<float>(), vocab, options, i);
    out.push_back(next);
    if (on_token && !on_token(next)) break;
    ids = Tensor::from_vector<int32_t>({next}, {1, 1});
  }
  return out;
}

}  // namespace strata::models
