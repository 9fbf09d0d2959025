// A live migration inside async-1f1b's executor (parallel/runtime/live_stage.h) against an
// independent one-process oracle of the weight versions vPIPE's Eq. 4 prescribes; shared by the
// local-thread test (test_live_stage.cpp) and the MPI one (test_live_stage_mpi.cpp), with one or
// several data-parallel groups.
//
// The oracle knows nothing of the executor, the stores or the protocol: one store of the whole
// model and every version of it (W[u]: after u updates). Micro-batch j runs forward with each
// layer l on W[v(l, j)][l], v(l, j) = Eq. 4 for the stage that runs l's forward of j (from
// StageLayout), takes its loss, runs backward on the same weights, and W[j + 1] = SGD with
// momentum (W[j], its gradient). The pipeline runs the same ops on the same operands in the same
// order, so losses and weights must agree bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/layers.h"
#include "graph/model.h"
#include "graph/optimizer.h"
#include "graph/param_store.h"
#include "ops/cross_entropy.h"
#include "ops/optimizer.h"
#include "parallel/runtime/executor.h"
#include "parallel/runtime/live_protocol.h"
#include "parallel/runtime/live_stage.h"
#include "parallel/runtime/stage_layout.h"
#include "parallel/schedule/schedule.h"
#include "testing/testing.h"

namespace strata::parallel::live_stage_checks {

constexpr uint64_t kSeed = 5;
constexpr double kLr = 0.05;
constexpr double kMomentum = 0.9;
constexpr int kTimeoutSeconds = 10;

// fc0 relu0 fc1 relu1 fc2 relu2 fc3 relu3 fc4: nine layers.
inline std::unique_ptr<graph::Model> make_model() {
  auto model = std::make_unique<graph::Model>("live", Shape{6});
  for (int i = 0; i < 4; ++i) {
    const std::string n = std::to_string(i);
    model->add(std::make_unique<graph::LinearLayer>("fc" + n, i == 0 ? 6 : 8, 8, true));
    model->add(std::make_unique<graph::ReluLayer>("relu" + n));
  }
  model->add(std::make_unique<graph::LinearLayer>("fc4", 8, 3, true));
  return model;
}

// Group `group` of `groups`: its own rows of every micro-batch; the loss of each micro-batch is
// normalized by the rows of all groups (the sum of the groups' gradients is their mean).
class Source final : public MicroBatchSource {
 public:
  explicit Source(int group = 0, int groups = 1) : group_(group), groups_(groups) {}
  Info info(int64_t mb) override { return {mb, 0, 4, 4.0 * groups_}; }
  TensorList input(int64_t mb) override {
    return {strata::testing::random_tensor({4, 6}, seed(300, mb), -1, 1, DType::kF32)};
  }
  Tensor target(int64_t mb) override { return strata::testing::random_ids({4}, 3, seed(400, mb)); }

