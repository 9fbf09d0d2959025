// The GroPipe preset (see the header).
#include "parallel/gropipe/preset.h"

namespace strata::parallel {

const std::vector<PresetSetting>& gropipe_preset() {
  static const std::vector<PresetSetting> preset = {
      {"--schedule", "gpipe", "Algorithm 2: fill-drain pipelines, one update per mini-batch"},
      {"--dp-bucket-mb", "0", "one all-reduce per partition, launched by its hook (Sec. III-D)"},
      {"--dp-overlap", "on", "the hook fires as the partition's backward ends (Fig. 8)"},
      {"--dp-delay", "0", "reduced gradients applied in the same iteration"},
      {"--partition", "auto", "cut from a per-layer profile"},
      {"--partitioner", "projection", "AMPA (Algorithm 1)"},
  };
  return preset;
}

std::string preset_flags(const std::vector<PresetSetting>& preset) {
  std::string text;
  for (const PresetSetting& s : preset) text += (text.empty() ? "" : " ") + s.flag + " " + s.value;
  return text;
}

void apply_gropipe(PipelineConfig* pipeline) {
  pipeline->schedule = ScheduleKind::kGPipe;
  pipeline->grad_sync.bucket_mb = 0.0;
  pipeline->grad_sync.overlap = true;
  pipeline->grad_sync.delay = 0;
}

Partition gropipe_partition(const std::vector<LayerCost>& costs, int stages,
                            const PartitionOptions& options, AmpaResult* result) {
  PartitionOptions o = options;
  o.schedule = ScheduleKind::kGPipe;
  return projection_partition(costs, stages, o, ProjectionOptions{}, result).partition;
}

}  // namespace strata::parallel
