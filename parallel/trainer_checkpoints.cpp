// The Trainer's checkpoints: the run state a checkpoint holds beside the tensors, the checks a
// checkpoint must pass before it is resumed, and the resume itself (see parallel/trainer.cpp's
// header on exact resumption).
#include <algorithm>
#include <ctime>

#include "engine/check.h"
#include "engine/log.h"
#include "graph/checkpoint.h"
#include "parallel/checkpointing.h"
#include "parallel/trainer.h"

namespace strata::parallel {
namespace {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

std::vector<std::string> Trainer::delayed_slot_names(int64_t pending) {
  std::vector<std::string> names;
  for (int64_t i = 0; i < pending; ++i) names.push_back("dp_delayed_grad_" + std::to_string(i));
  return names;
}

void Trainer::check_resumable(const proto::CheckpointManifest& m) const {
  const int pending = m.run().dp_pending();
  const int delay = pipeline_.grad_sync.delay;
  if (pending > 0 && (m.run().dp_delay() != delay || pipeline_.groups < 2)) {
    throw graph::CheckpointError(
        "it holds the gradients of its last " + std::to_string(pending) +
        " steps, all-reduced but not applied yet (written with --dp-delay " +
        std::to_string(m.run().dp_delay()) + "); this run uses --dp-delay " +
        std::to_string(delay) + " over " + std::to_string(pipeline_.groups) +
        " group(s): resume with --dp-delay " + std::to_string(m.run().dp_delay()) +
        " and --groups of 2 or more, so that they are applied when the run that wrote it would "
        "have applied them");
  }
  if (pending > m.run().dp_delay() || pending < 0) {
    throw graph::CheckpointError("its manifest says " + std::to_string(pending) +
                                 " delayed gradients with --dp-delay " +
                                 std::to_string(m.run().dp_delay()) + ": corrupt");
  }
  const graph::OptimizerConfig& opt = config_.optimizer;
  const std::vector<std::string> slots(m.optimizer().slot().begin(), m.optimizer().slot().end());
  if (m.optimizer().kind() != graph::optimizer_name(opt.kind) || slots != slots_) {
    std::string names;
    for (const std::string& n : slots) names += (names.empty() ? "" : ", ") + n;
    throw graph::CheckpointError("it was written with optimizer " + m.optimizer().kind() +
                                 " (state: " + (names.empty() ? "none" : names) +
                                 "), this run uses " + graph::optimizer_name(opt.kind) +
                                 ": resume with the same --optimizer (and --momentum > 0 for "
                                 "sgd with momentum state)");
  }
}

void Trainer::resume() {
  const std::optional<graph::CheckpointRef> ref =
      choose_checkpoint(world_, config_.checkpoint.resume, config_.checkpoint.dir);
  if (!ref) {
    if (rank_ == 0) {
      STRATA_LOG(INFO) << "--resume auto: no complete checkpoint in " << config_.checkpoint.dir
                       << ", starting from step 0";
    }
    return;
  }
  const proto::CheckpointManifest m = load_checkpoint(
      world_, ref->path, *model_, *store_, slots_, [this](const proto::CheckpointManifest& m) {
        check_resumable(m);
        return delayed_slot_names(m.run().dp_pending());
      });
  start_step_ = m.step();
  resumed_pending_ = m.run().dp_pending();
  if (m.run().has_loss_scale())
    scaler_.restore(m.run().loss_scale(), m.run().loss_scale_good_steps());
  skipped_before_ = m.run().skipped_steps();
  samples_before_ = m.run().samples_seen();
  resumed_from_ = ref->path;
  if (rank_ != 0) return;
  STRATA_LOG(INFO) << "resumed from " << ref->path << ": step " << m.step() << " (epoch "
                   << m.run().epoch() + 1 << ", " << m.run().step_in_epoch() << " of its "
                   << m.run().steps_per_epoch()
                   << " batches done; written by G=" << m.layout().groups()
                   << " x S=" << m.layout().stages() << ", loaded into G=" << pipeline_.groups
                   << " x S=" << pipeline_.stages << ")";
  const proto::CheckpointRunState& r = m.run();
  std::string differs;
  if (r.seed() != config_.seed)
    differs += " seed " + std::to_string(r.seed()) + " (now " + std::to_string(config_.seed) + ")";
  if (r.batch_size() != config_.batch_size)
    differs += " batch size " + std::to_string(r.batch_size()) + " (now " +
               std::to_string(config_.batch_size) + ")";
  if (r.train_samples() != train_->size())
    differs += " training samples " + std::to_string(r.train_samples()) + " (now " +
               std::to_string(train_->size()) + ")";
  // A checkpoint of step 0 (`strata convert --output-checkpoint`) has no data order to continue.
  if (!differs.empty() && m.step() > 0) {
    STRATA_LOG(WARN) << "the checkpoint was written with" << differs
                     << ": the data order and random streams differ from the run that wrote it, "
                        "so training will not continue it exactly";
  }
}

proto::CheckpointManifest describe_checkpoint(const proto::ModelSpec& spec,
                                              const graph::Model& model, const TrainConfig& config,
                                              const PipelineConfig& pipeline,
                                              const std::vector<std::string>& slots,
                                              const CheckpointRun& run, const std::string& reason) {
  proto::CheckpointManifest m;
  *m.mutable_model() = spec;
  m.set_created_at(utc_now());
  m.set_reason(reason);
  proto::CheckpointLayout* layout = m.mutable_layout();
  layout->set_stages(pipeline.stages);
  layout->set_groups(pipeline.groups);
  layout->set_micro_batches(pipeline.micro_batches);
  layout->set_schedule(schedule_name(pipeline.schedule));
  for (const auto& [b, e] : pipeline.partition) {
    proto::CheckpointStage* s = layout->add_stage();
    s->set_begin(static_cast<int64_t>(b));
    s->set_end(static_cast<int64_t>(e));
    s->set_first_layer(model.layer(b).name());
    s->set_last_layer(model.layer(e - 1).name());
  }
  proto::CheckpointRunState* r = m.mutable_run();
  const int64_t per_epoch = std::max<int64_t>(1, run.per_epoch);
  r->set_seed(config.seed);
  r->set_batch_size(config.batch_size);
  r->set_epoch(run.step / per_epoch);
  r->set_step_in_epoch(run.step % per_epoch);
  r->set_steps_per_epoch(per_epoch);
  r->set_train_samples(run.train_samples);
  r->set_dataset(run.dataset);
  r->set_total_steps(run.total);
  r->set_samples_seen(run.samples_seen);
  const graph::OptimizerConfig& opt = config.optimizer;
  proto::CheckpointOptimizer* o = m.mutable_optimizer();
  o->set_kind(graph::optimizer_name(opt.kind));
  for (const std::string& slot : slots) o->add_slot(slot);
  o->set_lr(opt.schedule.base_lr);
  o->set_lr_schedule(ops::lr_schedule_name(opt.schedule.kind));
  o->set_warmup_steps(opt.schedule.warmup_steps);
  o->set_min_lr(opt.schedule.min_lr);
  o->set_weight_decay(opt.weight_decay);
  o->set_momentum(opt.momentum);
  o->set_nesterov(opt.nesterov);
  o->set_beta1(opt.beta1);
  o->set_beta2(opt.beta2);
  o->set_eps(opt.eps);
  o->set_clip_grad_norm(opt.clip_grad_norm);
  return m;
}

proto::CheckpointManifest Trainer::describe_run(int64_t step, int64_t total, int64_t per_epoch,
                                                int64_t samples, const std::string& reason) const {
  CheckpointRun run;
  run.step = step;
  run.total = total;
  run.per_epoch = per_epoch;
  run.train_samples = train_->size();
  run.dataset = train_->name();
  run.samples_seen = samples;
  return describe_checkpoint(spec_, *model_, config_, pipeline_, slots_, run, reason);
}

}  // namespace strata::parallel