 private:
  uint64_t seed(uint64_t base, int64_t mb) const {
    return base + static_cast<uint64_t>(mb) + 1000 * static_cast<uint64_t>(group_);
  }
  int group_, groups_;
};

// The model and data of a case (default: the nine layers above on Source's rows).
struct Fixture {
  std::function<std::unique_ptr<graph::Model>()> model = make_model;
  std::function<std::unique_ptr<MicroBatchSource>(int group, int groups)> source =
      [](int group, int groups) { return std::make_unique<Source>(group, groups); };
  uint64_t forward_seed = 0;  // ForwardOptions::seed (dropout)
};

struct Case {
  std::string name;
  Partition initial, next;
  int64_t first_backward = 0;                // K
  int64_t micro_batches = 0;                 // N
  std::vector<LiveMigrationStep> then = {};  // later migrations
  Fixture fixture = {};
  int stages() const { return static_cast<int>(initial.size()); }
  StageLayout layout() const {
    StageLayout l(initial);
    l.add_live_migration(next, first_backward);
    for (const LiveMigrationStep& m : then) l.add_live_migration(m.next, m.first_backward);
    return l;
  }
  const Partition& last() const { return then.empty() ? next : then.back().next; }
};

// One move of a piece of layers (a maximal run of layers that have the same stage in every
// partition) between two stages: what the stages' blocks hand over.
struct PieceMove {
  size_t begin = 0, end = 0;
  int src = 0, tgt = 0;
};

// `per_layer`: every layer a piece (an open run's blocks: LiveStage::add_migration).
inline std::vector<PieceMove> piece_moves(const Case& c, size_t layers, bool per_layer = false) {
  std::vector<Partition> parts{c.initial, c.next};
  for (const LiveMigrationStep& m : c.then) parts.push_back(m.next);
  auto owners = [&](size_t layer) {
    std::vector<int> o;
    for (const Partition& p : parts) {
      for (size_t s = 0; s < p.size(); ++s) {
        if (layer >= p[s].begin && layer < p[s].end) o.push_back(static_cast<int>(s));
      }
    }
    return o;
  };
  std::vector<PieceMove> out;
  for (size_t begin = 0; begin < layers;) {
    const std::vector<int> o = owners(begin);
    size_t end = begin + 1;
    while (!per_layer && end < layers && owners(end) == o) ++end;
    for (size_t i = 0; i + 1 < o.size(); ++i) {
      if (o[i] != o[i + 1]) out.push_back({begin, end, o[i], o[i + 1]});
    }
    begin = end;
  }
  return out;
}

// The pieces that ever change stage.
inline int64_t moving_pieces(const Case& c, size_t layers, bool per_layer = false) {
  std::vector<std::pair<size_t, size_t>> seen;
  for (const PieceMove& m : piece_moves(c, layers, per_layer)) {
    if (seen.empty() || seen.back() != std::make_pair(m.begin, m.end))
      seen.push_back({m.begin, m.end});
  }
  return static_cast<int64_t>(seen.size());
}

inline graph::OptimizerConfig sgd() {
  graph::OptimizerConfig c;
  c.kind = graph::OptimizerKind::kSgd;
  c.momentum = kMomentum;
  c.schedule.base_lr = kLr;
  return c;
}

using Weights = std::map<std::string, std::vector<float>>;

inline void add_weights(const graph::ParamStore& store, Weights* out) {
  const auto& entries = store.param_entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    (*out)[entries[i].full_name()] = store.param(i).to_vector<float>();
  }
}

// Eq. 4 per layer and micro-batch: the version of the stage that runs the forward (`migrate`:
// with the case's migration; otherwise the initial partition throughout).
inline int64_t version_of(const StageLayout& layout, size_t layer, int64_t j) {
  for (int s = 0; s < layout.stages(); ++s) {
    const LayerRange r = layout.forward_range(s, j);
    if (layer >= r.begin && layer < r.end) return async_forward_version(layout.stages(), s, j);
  }
  ADD_FAILURE() << "layer " << layer << " is on no stage for micro-batch " << j;
  return 0;
}

// The stage that runs layer `layer`'s backward of micro-batch j under `layout`.
inline int backward_stage(const StageLayout& layout, size_t layer, int64_t j) {
  for (int s = 0; s < layout.stages(); ++s) {
    const LayerRange r = layout.backward_range(s, j);
    if (layer >= r.begin && layer < r.end) return s;
  }
  ADD_FAILURE() << "layer " << layer << " is on no stage for backward " << j;
  return 0;
}

struct OracleResult {
  Weights weights;
  Weights buffers;             // running statistics, by "layer.buffer" (group 0's replica)
  std::vector<double> losses;  // per micro-batch (group 0)
  double loss = 0.0;           // their sum, in order
  std::vector<std::vector<double>> group_losses;  // [group][micro-batch]
};

