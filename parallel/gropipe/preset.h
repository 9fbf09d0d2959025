// GroPipe as the paper runs it (papers/gropipe.md): the configuration `--system gropipe` stands
// for, one place for strata train and the GroPipe benchmarks.
//
// The paper's groups run a GPipe/torchgpipe fill-drain pipeline (Algorithm 2: every forward of the
// mini-batch, then its backward, then one synchronous update), register one autograd hook per
// partition that launches the all-reduce of the whole partition's gradients once the partition's
// backward of the mini-batch is done (Sec. III-D: --dp-bucket-mb 0, one bucket per stage, launched
// as the backward passes it), apply the reduced gradients in the same iteration (no staleness:
// --dp-delay 0), and cut the model with AMPA (Algorithm 1: --partitioner projection on a profile).
// Strata's defaults differ (1f1b, 25 MiB buckets, the exact dp partitioner), so a run or a
// benchmark called "GroPipe" says which it ran: the preset, printed in the configuration.
#pragma once

#include <string>
#include <vector>

#include "parallel/partition/projection.h"
#include "parallel/trainer.h"

namespace strata::parallel {

// One flag of a preset, as `strata train` spells it.
struct PresetSetting {
  std::string flag;   // "--schedule"
  std::string value;  // "gpipe"
  std::string why;    // "Algorithm 2: fill-drain pipelines, one update per mini-batch"
};

// The settings of `--system gropipe`, in the order the configuration prints them.
const std::vector<PresetSetting>& gropipe_preset();
// "--schedule gpipe --dp-bucket-mb 0 ..." (for help texts and reports).
std::string preset_flags(const std::vector<PresetSetting>& preset);

// The preset on a pipeline of the caller's layout (groups, stages, micro-batches): the schedule
// and the gradient all-reduce (one bucket per stage, overlapped, no delay). The partition is the
// caller's: gropipe_partition() with the costs it has.
void apply_gropipe(PipelineConfig* pipeline);
// AMPA (Algorithm 1 with the guard of projection.h at its defaults) on per-layer costs, as
// --partition auto --partitioner projection cuts the model.
Partition gropipe_partition(const std::vector<LayerCost>& costs, int stages,
                            const PartitionOptions& options, AmpaResult* result = nullptr);

}  // namespace strata::parallel
