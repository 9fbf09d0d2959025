// The Trainer's layout over time: the asynchronous schedule's programs, and re-layouts of the
// stages' layers while training runs (--migrate-at; vPIPE part 2).
//
// A synchronous schedule (gpipe, 1f1b) is empty at every step boundary, so layers move there:
// every stage sends the state of the layers it loses (parameters, gradients, optimizer state,
// running statistics: parallel/runtime/relayout.h) to their new stages and receives those it
// gains, over a communicator of its own, and the stage's executor is made again for its new
// layers, the optimizer's step count carried over. Nothing a step computes depends on which
// stage ran a layer, so the run continues bitwise as without the move.
//
// The asynchronous schedules (async-1f1b, 2bw) never empty. With --migration restart it is cut at
// every re-layout: the run before the cut stops taking new micro-batches and drains (its program
// ends with the backwards of those in flight), the layers move, and a new run starts with its
// warm-up; PipeDream's staleness restarts with it, as it would after a relaunch. The --migrate-at
// cuts are known before training; a move the repartition loop decides (parallel/
// repartition_loop.h) is known to every rank only after step d + 1 has run, so the run is cut
// then, at the first step e >= d + 2 such that every stage's segments of the steps that ran are
// those of the run cut at e (the program of [begin, e) starts as the one of [begin, end) until its
// cool-down; stage 0 forwards S - 1 micro-batches ahead: e is d + 2 while S - 1 <= M, later
// when it runs further ahead, as d + 3 with 3 stages of 1 micro-batch). The
// executor posts its receives ahead only within the segment it runs (StageTransfers::post_ahead),
// so nothing of the later segments was started. Until a move is decided the run does not drain,
// and its numbers are those of the run without the loop.
#include <algorithm>
#include <chrono>

#include "engine/check.h"
#include "engine/log.h"
#include "parallel/checkpointing.h"
#include "parallel/runtime/relayout.h"
#include "parallel/trace.h"
#include "parallel/trainer.h"