// The oracle over `model` (its store initialized with `seed`), micro-batches [0, n) of the
// groups' `sources` (one per data-parallel group) under `layout`'s stages; forwards with
// ForwardOptions::seed = `forward_seed`. Several groups: the update of micro-batch j applies the
// sum of the groups' gradients of j (each group's loss normalized by all groups' rows: their
// mean), added in group order; each group's forwards update its own replica of the running
// statistics, and the update of j averages them (sum in group order, then x 1/G) on the stage
// that runs the layer's backward of j, which under async-1f1b comes before that stage's forward
// of micro-batch j + S - s and after its forward of j + S - s - 1.
//
// A tied parameter (GPT-2's head weight is its token embedding) whose user layer is on another
// stage than its owner: the oracle holds two stores cut at the user, so the user has a copy of
// its own with its own versions (Eq. 4 of the user's stage) and its own gradient. The update of
// micro-batch j gives the owner and the copy the same gradient: the owner's plus the copy's (each
// first summed over the groups), as the pipeline's tied all-reduce does after the groups' one;
// `tied_sum` false leaves each its own gradient (the check that the sum matters).
inline OracleResult replay(graph::Model& model, uint64_t seed, const StageLayout& layout,
                           const std::vector<MicroBatchSource*>& sources, int64_t n,
                           uint64_t forward_seed = 0, double lr = kLr,
                           double momentum_factor = kMomentum, bool tied_sum = true) {
  ExecContext ctx(Device::cpu(), nullptr, 1);
  // The first layer that uses a tied parameter of an earlier layer: the second store's first.
  size_t cut = model.size();
  for (size_t l = 0; l < model.size() && cut == model.size(); ++l) {
    for (const graph::ParamSpec& spec : model.layer(l).param_specs()) {
      const std::optional<size_t> owner =
          spec.tied_to.empty() ? std::nullopt : model.find_param_layer(spec.tied_to);
      if (owner.has_value() && *owner < l) cut = l;
    }
  }
  std::vector<std::unique_ptr<graph::ParamStore>> stores;
  for (const auto& [b, e] : {std::make_pair<size_t, size_t>(0, size_t{cut}),
                             std::make_pair<size_t, size_t>(size_t{cut}, model.size())}) {
    if (b == e) continue;
    stores.push_back(std::make_unique<graph::ParamStore>(model, b, e, ctx.allocator()));
    stores.back()->initialize(seed);
  }
  // Every store's entries (the parameters of the model, a tied copy among them), in order.
  std::vector<graph::ParamStore::Entry> entries, buffer_entries;
  std::vector<Tensor> params, grads, bufs;
  for (const auto& store : stores) {
    for (size_t i = 0; i < store->param_entries().size(); ++i) {
      entries.push_back(store->param_entries()[i]);
      params.push_back(store->param(i));
      grads.push_back(store->grad(i));
    }
    for (size_t i = 0; i < store->buffer_entries().size(); ++i) {
      buffer_entries.push_back(store->buffer_entries()[i]);
      bufs.push_back(store->buffer(i));
    }
  }
  std::vector<std::pair<size_t, size_t>> tied;  // (owner entry, copy entry)
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].tied_to.empty() || entries[i].alias) continue;
    for (size_t k = 0; k < entries.size(); ++k) {
      if (entries[k].full_name() == entries[i].tied_to) tied.push_back({k, i});
    }
  }
  const size_t G = sources.size();
  const int S = layout.stages();
  std::vector<std::vector<Tensor>> w(1);  // w[u][entry]
  std::vector<Tensor> momentum;
  for (size_t i = 0; i < entries.size(); ++i) {
    w[0].push_back(params[i].clone());
    momentum.push_back(Tensor::zeros(params[i].shape(), DType::kF32));
  }
  std::vector<std::vector<Tensor>> stats(G);  // stats[g][buffer entry]: group g's replica
  for (size_t g = 0; g < G; ++g) {
    for (size_t i = 0; i < buffer_entries.size(); ++i) stats[g].push_back(bufs[i].clone());
  }
  std::vector<int64_t> averaged(buffer_entries.size(), 0);  // per buffer entry: updates averaged
  // The averages of the updates done (`updates`) that come before a forward of micro-batch
  // `before` (all of them: -1).
  auto average = [&](int64_t updates, int64_t before) {
    if (G == 1) return;
    for (size_t i = 0; i < buffer_entries.size(); ++i) {
      const size_t layer = buffer_entries[i].layer_index;
      while (
          averaged[i] < updates &&
          (before < 0 || averaged[i] + S - backward_stage(layout, layer, averaged[i]) <= before)) {
        std::vector<float> sum = stats[0][i].to_vector<float>();
        for (size_t g = 1; g < G; ++g) {
          const std::vector<float> other = stats[g][i].to_vector<float>();
          for (size_t e = 0; e < sum.size(); ++e) sum[e] += other[e];
        }
        for (float& v : sum) v = static_cast<float>(v * (1.0 / static_cast<double>(G)));
        for (size_t g = 0; g < G; ++g) {
          stats[g][i].copy_from(Tensor::from_vector(sum, stats[g][i].shape()));
        }
        ++averaged[i];
      }
    }
  };
  auto zero_grads = [&] {
    for (const auto& store : stores) store->zero_grads();
  };
  ops::SgdOptions o;
  o.lr = lr;
  o.momentum = momentum_factor;
  OracleResult out;
  out.group_losses.assign(G, {});
  for (int64_t j = 0; j < n; ++j) {
    for (size_t i = 0; i < entries.size(); ++i) {
      const int64_t v = version_of(layout, entries[i].layer_index, j);
      params[i].copy_from(w[static_cast<size_t>(v)][i]);
    }
    average(j, j);
    std::vector<std::vector<Tensor>> group_grads(G);  // group_grads[g][entry]
    for (size_t g = 0; g < G; ++g) {
      MicroBatchSource& source = *sources[g];
      for (size_t i = 0; i < buffer_entries.size(); ++i) bufs[i].copy_from(stats[g][i]);
      const MicroBatchSource::Info info = source.info(j);
      graph::ForwardOptions options;
      options.seed = forward_seed;
      options.step = info.step;
      options.sample_offset = info.sample_offset;
      Tape tape;
      const TensorList x = model.forward(ctx, 0, model.size(), source.input(j), tape, options);
      for (size_t i = 0; i < buffer_entries.size(); ++i) stats[g][i].copy_from(bufs[i]);
      ops::CrossEntropyOptions loss;
      loss.normalizer = info.loss_normalizer;
      loss.num_classes = model.loss_classes();  // a padded vocabulary's padding is no class
      const Tensor target = source.target(j);
      const Tensor logits = x[0].reshape({-1, x[0].size(-1)});
      const Tensor flat_target = target.reshape({-1});
      const double l =
          ops::cross_entropy_forward(ctx, logits, flat_target, loss).to(DType::kF64).item<double>();
      out.group_losses[g].push_back(l);
      if (g == 0) {
        out.losses.push_back(l);
        out.loss += l;
      }
      zero_grads();
      const Tensor dlogits =
          ops::cross_entropy_backward(ctx, logits, flat_target, loss, 1.0).view(x[0].shape());
      model.backward(ctx, 0, model.size(), {dlogits}, tape);
      if (G == 1) break;
      for (size_t i = 0; i < entries.size(); ++i) group_grads[g].push_back(grads[i].clone());
    }
    if (G > 1) {  // the sum over the groups, in group order
      for (size_t i = 0; i < entries.size(); ++i) {
        std::vector<float> sum = group_grads[0][i].to_vector<float>();
        for (size_t g = 1; g < G; ++g) {
          const std::vector<float> other = group_grads[g][i].to_vector<float>();
          for (size_t e = 0; e < sum.size(); ++e) sum[e] += other[e];
        }
        grads[i].copy_from(Tensor::from_vector(sum, grads[i].shape()));
      }
    }
    for (const auto& [owner, copy] : tied) {  // the tied sum: both sides apply it
      if (!tied_sum) break;
      std::vector<float> sum = grads[owner].to_vector<float>();
      const std::vector<float> other = grads[copy].to_vector<float>();
      for (size_t e = 0; e < sum.size(); ++e) sum[e] += other[e];
      grads[owner].copy_from(Tensor::from_vector(sum, grads[owner].shape()));
      grads[copy].copy_from(Tensor::from_vector(sum, grads[copy].shape()));
    }
    std::vector<Tensor> next;
    for (size_t i = 0; i < entries.size(); ++i) {
      params[i].copy_from(w[static_cast<size_t>(j)][i]);
      ops::sgd_step(ctx, params[i], grads[i], momentum[i], o, j + 1);
      next.push_back(params[i].clone());
    }
    w.push_back(std::move(next));
    // Eq. 4's oldest version from here on is j + 1 - S: the ones before it go.
    if (j + 1 - S > 0) w[static_cast<size_t>(j - S)].clear();
  }
  average(n, -1);
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i].alias) out.weights[entries[i].full_name()] = params[i].to_vector<float>();
  }
  for (size_t i = 0; i < buffer_entries.size(); ++i) {
    out.buffers[buffer_entries[i].full_name()] = (G > 1 ? stats[0][i] : bufs[i]).to_vector<float>();
  }
  return out;
}

