#include "parallel/arraypipe/array_checkpoints.h"

#include <filesystem>

#include "engine/check.h"
#include "graph/checkpoint.h"
#include "graph/optimizer.h"
#include "parallel/checkpointing.h"

namespace strata::parallel::arraypipe {
std::string job_checkpoint_dir(const std::string& root, int job) {
  return (std::filesystem::path(root) / ("job-" + std::to_string(job))).string();
}

proto::CheckpointManifest describe_job(const proto::ModelSpec& spec, const graph::Model& model,
                                       const TrainConfig& config, const PipelineConfig& pipeline,
                                       const CheckpointRun& run, int64_t skipped_steps,
                                       const std::string& reason) {
  PipelineConfig solo = pipeline;  // the job's blocks: its solo gpipe step on one group
  solo.schedule = ScheduleKind::kGPipe;
  solo.groups = 1;
  proto::CheckpointManifest m = describe_checkpoint(
      spec, model, config, solo, graph::optimizer_slot_names(config.optimizer), run, reason);
  m.mutable_run()->set_skipped_steps(skipped_steps);
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
