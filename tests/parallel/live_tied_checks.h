// Live migrations of a model with a tied parameter split between stages: GPT-2 tiny (embed,
// blocks.0-2, head; head.weight is a copy of embed.wte.weight on another stage) with dropout, on
// random tokens. The cases move blocks between stages while the embedding and the head stay in
// their stages' cores; the executors sum the two copies' gradients over the tied communicator at
// every update, which the oracle of live_stage_checks.h models (replay: owner + copy).
#pragma once

#include <memory>
#include <vector>

#include "graph/model_spec.h"
#include "live_stage_checks.h"
#include "models/registry.h"

namespace strata::parallel::live_tied_checks {

constexpr int64_t kTokens = 8;  // sequence length
constexpr int64_t kVocab = 32;
constexpr int64_t kRows = 4;

// embed blocks.0 blocks.1 blocks.2 head: five layers.
inline std::unique_ptr<graph::Model> make_gpt2() {
  models::ModelRequest r;
  r.name = "gpt2";
  r.size = "tiny";
  r.input_shape = {kTokens};
  r.num_classes = kVocab;
  r.dims.layers = 3;
  r.dims.width = 16;
  r.dims.heads = 2;
  r.dims.seq_len = kTokens;
  return graph::build_model(models::model_spec(r));
}

// Group `group` of `groups`: its own rows of every micro-batch, the loss normalized by the
// tokens of all groups.
class Tokens final : public MicroBatchSource {
 public:
  Tokens(int group, int groups) : group_(group), groups_(groups) {}
  Info info(int64_t mb) override {
    return {mb, kRows * group_, kRows, static_cast<double>(kRows * kTokens * groups_)};
  }
  TensorList input(int64_t mb) override {
    return {strata::testing::random_ids({kRows, kTokens}, kVocab, seed(700, mb), DType::kI32)};
  }
  Tensor target(int64_t mb) override {
    return strata::testing::random_ids({kRows, kTokens}, kVocab, seed(800, mb));
  }

 private:
  uint64_t seed(uint64_t base, int64_t mb) const {
    return base + static_cast<uint64_t>(mb) + 1000 * static_cast<uint64_t>(group_);
  }
  int group_, groups_;
};

inline live_stage_checks::Fixture gpt2_fixture() {
  live_stage_checks::Fixture f;
  f.model = make_gpt2;
  f.source = [](int group, int groups) { return std::make_unique<Tokens>(group, groups); };
  f.forward_seed = 7;  // dropout on
  return f;
}

// Blocks move; embed (stage 0) and head (the last stage) stay.
inline std::vector<live_stage_checks::Case> cases(int S) {
  const live_stage_checks::Fixture f = gpt2_fixture();
  if (S == 2) {
    return {
        {"gpt2 S=2 down: blocks.0 0->1", {{0, 2}, {2, 5}}, {{0, 1}, {1, 5}}, 3, 8, {}, f},
        {"gpt2 S=2 up: blocks.1 1->0", {{0, 2}, {2, 5}}, {{0, 3}, {3, 5}}, 4, 8, {}, f},
    };
  }
  if (S == 3) {
    return {
        // Both boundaries of stage 1 at once, each layer up: blocks.0 1->0 and blocks.2 2->1.
        {"gpt2 S=3 up: blocks.0 1->0, blocks.2 2->1",
         {{0, 1}, {1, 3}, {3, 5}},
         {{0, 2}, {2, 4}, {4, 5}},
         4,
         10,
         {},
         f},
    };
  }
  return {
      {"gpt2 S=4 up: blocks.1 2->1",
       {{0, 1}, {1, 2}, {2, 4}, {4, 5}},
       {{0, 1}, {1, 3}, {3, 4}, {4, 5}},
       5,
       12,
       {},
       f},
  };
}

}  // namespace strata::parallel::live_tied_checks