inline OracleResult replay(graph::Model& model, uint64_t seed, const StageLayout& layout,
                           MicroBatchSource& source, int64_t n, uint64_t forward_seed = 0,
                           double lr = kLr, double momentum_factor = kMomentum) {
  return replay(model, seed, layout, std::vector<MicroBatchSource*>{&source}, n, forward_seed, lr,
                momentum_factor);
}

// `tied_sum`: see replay.
inline OracleResult oracle(const Case& c, bool migrate, int groups = 1, bool tied_sum = true) {
  auto model = c.fixture.model();
  const StageLayout layout = migrate ? c.layout() : StageLayout(c.initial);
  std::vector<std::unique_ptr<MicroBatchSource>> owned;
  std::vector<MicroBatchSource*> sources;
  for (int g = 0; g < groups; ++g) {
    owned.push_back(c.fixture.source(g, groups));
    sources.push_back(owned.back().get());
  }
  return replay(*model, kSeed, layout, sources, c.micro_batches, c.fixture.forward_seed, kLr,
                kMomentum, tied_sum);
}

// The (owner, user) stages of `initial` holding the two sides of a tied parameter split between
// stages, if any (as the trainer's split_tied_stages finds them).
inline std::optional<std::pair<int, int>> tied_stages(const graph::Model& model,
                                                      const Partition& initial) {
  auto stage_of = [&](size_t layer) {
    for (size_t s = 0; s < initial.size(); ++s) {
      if (layer >= initial[s].begin && layer < initial[s].end) return static_cast<int>(s);
    }
    return -1;
  };
  for (size_t l = 0; l < model.size(); ++l) {
    for (const graph::ParamSpec& spec : model.layer(l).param_specs()) {
      if (spec.tied_to.empty()) continue;
      const int owner = stage_of(*model.find_param_layer(spec.tied_to));
      if (owner != stage_of(l)) return std::make_pair(owner, stage_of(l));
    }
  }
  return std::nullopt;
}

