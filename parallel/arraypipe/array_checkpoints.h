// Per-job checkpoints of a job-array (issue 17): job j's checkpoints go under DIR/job-j in the
// layer-keyed format of a solo run (parallel/checkpointing.h, graph/checkpoint.h), with the
// manifest its solo run would write (its seed, batch size, data position, optimizer and
// settings; the layout of its --schedule gpipe run), so that a job resumes alone
// (`strata train --resume DIR/job-j` with the job's flags, no --array) or with the array
// (`--array ... --resume DIR`), and either ends as the uninterrupted job does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/model.h"
#include "graph/param_store.h"
#include "io/proto/strata.pb.h"
#include "parallel/comm/communicator.h"
#include "parallel/trainer.h"

namespace strata::parallel::arraypipe {

// DIR/job-j.
std::string job_checkpoint_dir(const std::string& root, int job);

// The manifest of job `config`'s checkpoint (everything but the tensors): its solo run's (gpipe
// on `pipeline`'s stages, one group), with the updates it skipped (--nan-policy skip).
proto::CheckpointManifest describe_job(const proto::ModelSpec& spec, const graph::Model& model,
                                       const TrainConfig& config, const PipelineConfig& pipeline,
                                       const CheckpointRun& run, int64_t skipped_steps,
                                       const std::string& reason);

// Collective: the checkpoint job `job` resumes from under `resume` ("auto": the newest under its
// --checkpoint-dir's job-j, none when there is none; a path: that root's job-j, an error when it
// holds none), loaded into `store` (optimizer state slots
// `slots`, refused by name when the checkpoint's optimizer differs). Returns the manifest, or
// nothing when there is no checkpoint to resume.
std::optional<proto::CheckpointManifest> resume_job(
    Communicator* world, const std::string& resume, const std::string& checkpoint_dir, int job,
    const TrainConfig& config, const graph::Model& model, graph::ParamStore& store,
    const std::vector<std::string>& slots, std::string* path);

}  // namespace strata::parallel::arraypipe
