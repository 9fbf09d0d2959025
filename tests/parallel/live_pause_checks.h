// DynPipe's paused-update migration inside async-1f1b's executor (parallel/runtime/live_pause.h)
// against a one-process replay; shared by the local-thread test (test_live_pause.cpp) and the
// MPI one (test_live_pause_mpi.cpp). The model, data and optimizer are live_stage_checks.h's.
//
// The replay knows nothing of the executor or the protocol beyond the three micro-batches the run
// recorded: P (the pause), K (the take-over) and R (the resume). Every layer but the moved ones L
// keeps Eq. 4 of its stage. L's versions: W[u] after u updates, one per micro-batch j < P; none
// for j in [P, R); at R one update with the sum of the gradients of [K, R] (accumulated in order
// by the backwards, as the target's store accumulates them) plus the sum of those of [P, K) (the
// source's, likewise); then one per micro-batch. The forward of micro-batch j on stage s (src
// before F = K + S - src - 1, tgt from it) runs L on the latest version there, c = j - S + s the
// last micro-batch whose update came before it: W[c + 1] for c < P, W[P] for P <= c < R,
// W[P + 1 + c - R] after. Its backward on the same weights. Losses and weights must agree bit
// for bit.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "live_stage_checks.h"
#include "ops/elementwise.h"
#include "parallel/runtime/live_pause.h"