struct RankResult {
  Weights weights;  // the stage's core and the moved layers it holds at the end
  double loss = 0.0;
  LiveStageStats stats;
  // An open run: the forwards of each piece of the program (its loss is the pieces' sums, summed).
  std::vector<int64_t> loss_pieces;
};

// An open run (LiveMigrationConfig::open): the updates of stage 0's program after which each
// migration of `c` is added, the latest at which no stage has run a forward of its K or later.
inline std::vector<int64_t> open_cuts(const Case& c) {
  const int S = c.stages();
  const Schedule schedule = make_schedule(ScheduleKind::kAsync1F1B, S, c.micro_batches);
  std::vector<int64_t> ks{c.first_backward};
  for (const LiveMigrationStep& m : c.then) ks.push_back(m.first_backward);
  std::vector<int64_t> cuts;
  for (int64_t k : ks) {
    int64_t cut = c.micro_batches;
    for (const Program& program : schedule.programs) {
      int64_t updates = 0;
      for (const Instruction& in : program) {
        if (in.op == OpCode::kForward && in.micro_batch >= k) break;
        if (in.op == OpCode::kOptimizerStep) ++updates;
      }
      cut = std::min(cut, updates);
    }
    cuts.push_back(cuts.empty() ? cut : std::max(cut, cuts.back()));
  }
  return cuts;
}