namespace strata::parallel {
namespace {

// Cuts an asynchronous program after every `per_segment`-th OptimizerStep.
std::vector<Program> segments(const Program& program, int64_t per_segment) {
  std::vector<Program> out(1);
  int64_t updates = 0;
  for (const Instruction& in : program) {
    out.back().push_back(in);
    if (in.op == OpCode::kOptimizerStep && ++updates % per_segment == 0) out.emplace_back();
  }
  if (out.back().empty()) out.pop_back();
  return out;
}

Partition to_partition(const std::vector<std::pair<size_t, size_t>>& ranges) {
  Partition p;
  for (const auto& [b, e] : ranges) p.push_back({b, e});
  return p;
}

}  // namespace

MigrationMode parse_migration_mode(const std::string& name) {
  if (name == "live") return MigrationMode::kLive;
  if (name == "restart") return MigrationMode::kRestart;
  if (name == "dynpipe") return MigrationMode::kDynpipe;
  STRATA_THROW() << "unknown --migration '" << name << "' (valid: live, restart, dynpipe)";
}

const char* migration_mode_name(MigrationMode mode) {
  switch (mode) {
    case MigrationMode::kLive:
      return "live";
    case MigrationMode::kRestart:
      return "restart";
    case MigrationMode::kDynpipe:
      return "dynpipe";
  }
  return "?";
}

std::vector<Program> Trainer::async_stretch(int stage, int64_t begin, int64_t end,
                                            const Ranges& partition, const Ranges& first) const {
  const int S = pipeline_.stages;
  const int64_t M = pipeline_.micro_batches;
  // A run of the micro-batches of steps [begin, end), numbered from there.
  Schedule run = make_schedule(pipeline_.schedule, S, (end - begin) * M, 0, M);
  Program& program = run.programs[stage];
  for (Instruction& in : program) {
    if (in.micro_batch >= 0) in.micro_batch += begin * M;
  }
  // The plan made again after a move (replan_memory) is not known yet: after a move the
  // prefetches go in anyway (a SwapIn on a stage that swaps nothing does nothing).
  const bool replanned = pipeline_.replan_memory && partition != first;
  if (replanned || pipeline_.memory_plan.uses(MemoryPolicy::kSwap, partition[stage].first,
                                              partition[stage].second)) {
    add_prefetches(&program, pipeline_.swap_lead);
  }
  return segments(program, updates_per_step(pipeline_.schedule, M));
}

int64_t Trainer::async_stretch_end(int64_t step, int64_t total) const {
  int64_t end = total;
  for (const Migration& m : pipeline_.migrations) {
    if (m.step > step && m.step < end && !migrates_live()) end = m.step;
  }
  return end;
}

std::vector<Program> Trainer::async_programs(int64_t total) const {
  // The steps where a run drains and the next one starts: the --migrate-at re-layouts.
  std::vector<int64_t> cuts{0};
  for (int64_t at = 0; at < total;) cuts.push_back(at = async_stretch_end(at, total));
  std::vector<Program> out;
  Ranges partition = pipeline_.partition;
  for (size_t r = 0; r + 1 < cuts.size(); ++r) {
    for (const Migration& m : pipeline_.migrations) {
      if (m.step == cuts[r] && m.step > 0) partition = m.partition;
    }
    for (Program& p : async_stretch(stage_, cuts[r], cuts[r + 1], partition, pipeline_.partition)) {
      out.push_back(std::move(p));
    }
  }
  STRATA_CHECK_EQ(static_cast<int64_t>(out.size()), total)
      << "async schedule: " << out.size() << " segments for " << total << " steps";
  return out;
}

int64_t Trainer::async_cut_step(int64_t begin, int64_t next, int64_t total,
                                const Ranges& first) const {
  const int64_t end = async_stretch_end(next - 1, total);
  std::vector<std::vector<Program>> ran;  // per stage, the stretch as it runs
  for (int s = 0; s < pipeline_.stages; ++s) {
    ran.push_back(async_stretch(s, begin, end, pipeline_.partition, first));
  }
  for (int64_t e = next; e < end; ++e) {
    bool same = true;
    for (int s = 0; s < pipeline_.stages && same; ++s) {
      const std::vector<Program> cut = async_stretch(s, begin, e, pipeline_.partition, first);
      same = std::equal(cut.begin(), cut.begin() + (next - begin), ran[s].begin());
    }
    if (same) return e;
  }
  return -1;  // the stretch ends (its own drain) before any step could cut it
}

void Trainer::async_recut(std::vector<Program>* programs, int64_t begin, int64_t next, int64_t e,
                          int64_t total, const Ranges& to, const Ranges& first) const {
  const int64_t end = async_stretch_end(next - 1, total);
  STRATA_CHECK(begin < next && next <= e && e < end)
      << "async schedule: a cut before step " << e << " outside the stretch [" << next << ", "
      << end << ")";
  std::vector<Program> cut = async_stretch(stage_, begin, e, pipeline_.partition, first);
  std::vector<Program> after = async_stretch(stage_, e, end, to, first);
  for (int64_t step = next; step < end; ++step) {
    (*programs)[static_cast<size_t>(step)] = step < e
                                                 ? std::move(cut[static_cast<size_t>(step - begin)])
                                                 : std::move(after[static_cast<size_t>(step - e)]);
  }
}

MigrationRecord Trainer::relayout(const Migration& migration, Trace* trace) {
  const auto start = std::chrono::steady_clock::now();
  const Partition from = to_partition(pipeline_.partition);
  const Partition to = to_partition(migration.partition);
  std::vector<std::string> names;
  for (size_t i = 0; i < model_->size(); ++i) names.push_back(model_->layer(i).name());
  MigrationRecord record;
  record.step = migration.step;
  record.mode = pipeline_.migration;
  record.moves = describe_moves(layer_moves(from, to), names);
  record.partition = partition_string(to, names);
  if (pipeline_.replan_memory) {
    // --memory-policy auto: the new partition's plan, made on rank 0 before any layer moves.
    const PartitionMemory memory =
        share_memory_plan(world_, rank_, pipeline_.memory_planner, to, model_->size());
    STRATA_CHECK(memory.feasible) << "moving the layers to " << record.partition << " before step "
                                  << migration.step << ": " << memory.refusal;
    pipeline_.memory_plan = memory.plan;
    if (rank_ == 0) record.memory_plan = memory_plan_records(memory.plan, memory.stages, to, names);
  }
  RelayoutStats stats;
  std::unique_ptr<graph::ParamStore> store;
  // A peer that fails mid-move ends the run within --comm-timeout: the error names the move.
  const std::string move = "moving the layers to " + record.partition + " after step " +
                           std::to_string(migration.step) + " (" + record.moves + "): ";
  try {
    store = relayout_store(*model_, *store_, from, to, stage_, migrate_.get(), ctx_.allocator(),
                           &stats);
  } catch (const CommTimeout& e) {
    throw CommTimeout(move + e.what());
  } catch (const CommAborted& e) {
    throw CommAborted(move + e.what());
  }
  store_ = std::move(store);  // the old store goes, and with it the memory of the layers it lost
  pipeline_.partition = migration.partition;
  if (world_ != nullptr && world_->size() > 1) make_tied_communicator();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (trace != nullptr) {
    trace->record_span("migration to " + record.partition, start, std::chrono::steady_clock::now());
  }
  // Bytes summed over the ranks, the slowest rank's time.
  std::vector<double> totals{static_cast<double>(stats.bytes_sent + stats.bytes_received)};
  if (world_ != nullptr && world_->size() > 1) {
    Tensor t = Tensor::from_vector(totals, {1});
    world_->all_reduce(t)->wait(world_->timeout(), move + "the bytes moved");
    Tensor slowest = Tensor::from_vector(std::vector<double>{seconds}, {1});
    world_->all_reduce(slowest, ReduceOp::kMax)->wait(world_->timeout(), "migration time");
    record.bytes = t.item<double>();
    record.seconds = slowest.item<double>();
  } else {
    record.bytes = totals[0];
    record.seconds = seconds;
  }
  if (rank_ == 0) {
    STRATA_LOG(INFO) << "step " << migration.step << ": layers moved (" << record.moves << "), now "
                     << record.partition << "; " << static_cast<int64_t>(record.bytes)
                     << " bytes in " << record.seconds << " s (" << migration_mode_name(record.mode)
                     << ")";
  }
  return record;
}

}  // namespace strata::parallel
