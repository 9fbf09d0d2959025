#include "parallel/arraypipe/array_checkpoints.h"

#include <ctime>
#include <filesystem>

#include "engine/check.h"
#include "graph/checkpoint.h"
#include "graph/optimizer.h"
#include "parallel/checkpointing.h"

namespace strata::parallel::arraypipe {
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

std::string job_checkpoint_dir(const std::string& root, int job) {
  return (std::filesystem::path(root) / ("job-" + std::to_string(job))).string();
}

proto::CheckpointManifest describe_job(const proto::ModelSpec& spec, const graph::Model& model,
                                       const TrainConfig& config, const PipelineConfig& pipeline,
                                       const JobRunState& state, const std::string& reason) {
  proto::CheckpointManifest m;
  *m.mutable_model() = spec;
  m.set_created_at(utc_now());
  m.set_reason(reason);
  proto::CheckpointLayout* layout = m.mutable_layout();
  layout->set_stages(pipeline.stages);
  layout->set_groups(1);
  layout->set_micro_batches(pipeline.micro_batches);
  layout->set_schedule(schedule_name(ScheduleKind::kGPipe));  // the job's blocks: its gpipe step
  for (const auto& [b, e] : pipeline.partition) {
    proto::CheckpointStage* s = layout->add_stage();
    s->set_begin(static_cast<int64_t>(b));
    s->set_end(static_cast<int64_t>(e));
    s->set_first_layer(model.layer(b).name());
    s->set_last_layer(model.layer(e - 1).name());
  }
  proto::CheckpointRunState* r = m.mutable_run();
  const int64_t per_epoch = std::max<int64_t>(1, state.per_epoch);
  r->set_seed(config.seed);
  r->set_batch_size(config.batch_size);
  r->set_epoch(state.step / per_epoch);
  r->set_step_in_epoch(state.step % per_epoch);
  r->set_steps_per_epoch(per_epoch);
  r->set_train_samples(state.train_samples);
  r->set_dataset(state.dataset);
  r->set_total_steps(state.total);
  r->set_samples_seen(state.samples_seen);
  r->set_skipped_steps(0);
  r->set_dp_delay(0);
  r->set_dp_pending(0);
  const graph::OptimizerConfig& opt = config.optimizer;
  proto::CheckpointOptimizer* o = m.mutable_optimizer();
  o->set_kind(graph::optimizer_name(opt.kind));
  for (const std::string& slot : graph::optimizer_slot_names(opt)) o->add_slot(slot);
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

std::optional<proto::CheckpointManifest> resume_job(
    Communicator* world, const std::string& resume, const std::string& checkpoint_dir, int job,
    const TrainConfig& config, const graph::Model& model, graph::ParamStore& store,
    const std::vector<std::string>& slots, std::string* path) {
  const std::string own_root =
      checkpoint_dir.empty() ? std::string() : job_checkpoint_dir(checkpoint_dir, job);
  std::string where = resume;
  if (resume != "auto") where = job_checkpoint_dir(resume, job);
  const std::optional<graph::CheckpointRef> ref =
      choose_checkpoint(world, where, resume == "auto" ? own_root : std::string());
  if (!ref) return std::nullopt;
  *path = ref->path;
  const std::string name = "--array job " + std::to_string(job);
  return load_checkpoint(
      world, ref->path, model, store, slots, [&](const proto::CheckpointManifest& m) {
        const std::vector<std::string> theirs(m.optimizer().slot().begin(),
                                              m.optimizer().slot().end());
        if (m.optimizer().kind() != graph::optimizer_name(config.optimizer.kind) ||
            theirs != slots) {
          throw graph::CheckpointError(name + ": the checkpoint was written with optimizer " +
                                       m.optimizer().kind() + ", the job uses " +
                                       graph::optimizer_name(config.optimizer.kind) +
                                       " (or other state slots)");
        }
        if (m.run().dp_pending() > 0) {
          throw graph::CheckpointError(name +
                                       ": the checkpoint holds delayed gradients (--dp-delay)");
        }
        return std::vector<std::string>{};
      });
}

}  // namespace strata::parallel::arraypipe