namespace strata::parallel::live_pause_checks {

using live_stage_checks::Weights;

struct Case {
  std::string name;
  Partition initial, next;
  int64_t pause_at = 0;       // P
  int64_t micro_batches = 0;  // N
  int stages() const { return static_cast<int>(initial.size()); }
  BoundaryMove move() const {
    StageLayout l(initial);
    l.add_live_migration(next, pause_at);
    return l.migrations().front().front();
  }
};

struct Points {
  int64_t take_over = -1, resume = -1;  // K, R as the run recorded them
};

struct Replay {
  Weights weights;
  std::vector<double> losses;
  double loss = 0.0;
};

// `drop_flush`: the source's buffered gradients left out (a replay the run must not match).
inline Replay replay(const Case& c, Points p, bool drop_flush = false) {
  auto model = live_stage_checks::make_model();
  ExecContext ctx(Device::cpu(), nullptr, 1);
  graph::ParamStore store(*model, 0, model->size(), ctx.allocator());
  store.initialize(live_stage_checks::kSeed);
  const int S = c.stages();
  const BoundaryMove m = c.move();
  const int64_t P = c.pause_at, K = p.take_over, R = p.resume;
  const int64_t F = K + S - m.src - 1;
  const auto& entries = store.param_entries();
  auto moved = [&](size_t i) {
    return entries[i].layer_index >= m.begin && entries[i].layer_index < m.end;
  };
  auto stage_of = [&](size_t layer) {
    for (int s = 0; s < S; ++s) {
      if (layer >= c.initial[s].begin && layer < c.initial[s].end) return s;
    }
    return -1;
  };
  std::vector<std::vector<Tensor>> hist(entries.size());  // hist[entry][u]
  std::vector<Tensor> momentum, src_acc(entries.size()), tgt_acc(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    hist[i].push_back(store.param(i).clone());
    momentum.push_back(Tensor::zeros(store.param(i).shape(), DType::kF32));
  }
  ops::SgdOptions o;
  o.lr = live_stage_checks::kLr;
  o.momentum = live_stage_checks::kMomentum;
  live_stage_checks::Source source;
  Replay out;
  for (int64_t j = 0; j < c.micro_batches; ++j) {
    for (size_t i = 0; i < entries.size(); ++i) {
      int64_t v = 0;
      if (moved(i)) {
        const int64_t cut = j - S + (j < F ? m.src : m.tgt);
        v = cut < P ? std::max<int64_t>(0, cut + 1) : cut < R ? P : P + 1 + cut - R;
      } else {
        v = async_forward_version(S, stage_of(entries[i].layer_index), j);
      }
      store.param(i).copy_from(hist[i].at(static_cast<size_t>(v)));
      // The gradients: fresh for every layer but L during the pause, where they add up.
      Tensor* acc = !moved(i) || j < P || j > R ? nullptr : j < K ? &src_acc[i] : &tgt_acc[i];
      if (acc != nullptr && acc->defined()) {
        store.grad(i).copy_from(*acc);
      } else {
        store.grad(i).copy_from(Tensor::zeros(store.grad(i).shape(), DType::kF32));
      }
    }
    const MicroBatchSource::Info info = source.info(j);
    graph::ForwardOptions options;
    options.step = info.step;
    options.sample_offset = info.sample_offset;
    Tape tape;
    const TensorList x = model->forward(ctx, 0, model->size(), source.input(j), tape, options);
    ops::CrossEntropyOptions loss;
    loss.normalizer = info.loss_normalizer;
    const Tensor logits = x[0].reshape({-1, x[0].size(-1)});
    const Tensor target = source.target(j).reshape({-1});
    const double l =
        ops::cross_entropy_forward(ctx, logits, target, loss).to(DType::kF64).item<double>();
    out.losses.push_back(l);
    out.loss += l;
    const Tensor dlogits =
        ops::cross_entropy_backward(ctx, logits, target, loss, 1.0).view(x[0].shape());
    model->backward(ctx, 0, model->size(), {dlogits}, tape);
    for (size_t i = 0; i < entries.size(); ++i) {
      if (moved(i) && j >= P && j < R) {  // buffered
        (j < K ? src_acc[i] : tgt_acc[i]) = store.grad(i).clone();
        continue;
      }
      if (moved(i) && j == R && !drop_flush) ops::add_(ctx, store.grad(i), src_acc[i]);
      store.param(i).copy_from(hist[i].back());
      ops::sgd_step(ctx, store.param(i), store.grad(i), momentum[i], o, j + 1);
      hist[i].push_back(store.param(i).clone());
    }
  }
  for (size_t i = 0; i < entries.size(); ++i) store.param(i).copy_from(hist[i].back());
  live_stage_checks::add_weights(store, &out.weights);
  return out;
}

// live_stage_checks' data, each micro-batch's input `sleep_ms` late (a slower pipeline, so that
// the state can arrive while it trains; no timing is asserted).
class SlowSource final : public MicroBatchSource {
 public:
  explicit SlowSource(int sleep_ms) : sleep_ms_(sleep_ms) {}
  Info info(int64_t mb) override { return data_.info(mb); }
  TensorList input(int64_t mb) override {
    if (sleep_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    return data_.input(mb);
  }
  Tensor target(int64_t mb) override { return data_.target(mb); }

 private:
  live_stage_checks::Source data_;
  int sleep_ms_;
};

struct RankResult {
  Weights weights;  // the stage's core and the moved layers it holds at the end
  double loss = 0.0;
  LiveStageStats stats;
};

// One rank of `comm` (rank = stage) runs async-1f1b over the case's micro-batches with the
// paused migration inside; small chunks and window so that the state goes in pieces.
// `sleep_ms`: stage 0's inputs come that late (SlowSource), and the transfer thread runs at the
// normal priority.
inline RankResult run_rank(Communicator& comm, const Case& c, int sleep_ms = 0) {
  const int S = c.stages();
  const int s = comm.rank();
  auto model = live_stage_checks::make_model();
  ExecContext ctx(Device::cpu(), nullptr, 1);
  std::unique_ptr<Communicator> migrate = comm.split(0, s);
  LiveMigrationConfig live;
  live.initial = c.initial;
  live.next = c.next;
  live.first_backward = c.pause_at;
  live.paused = true;
  live.micro_batches = c.micro_batches;
  live.comm = migrate.get();
  live.transfer.chunk_bytes = 64;
  live.transfer.window_bytes = 256;
  live.transfer.low_priority = sleep_ms == 0;
  live.what = "test migration (" + c.name + ")";
  live.make_store = [&](size_t b, size_t e) {
    auto store = std::make_unique<graph::ParamStore>(*model, b, e, ctx.allocator());
    store->initialize(live_stage_checks::kSeed);
    return store;
  };
  const LayerRange core = LiveStage::core_range(live, s);
  graph::ParamStore store(*model, core.begin, core.end, ctx.allocator());
  store.initialize(live_stage_checks::kSeed);
  store.ensure_state(1);
  ExecutorConfig config;
  config.kind = ScheduleKind::kAsync1F1B;
  config.optimizer = live_stage_checks::sgd();
  config.live = &live;
  StageComms comms;
  comms.pipe = &comm;
  RankResult out;
  {
    Executor executor(ctx, *model, store, {s, S, c.initial[s].begin, c.initial[s].end}, comms,
                      config);
    const Schedule schedule = make_schedule(ScheduleKind::kAsync1F1B, S, c.micro_batches);
    SlowSource source(sleep_ms);
    out.loss = executor.run(schedule.programs[s], source).loss;
    executor.finish();
    live_stage_checks::add_weights(store, &out.weights);
    for (const graph::ParamStore* moved : executor.live()->stores()) {
      live_stage_checks::add_weights(*moved, &out.weights);
    }
    out.stats = executor.live()->stats();
  }
  return out;
}

// The points the target recorded (the source records K too, and they must agree).
inline Points points(const Case& c, const std::vector<LiveStageStats>& stats) {
  const BoundaryMove m = c.move();
  Points p;
  p.take_over = stats.at(static_cast<size_t>(m.tgt)).take_over;
  p.resume = stats.at(static_cast<size_t>(m.tgt)).resume;
  return p;
}

// The counts: every gradient of L computed once and applied once, in the right place.
inline void check_counts(const Case& c, const std::vector<LiveStageStats>& stats) {
  const BoundaryMove m = c.move();
  const int S = c.stages();
  const LiveStageStats& src = stats.at(static_cast<size_t>(m.src));
  const LiveStageStats& tgt = stats.at(static_cast<size_t>(m.tgt));
  const int64_t P = c.pause_at, K = tgt.take_over, R = tgt.resume, N = c.micro_batches;
  EXPECT_EQ(src.pause_at, P);
  EXPECT_EQ(src.take_over, K) << "the two stages disagree on the take-over";
  // K: S micro-batches after a forward at or after P, with F inside the run; R: at or after K.
  EXPECT_GE(K, P + S);
  EXPECT_LT(K + S - m.src - 1, N);
  EXPECT_GE(R, K);
  EXPECT_LT(R, N);
  EXPECT_EQ(src.moved_updates, P) << "the source's updates before the pause";
  EXPECT_EQ(src.buffered_grads, K - P) << "the source's buffered gradients [P, K)";
  EXPECT_EQ(tgt.flushed_grads, K - P) << "the flush's count";
  EXPECT_EQ(tgt.buffered_grads, R - K + 1) << "the target's buffered gradients [K, R]";
  EXPECT_EQ(tgt.moved_updates, 1 + (N - 1 - R)) << "the target's updates: R's, then one each";
  EXPECT_EQ(src.moved_updates + src.buffered_grads + tgt.buffered_grads + tgt.moved_updates - 1, N)
      << "every micro-batch's gradient of the moved layers once";
  EXPECT_EQ(src.inputs_sent, S - m.src - 1);
  EXPECT_EQ(tgt.replayed_backwards, S - m.src - 1);
  EXPECT_EQ(src.handoffs_sent, 1);
  EXPECT_EQ(tgt.handoffs_received, 1);
}

// Stage s's weights (those of its final layers) and the last stage's loss against the replay.
inline void check_rank(const Case& c, int s, const RankResult& r, const Replay& expected) {
  auto model = live_stage_checks::make_model();
  Weights want;
  for (const auto& [name, v] : expected.weights) {
    const std::optional<size_t> layer = model->find_param_layer(name);
    ASSERT_TRUE(layer.has_value()) << name;
    if (*layer >= c.next[s].begin && *layer < c.next[s].end) want[name] = v;
  }
  EXPECT_EQ(r.weights.size(), want.size()) << c.name << ", stage " << s;
  for (const auto& [name, v] : want) {
    const auto it = r.weights.find(name);
    ASSERT_NE(it, r.weights.end()) << c.name << ", stage " << s << " lacks " << name;
    EXPECT_EQ(it->second, v) << c.name << ", stage " << s << ": " << name
                             << " differs from the replay";
  }
  if (s == c.stages() - 1) {
    EXPECT_EQ(r.loss, expected.loss) << c.name << ": the losses";
  }
}

// Both directions, from every kind of stage: S = 2 (a move up from the last stage: F = K) and 4.
inline std::vector<Case> cases(int S) {
  if (S == 2) {
    return {
        {"S=2 down: relu1 fc2 0->1", {{0, 5}, {5, 9}}, {{0, 3}, {3, 9}}, 4, 28},
        {"S=2 up: relu2 fc3 1->0", {{0, 5}, {5, 9}}, {{0, 7}, {7, 9}}, 4, 28},
    };
  }
  return {
      {"S=4 down: fc2 1->2",
       {{0, 2}, {2, 5}, {5, 7}, {7, 9}},
       {{0, 2}, {2, 4}, {4, 7}, {7, 9}},
       6,
       36},
      {"S=4 up: fc2 2->1",
       {{0, 2}, {2, 4}, {4, 6}, {6, 9}},
       {{0, 2}, {2, 5}, {5, 6}, {6, 9}},
       6,
       36},
  };
}

}  // namespace strata::parallel::live_pause_checks
