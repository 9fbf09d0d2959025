// The Trainer's --migrate-at: the partitions checked before training, and a live migration
// inside an async-1f1b run (parallel/runtime/live_stage.h): the stores it starts with, its
// configuration, and the store of the final layout once the run has drained.
#include <algorithm>
#include <map>

#include "engine/check.h"
#include "engine/log.h"
#include "models/weight_files.h"
#include "parallel/runtime/live_tied.h"
#include "parallel/runtime/relayout.h"
#include "parallel/trainer.h"

namespace strata::parallel {
namespace {

Partition partition_of(const std::vector<std::pair<size_t, size_t>>& ranges) {
  Partition p;
  for (const auto& [b, e] : ranges) p.push_back({b, e});
  return p;
}

// The run's live migrations (--migrate-at under async-1f1b): the partitions, each one's first
// backward on the new stages (the first micro-batch of its step) and its name; no channel yet.
LiveMigrationConfig live_plan(const PipelineConfig& pipeline) {
  LiveMigrationConfig live;
  live.initial = partition_of(pipeline.partition);
  const auto& moves = pipeline.migrations;
  for (size_t i = 0; i < moves.size(); ++i) {
    const int64_t k = moves[i].step * pipeline.micro_batches;
    const std::string what = "migration at step " + std::to_string(moves[i].step);
    if (i == 0) {
      live.next = partition_of(moves[i].partition);
      live.first_backward = k;
      live.what = what;
    } else {
      live.then.push_back({partition_of(moves[i].partition), k, what});
    }
  }
  return live;
}

// --repartition's live moves: an open migration from the run's partition.
LiveMigrationConfig open_plan(const PipelineConfig& pipeline) {
  LiveMigrationConfig live;
  live.initial = partition_of(pipeline.partition);
  live.open = true;
  live.what = "--repartition's live moves";
  return live;
}

}  // namespace

void Trainer::check_migrations(const PipelineConfig& pipeline) {
  const int S = pipeline.stages;
  // Each partition covers the layers in order, one range per stage; by step.
  std::sort(pipeline_.migrations.begin(), pipeline_.migrations.end(),
            [](const Migration& a, const Migration& b) { return a.step < b.step; });
  for (const Migration& m : pipeline_.migrations) {
    STRATA_CHECK(m.step >= 1) << "--migrate-at " << m.step << ": the step must be at least 1";
    STRATA_CHECK_EQ(static_cast<int>(m.partition.size()), S)
        << "--migrate-at " << m.step << ": the partition has " << m.partition.size()
        << " stages, --stages is " << S;
    size_t next = 0;
    for (const auto& [b, e] : m.partition) {
      STRATA_CHECK(b == next && e > b && e <= model_->size())
          << "--migrate-at " << m.step << ": stages must cover the " << model_->size()
          << " layers in order, each at least one layer";
      next = e;
    }
    STRATA_CHECK_EQ(next, model_->size())
        << "--migrate-at " << m.step << ": the partition leaves layers after " << next;
  }
  STRATA_CHECK(pipeline_.migrations.empty() || pipeline.grad_sync.delay == 0)
      << "--migrate-at with --dp-delay " << pipeline.grad_sync.delay
      << ": the delayed gradients are laid out by the stage's layers; migrate without delay";
  STRATA_CHECK(pipeline.migration != MigrationMode::kDynpipe ||
               pipeline.schedule == ScheduleKind::kAsync1F1B)
      << "--migration dynpipe needs --schedule async-1f1b (it pauses the moved layers' updates "
      << "inside an asynchronous run), not " << schedule_name(pipeline.schedule);
  if (pipeline_.migrations.empty() || is_synchronous(pipeline.schedule) ||
      pipeline.migration == MigrationMode::kRestart) {
    return;
  }
  // --migration live inside an asynchronous run (parallel/runtime/live_stage.h).
  const std::string what = "--migrate-at with " + std::string(schedule_name(pipeline.schedule)) +
                           " and --migration " + migration_mode_name(pipeline.migration);
  STRATA_CHECK(pipeline.schedule == ScheduleKind::kAsync1F1B)
      << what << " is not available (only async-1f1b migrates live); use --migration restart "
      << "(drain, move, start again)";
  // Several moves: each after the previous one has completed (every boundary it moves switched:
  // its micro-batches [K, F) replayed on the target, the hand-off done), F = K + S - src - 1.
  const int64_t M = pipeline.micro_batches;
  for (size_t i = 1; i < pipeline_.migrations.size(); ++i) {
    const Migration& before = pipeline_.migrations[i - 1];
    const std::vector<std::pair<size_t, size_t>>& from =
        i >= 2 ? pipeline_.migrations[i - 2].partition : pipeline_.partition;
    int64_t last = 0;  // the previous move's last forward switch
    for (int b = 0; b + 1 < S; ++b) {
      const size_t was = from[b].second, now = before.partition[b].second;
      if (was == now) continue;
      const int src = now < was ? b : b + 1;  // down: b gives; up: b + 1 gives
      last = std::max(last, before.step * M + S - src - 1);
    }
    STRATA_CHECK(pipeline_.migrations[i].step * M > last)
        << "--migrate-at " << pipeline_.migrations[i].step << " with async-1f1b and --migration "
        << "live starts before the move at step " << before.step << " has completed (its layers "
        << "switch stages up to micro-batch " << last << "); migrate at step " << last / M + 1
        << " or later, or use --migration restart";
  }
  check_live_tied(*model_, live_plan(pipeline_));  // the layers of a tied parameter stay put
  check_live_limits(pipeline, what);
}

void Trainer::check_live_limits(const PipelineConfig& pipeline, const std::string& what) const {
  STRATA_CHECK(config_.compute_dtype == DType::kF32) << what << " needs --precision fp32";
  STRATA_CHECK(config_.optimizer.clip_grad_norm == 0 && config_.nan_policy != NanPolicy::kSkip)
      << what << ": no --clip-grad-norm or --nan-policy skip (a gradient norm over the moved "
      << "layers' stores)";
  STRATA_CHECK(!pipeline.weight_cache && !pipeline.update_sync)
      << what << ": no --weight-cache or --sync";
  STRATA_CHECK(!pipeline.memory_plan.uses(MemoryPolicy::kSwap, 0, model_->size()) &&
               !pipeline.memory_plan.uses(MemoryPolicy::kRecompute, 0, model_->size()))
      << what << ": the moved layers keep their saved tensors (no --memory-plan swap or "
      << "recompute, no --mem-limit that needs them)";
  // The stages' stores change at the end of the run: an evaluation goes there only.
  TrainConfig epoch = config_;
  epoch.steps = 0, epoch.epochs = 1;
  const int64_t total = total_steps(config_, pipeline, train_->size());
  const int64_t per_epoch = total_steps(epoch, pipeline, train_->size());
  STRATA_CHECK(test_ == nullptr ||
               ((config_.eval_every == 0 || config_.eval_every >= total) && total <= per_epoch))
      << what << " evaluates at the end of the run only: one epoch at most and no --eval-every "
      << "below --steps (" << total << " steps, " << per_epoch << " per epoch)";
}

bool Trainer::repartitions_live() const {
  return pipeline_.repartition.policy != "off" && pipeline_.schedule == ScheduleKind::kAsync1F1B &&
         pipeline_.migration == MigrationMode::kLive;
}

void Trainer::check_live_repartition() const {
  const std::string what =
      "--repartition " + pipeline_.repartition.policy + " with async-1f1b and --migration live";
  // Every layer is a block of the stages' live migration, and a block holds no tied parameter.
  STRATA_CHECK(model_->tied_params().empty())
      << what << ": " << model_->tied_params().front().name << " is tied between layers, which "
      << "a live move keeps in place; use --migration restart";
  STRATA_CHECK(pipeline_.migrations.empty()) << what << ": no --migrate-at beside it";
  check_live_limits(pipeline_, what);
}

void Trainer::live_move_learned(LiveMoves* live, Executor& executor, const RepartitionLoop& loop,
                                int64_t e) const {
  const int64_t M = pipeline_.micro_batches;
  const Partition to = partition_of(*loop.due(e));
  const std::vector<Partition> chain = one_stage_steps(partition_of(pipeline_.partition), to);
  STRATA_CHECK(!chain.empty()) << "--repartition: the move before step " << e
                               << " goes nowhere: the stages hold its partition already";
  int64_t k = e * M;
  for (size_t i = 0; i < chain.size(); ++i) {
    std::string what = "the move before step " + std::to_string(e);
    if (chain.size() > 1)
      what += " (" + std::to_string(i + 1) + " of " + std::to_string(chain.size()) + ")";
    executor.live()->add_migration(chain[i], k, what);
    Ranges ranges;
    for (const LayerRange& r : chain[i]) ranges.push_back({r.begin, r.end});
    live->moves.push_back({k / M, ranges});
    for (const BoundaryMove& b : executor.live()->layout().migrations().back()) {
      live->last_forward = std::max(live->last_forward, b.first_forward);
    }
    k = (live->last_forward / M + 1) * M;  // the next step after its last forward switch
  }
  live->switched = live->last_forward / M + 1;
}

void Trainer::live_step_begins(LiveMoves* live, const Executor& executor, RepartitionLoop& loop,
                               int64_t step) {
  for (const Migration& m : live->moves) {
    if (m.step == step) pipeline_.partition = m.partition;  // switching from this step on
  }
  if (step != live->switched) return;
  const StageMemoryStats now = executor.memory_stats();
  loop.migrated(&now);
  live->switched = -1;
}

int64_t Trainer::live_apply_step(int64_t begin, int64_t earliest, int64_t total,
                                 int64_t last_forward, const Partition& from,
                                 const Partition& to) const {
  const int S = pipeline_.stages;
  const int64_t M = pipeline_.micro_batches;
  // The segments run one at a time and post their receives only within themselves: once steps
  // [begin, earliest) ran, the latest forward any stage ran is the last in those segments.
  int64_t ran = last_forward;
  for (int s = 0; s < S; ++s) {
    const std::vector<Program> run =
        async_stretch(s, begin, total, pipeline_.partition, pipeline_.partition);
    for (int64_t i = 0; i < earliest - begin && i < static_cast<int64_t>(run.size()); ++i) {
      for (const Instruction& in : run[static_cast<size_t>(i)]) {
        if (in.op == OpCode::kForward) ran = std::max(ran, in.micro_batch);
      }
    }
  }
  const int64_t e = std::max(earliest, (ran + 1 + M - 1) / M);
  // The move ends inside the run: the last forward switch of its chain is a micro-batch of it
  // (every source's hand-off and the inputs it ships come).
  StageLayout layout(from);
  int64_t k = e * M, last = -1;
  for (const Partition& p : one_stage_steps(from, to)) {
    layout.add_live_migration(p, k);
    for (const BoundaryMove& b : layout.migrations().back()) last = std::max(last, b.first_forward);
    k = (last / M + 1) * M;
  }
  return last < total * M ? e : -1;
}

bool Trainer::migrates_live() const {
  return !pipeline_.migrations.empty() && pipeline_.schedule == ScheduleKind::kAsync1F1B &&
         pipeline_.migration != MigrationMode::kRestart;
}

std::unique_ptr<graph::ParamStore> Trainer::make_store(size_t begin, size_t end) {
  auto store = std::make_unique<graph::ParamStore>(*model_, begin, end, ctx_.allocator(),
                                                   DType::kF32, config_.compute_dtype);
  store->initialize(config_.seed);
  if (!config_.init_weights.empty()) {
    const models::WeightsReadReport report =
        models::load_weights(config_.init_weights, *model_, *store);
    STRATA_LOG(DEBUG) << "stage " << stage_ << ": " << report.tensors_loaded << " tensors from "
                      << config_.init_weights << " (" << models::weight_naming_name(report.naming)
                      << " names)";
  }
  return store;
}

std::pair<size_t, size_t> Trainer::store_range() const {
  if (!migrates_live() && !repartitions_live()) return pipeline_.partition[stage_];
  const LayerRange core = LiveStage::core_range(
      repartitions_live() ? open_plan(pipeline_) : live_plan(pipeline_), stage_);
  return {core.begin, core.end};
}

std::unique_ptr<LiveMigrationConfig> Trainer::live_migration_config() {
  if (!migrates_live() && !repartitions_live()) return nullptr;
  // The first micro-batch of each --migrate-at step runs the moved layers' backward on their new
  // stages; --repartition adds its moves while the run goes.
  auto live = std::make_unique<LiveMigrationConfig>(repartitions_live() ? open_plan(pipeline_)
                                                                        : live_plan(pipeline_));
  live->comm = migrate_.get();
  live->transfer.chunk_bytes = pipeline_.migration_chunk_bytes;
  live->transfer.window_bytes = pipeline_.migration_window_bytes;
  live->make_store = [this](size_t begin, size_t end) { return make_store(begin, end); };
  live->paused = pipeline_.migration == MigrationMode::kDynpipe;
  live->micro_batches = total_steps(config_, pipeline_, train_->size()) * pipeline_.micro_batches;
  return live;
}

void Trainer::settle_live_migration(std::unique_ptr<Executor>& executor,
                                    std::vector<Migration> moves, Ranges first) {
  const Partition initial = partition_of(first);
  const std::pair<size_t, size_t> range =
      moves.empty() ? first[stage_] : moves.back().partition[stage_];
  // The final layout's store from the core's and the moved layers' (by parameter name).
  auto store = std::make_unique<graph::ParamStore>(
      *model_, range.first, range.second, ctx_.allocator(), DType::kF32, config_.compute_dtype);
  store->ensure_state(slots_.size());
  std::vector<const graph::ParamStore*> from{store_.get()};
  for (const graph::ParamStore* s : executor->live()->stores()) from.push_back(s);
  std::map<std::string, std::pair<const graph::ParamStore*, size_t>> params, buffers;
  for (const graph::ParamStore* s : from) {
    for (size_t i = 0; i < s->param_entries().size(); ++i) {
      params[s->param_entries()[i].full_name()] = {s, i};
    }
    for (size_t i = 0; i < s->buffer_entries().size(); ++i) {
      buffers[s->buffer_entries()[i].full_name()] = {s, i};
    }
  }
  for (size_t i = 0; i < store->param_entries().size(); ++i) {
    const std::string name = store->param_entries()[i].full_name();
    const auto it = params.find(name);
    STRATA_CHECK(it != params.end()) << "live migration: stage " << stage_ << " ends without "
                                     << name << " (the hand-off did not bring it)";
    const auto& [s, j] = it->second;
    store->param(i).copy_from(s->param(j));
    for (size_t k = 0; k < slots_.size(); ++k) {
      store->state_view(k, i).copy_from(s->state_view(k, j));
    }
  }
  for (size_t i = 0; i < store->buffer_entries().size(); ++i) {
    const std::string name = store->buffer_entries()[i].full_name();
    const auto it = buffers.find(name);
    STRATA_CHECK(it != buffers.end())
        << "live migration: stage " << stage_ << " ends without " << name;
    store->buffer(i).copy_from(it->second.first->buffer(it->second.second));
  }
  const LiveStageStats stats = executor->live()->stats();
  executor.reset();  // it holds the stores that go now
  store_ = std::move(store);
  if (!moves.empty()) pipeline_.partition = moves.back().partition;
  pipeline_.migrations.clear();  // done: the executors from here on are of the final layout
  std::vector<std::string> names;
  for (size_t i = 0; i < model_->size(); ++i) names.push_back(model_->layer(i).name());
  // Per migration: bytes summed over the ranks; seconds: the targets' time blocked on the
  // hand-off, summed (the pipeline's only wait for the migration).
  std::vector<double> totals;
  for (size_t i = 0; i < moves.size(); ++i) {
    totals.push_back(
        i < stats.migration_bytes.size() ? static_cast<double>(stats.migration_bytes[i]) : 0.0);
    totals.push_back(i < stats.migration_wait_seconds.size() ? stats.migration_wait_seconds[i]
                                                             : 0.0);
  }
  // --migration dynpipe: K and R as the target has them (the other ranks add nothing).
  const bool target = stats.handoffs_received > 0;
  totals.push_back(target ? static_cast<double>(stats.take_over + 1) : 0.0);
  totals.push_back(target ? static_cast<double>(stats.resume + 1) : 0.0);
  if (world_ != nullptr && world_->size() > 1) {
    Tensor t = Tensor::from_vector(totals, {static_cast<int64_t>(totals.size())});
    world_->all_reduce(t)->wait(world_->timeout(), "migration bytes");
    totals = t.to_vector<double>();
  }
  Partition before = initial;
  for (size_t i = 0; i < moves.size(); ++i) {
    const Partition after = partition_of(moves[i].partition);
    MigrationRecord record;
    record.step = moves[i].step;
    record.mode = pipeline_.migration;
    if (record.mode == MigrationMode::kDynpipe) {
      record.pause_at = moves[i].step * pipeline_.micro_batches;
      record.take_over = static_cast<int64_t>(totals[2 * moves.size()]) - 1;
      record.resume = static_cast<int64_t>(totals[2 * moves.size() + 1]) - 1;
    }
    record.moves = describe_moves(layer_moves(before, after), names);
    record.partition = partition_string(after, names);
    record.bytes = totals[2 * i];
    record.seconds = totals[2 * i + 1];
    if (rank_ == 0) {
      STRATA_LOG(INFO) << "step " << record.step << ": layers moved live (" << record.moves
                       << "), now " << record.partition << "; "
                       << static_cast<int64_t>(record.bytes) << " bytes, " << record.seconds
                       << " s waited for hand-offs";
      if (record.mode == MigrationMode::kDynpipe) {
        STRATA_LOG(INFO) << "  updates paused from micro-batch " << record.pause_at
                         << ", taken over at " << record.take_over << ", resumed at "
                         << record.resume;
      }
    }
    if (rank_ == 0 && observer_ != nullptr) observer_->on_migration(record);
    before = after;
  }
}

}  // namespace strata::parallel