// One rank of `comm` runs async-1f1b over the case's micro-batches with the live migration
// inside; small chunks and window so that the transfer cuts and paces the items. `groups` > 1:
// rank = group * S + stage, each group a pipeline of its own, the groups' gradients all-reduced
// (GroPipe); every group moves the same layers at the same micro-batch. `open`: the migrations are
// added while the program runs, each at its cut of open_cuts (the program run in pieces).
inline RankResult run_rank(Communicator& comm, const Case& c, int groups = 1, bool open = false) {
  const int S = c.stages();
  const int s = comm.rank() % S, group = comm.rank() / S;
  comm.set_timeout(std::chrono::seconds(kTimeoutSeconds));  // a hang fails in seconds
  auto model = c.fixture.model();
  ExecContext ctx(Device::cpu(), nullptr, 1);
  std::unique_ptr<Communicator> pipe_split, dp;
  if (groups > 1) {
    pipe_split = comm.split(group, s);
    dp = comm.split(s, group);
  }
  Communicator& pipe = groups > 1 ? *pipe_split : comm;
  std::unique_ptr<Communicator> migrate = pipe.split(0, s);
  // A tied parameter split between stages: its two stages sum their copies' gradients.
  const std::optional<std::pair<int, int>> tied_pair = tied_stages(*model, c.initial);
  const bool tied_here = tied_pair && (s == tied_pair->first || s == tied_pair->second);
  std::unique_ptr<Communicator> tied =
      tied_pair ? pipe.split(tied_here ? 0 : -1, tied_pair && s == tied_pair->first ? 0 : 1)
                : nullptr;
  LiveMigrationConfig live;
  live.initial = c.initial;
  live.next = c.next;
  live.first_backward = c.first_backward;
  live.then = c.then;
  live.comm = migrate.get();
  live.transfer.chunk_bytes = 64;
  live.transfer.window_bytes = 256;
  live.what = "test migration (" + c.name + ")";
  live.open = open;
  live.make_store = [&](size_t b, size_t e) {
    auto store = std::make_unique<graph::ParamStore>(*model, b, e, ctx.allocator());
    store->initialize(kSeed);
    return store;
  };
  const LayerRange core = LiveStage::core_range(live, s);
  graph::ParamStore store(*model, core.begin, core.end, ctx.allocator());
  store.initialize(kSeed);
  store.ensure_state(1);
  ExecutorConfig config;
  config.kind = ScheduleKind::kAsync1F1B;
  config.optimizer = sgd();
  config.live = &live;
  config.seed = c.fixture.forward_seed;
  config.loss.num_classes = model->loss_classes();
  StageComms comms;
  comms.pipe = &pipe;
  comms.dp = dp.get();
  comms.tied = tied.get();
  RankResult out;
  {
    Executor executor(ctx, *model, store, {s, S, c.initial[s].begin, c.initial[s].end}, comms,
                      config);
    const Schedule schedule = make_schedule(ScheduleKind::kAsync1F1B, S, c.micro_batches);
    const std::unique_ptr<MicroBatchSource> source = c.fixture.source(group, groups);
    if (!open) {
      out.loss = executor.run(schedule.programs[s], *source).loss;
    } else {
      // The program in pieces, cut after the updates of open_cuts; between them the migrations.
      std::vector<LiveMigrationStep> moves{{c.next, c.first_backward, live.what}};
      moves.insert(moves.end(), c.then.begin(), c.then.end());
      const std::vector<int64_t> cuts = open_cuts(c);
      Program piece;
      int64_t updates = 0, forwards = 0;
      auto run_piece = [&] {
        out.loss += executor.run(piece, *source).loss;
        out.loss_pieces.push_back(forwards);
        piece.clear();
        forwards = 0;
      };
      size_t next = 0;
      auto add_due = [&] {
        while (next < moves.size() && cuts[next] == updates) {
          executor.live()->add_migration(moves[next].next, moves[next].first_backward,
                                         moves[next].what);
          ++next;
        }
      };
      add_due();
      for (const Instruction& in : schedule.programs[s]) {
        piece.push_back(in);
        if (in.op == OpCode::kForward) ++forwards;
        if (in.op != OpCode::kOptimizerStep) continue;
        ++updates;
        if (next < moves.size() && cuts[next] == updates) {
          run_piece();
          add_due();
        }
      }
      if (!piece.empty()) run_piece();
      EXPECT_EQ(next, moves.size()) << c.name << ": migrations never added";
    }
    executor.finish();
    EXPECT_EQ(executor.optimizer_steps(), c.micro_batches) << c.name << ", stage " << s;
    add_weights(store, &out.weights);
    for (const graph::ParamStore* moved : executor.live()->stores()) {
      add_weights(*moved, &out.weights);
    }
    out.stats = executor.live()->stats();
  }
  return out;
}

