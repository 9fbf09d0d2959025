// `strata train --array SPEC|FILE` (ArrayPipe, issue 17): the flags of a job-array, each job's
// configuration, and one rank's run (parallel/arraypipe/array_trainer.h), reported per job.
#pragma once

#include <memory>
#include <vector>

#include "engine/exec_context.h"
#include "io/dataset.h"
#include "io/metrics.h"
#include "io/proto/strata.pb.h"
#include "parallel/arraypipe/array_spec.h"
#include "parallel/comm/communicator.h"
#include "parallel/trainer.h"
#include "tools/train_command.h"

namespace strata::tools {

// Parses --array (with --array-mode) and refuses what an array cannot combine with (several
// groups, checkpoints, clipping, --nan-policy skip, ...) and a job whose batch size the layout
// cannot divide, naming the job and the setting. Throws strata::Error.
std::vector<parallel::arraypipe::ArrayJob> array_jobs(const TrainOptions& o);

// Each job's configuration: `base` (the run's flags) with the job's settings.
std::vector<parallel::TrainConfig> array_job_configs(
    const std::vector<parallel::arraypipe::ArrayJob>& jobs, const parallel::TrainConfig& base,
    const parallel::PipelineConfig& pipeline, int64_t train_size);

// One rank of the array (every rank calls it; rank 0 prints and writes `metrics`, which may be
// null or disabled).
void run_array_rank(const TrainOptions& o, const proto::ModelSpec& spec,
                    std::shared_ptr<const io::Dataset> train,
                    std::shared_ptr<const io::Dataset> test, const parallel::TrainConfig& base,
                    const parallel::PipelineConfig& pipeline, parallel::Communicator* world,
                    ExecContext& ctx, io::JsonlWriter* metrics);

}  // namespace strata::tools