// Checks one rank's result against the oracle: its weights (bit for bit), the last stage's loss,
// and what moved to and from it.
// `group`: the rank's data-parallel group (its loss is that group's).
inline void check_rank(const Case& c, int s, const RankResult& r, const OracleResult& expected,
                       int group = 0, bool open = false) {
  const int S = c.stages();
  // The stage ends with the layers of the new partition, each bit for bit the oracle's.
  std::vector<std::string> names;
  Weights want;
  auto model = c.fixture.model();
  for (const auto& [name, v] : expected.weights) {
    const std::optional<size_t> layer = model->find_param_layer(name);
    ASSERT_TRUE(layer.has_value()) << name;
    if (*layer >= c.last()[s].begin && *layer < c.last()[s].end) want[name] = v;
  }
  EXPECT_EQ(r.weights.size(), want.size()) << c.name << ", stage " << s;
  for (const auto& [name, v] : want) {
    const auto it = r.weights.find(name);
    ASSERT_NE(it, r.weights.end()) << c.name << ", stage " << s << " lacks " << name;
    EXPECT_EQ(it->second, v) << c.name << ", stage " << s << ": " << name
                             << " differs from the oracle";
  }
  if (s == S - 1) {
    // The group's losses summed in order, as its last stage sums them (in an open run, per piece
    // of the program, then the pieces' sums).
    const std::vector<double>& losses = expected.group_losses.at(static_cast<size_t>(group));
    double loss = 0.0;
    if (open) {
      size_t j = 0;
      for (int64_t n : r.loss_pieces) {
        double piece = 0.0;
        for (int64_t i = 0; i < n; ++i) piece += losses.at(j++);
        loss += piece;
      }
      EXPECT_EQ(j, losses.size()) << c.name << ": the pieces' forwards";
    } else {
      for (double l : losses) loss += l;
    }
    EXPECT_EQ(r.loss, loss) << c.name << ": the losses of group " << group;
  }
  // Exactly S - src - 1 micro-batches' inputs move per moved piece of layers and migration; each
  // replayed backward once.
  int64_t sent = 0, received = 0, handoffs_out = 0, handoffs_in = 0;
  size_t moved_params = 0;  // the parameters this stage handed off, summed over its hand-offs
  for (const PieceMove& m : piece_moves(c, model->size(), open)) {
    if (m.src == s) sent += S - m.src - 1, ++handoffs_out;
    if (m.tgt == s) received += S - m.src - 1, ++handoffs_in;
    if (m.src != s) continue;
    for (size_t l = m.begin; l < m.end; ++l) {
      for (const graph::ParamSpec& spec : model->layer(l).param_specs()) {
        moved_params += static_cast<size_t>(shape_numel(spec.shape));
      }
    }
  }
  EXPECT_EQ(r.stats.inputs_sent, sent) << c.name << ", stage " << s;
  EXPECT_EQ(r.stats.inputs_received, received) << c.name << ", stage " << s;
  EXPECT_EQ(r.stats.replayed_backwards, received) << c.name << ", stage " << s;
  EXPECT_EQ(r.stats.handoffs_sent, handoffs_out) << c.name << ", stage " << s;
  EXPECT_EQ(r.stats.handoffs_received, handoffs_in) << c.name << ", stage " << s;
  // The source gives back its stores of the moved layers at each hand-off: at least parameters,
  // gradients and momentum of each.
  EXPECT_GE(r.stats.freed_bytes, 3 * moved_params * sizeof(float))
      << c.name << ", stage " << s << " did not free its moved layers";
}

// Both directions, S = 2 and 4 (moves from every kind of stage, and two boundaries at once).
inline std::vector<Case> cases(int S) {
  if (S == 2) {
    return {
        {"S=2 down: relu1 fc2 0->1", {{0, 5}, {5, 9}}, {{0, 3}, {3, 9}}, 3, 10},
        {"S=2 up: relu2 fc3 1->0", {{0, 5}, {5, 9}}, {{0, 7}, {7, 9}}, 4, 10},
    };
  }
  return {
      {"S=4 down: fc2 1->2",
       {{0, 2}, {2, 5}, {5, 7}, {7, 9}},
       {{0, 2}, {2, 4}, {4, 7}, {7, 9}},
       3,
       14},
      {"S=4 up: fc2 2->1",
       {{0, 2}, {2, 4}, {4, 6}, {6, 9}},
       {{0, 2}, {2, 5}, {5, 6}, {6, 9}},
       4,
       14},
      {"S=4 both: fc1 1->0 and relu2 2->3",
       {{0, 2}, {2, 4}, {4, 6}, {6, 9}},
       {{0, 3}, {3, 4}, {4, 5}, {5, 9}},
       5,
       16},
  };
}

// Two migrations per run, the second after the first has switched every boundary.
inline std::vector<Case> two_move_cases(int S) {
  if (S == 2) {
    return {
        // relu1 fc2 go down and come back.
        {"S=2 down then up: relu1 fc2 0->1, then 1->0",
         {{0, 5}, {5, 9}},
         {{0, 3}, {3, 9}},
         3,
         12,
         {{{{0, 5}, {5, 9}}, 6, "test migration 2"}}},
        // The way back takes relu2 along: two pieces of one boundary move, one of them moving
        // for the first time.
        {"S=2 down then up: relu1 fc2 0->1, then relu1-relu2 1->0",
         {{0, 5}, {5, 9}},
         {{0, 3}, {3, 9}},
         3,
         12,
         {{{{0, 6}, {6, 9}}, 6, "test migration 2"}}},
    };
  }
  // fc2 goes up, then back down while fc3 comes up from stage 3.
  return {
      {"S=4 up then down: fc2 2->1, then fc2 1->2 and fc3 3->2",
       {{0, 2}, {2, 4}, {4, 6}, {6, 9}},
       {{0, 2}, {2, 5}, {5, 6}, {6, 9}},
       4,
       16,
       {{{{0, 2}, {2, 4}, {4, 7}, {7, 9}}, 8, "test migration 2"}}},
  };
}

}  // namespace strata::parallel::live_stage_checks
