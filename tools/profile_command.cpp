// Runs a few training steps (forward, loss, backward; no optimizer update, so every step sees
// the same weights) with the layer profiler attached. The first step warms up and is not counted.
// `strata plan` reuses the model flags, the model loading and the profiling run.
#include "tools/profile_command.h"

#include <cstdio>
#include <fstream>

#include "engine/check.h"
#include "graph/param_store.h"
#include "graph/profiler.h"
#include "graph/train_step.h"
#include "io/data_loader.h"
#include "io/datasets.h"
#include "models/registry.h"
#include "tools/common.h"
#include "tools/text_commands.h"

namespace strata::tools {

void add_model_flags(CLI::App* cmd, ProfileOptions& o) {
  cmd->add_option("--model", o.model, "Built-in model: " + models::model_names());
  cmd->add_option("--size", o.size, "Model size (empty = the model's default)");
  cmd->add_option("--model-spec", o.model_spec, "ModelSpec .prototxt file instead of --model");
  cmd->add_option("--dataset", o.dataset, "Dataset: " + io::dataset_names());
  cmd->add_option("--data-dir", o.data_dir, "Directory holding the dataset's files");
  cmd->add_option(
      "--seq-len", o.seq_len,
      "Text datasets: tokens per sample (masked tokens for bert, next token otherwise)");
}

CLI::App* add_profile_command(CLI::App& app, ProfileOptions& o) {
  CLI::App* cmd = app.add_subcommand("profile", "Measure per-layer time and memory of a model");
  cmd->option_defaults()->always_capture_default();
  add_model_flags(cmd, o);
  cmd->add_option("--batch-size", o.batch_size, "Samples per profiled step");
  cmd->add_option("--steps", o.steps, "Profiled steps (after one warm-up step)");
  cmd->add_option("--threads", o.threads, "CPU threads for ops (0 = all cores)");
  cmd->add_option("--seed", o.seed, "Seed of the initial weights");
  cmd->add_option("--output", o.output, "Also write the profile as JSON to this file");
  cmd->add_flag("--colocation", o.colocation,
                "DynPipe's co-location data set instead: each layer timed alone and beside "
                "loads of threads competing for the cores, with the CPU's counters (CSV to "
                "--colocation-output)");
  cmd->add_option("--colocation-samples", o.colocation_samples,
                  "--colocation: loaded windows of --steps steps each (a solo window before each "
                  "and after the last: as many unloaded situations as loaded)");
  cmd->add_option("--colocation-output", o.colocation_output, "--colocation: the CSV to write");
  cmd->add_option("--load-threads", o.load_threads,
                  "--colocation: the most threads of a load (0 = twice the cores)");
  cmd->add_option("--inject", o.inject,
                  "--colocation: an emulated device, as strata train's --inject "
                  "\"kind=device,factor=X\" (each layer lasts X times its CPU time, sleeping the "
                  "rest): profile under the device training runs on (only kind=device); a "
                  "loaded window's load shares the device of the rank that runs it as train's "
                  "kind=load does (its layers last 1 + threads x duty times longer)");
  return cmd;
}

std::shared_ptr<const io::Dataset> open_profile_dataset(const ProfileOptions& o) {
  io::DatasetOptions data_options;
  data_options.seq_len = o.seq_len;
  data_options.task = text_task_for_model(o.model, "auto");
  data_options.seed = o.seed;
  return io::open_dataset(o.dataset, o.data_dir, "train", data_options);
}

std::unique_ptr<graph::Model> load_cli_model(const ProfileOptions& o, std::string* dataset) {
  std::shared_ptr<const io::Dataset> data = open_profile_dataset(o);
  if (dataset != nullptr) *dataset = data->name();
  return build_cli_model(o.model, o.size, o.model_spec, *data);
}

ModelProfile profile_model(const ProfileOptions& o) {
  return profile_model(o, open_profile_dataset(o));
}

ModelProfile profile_model(const ProfileOptions& o, std::shared_ptr<const io::Dataset> data) {
  STRATA_CHECK_GT(o.steps, 0) << "--steps must be positive";
  STRATA_CHECK_GT(o.batch_size, 0) << "--batch-size must be positive";
  ModelProfile result;
  result.allocator = std::make_shared<CpuAllocator>();
  ExecContext ctx(Device::cpu(), result.allocator.get(), o.threads);
  result.model = build_cli_model(o.model, o.size, o.model_spec, *data);
  result.dataset = data->name();
  result.threads = describe_threads(ctx);
  graph::Model& model = *result.model;
  graph::ParamStore store(model, 0, model.size(), ctx.allocator());
  store.initialize(o.seed);
  result.profiler = std::make_unique<graph::LayerProfiler>(model);

  io::DataLoaderOptions lo;
  lo.batch_size = o.batch_size;
  lo.seed = o.seed;
  io::DataLoader loader(data, lo);
  io::Batch batch;
  int64_t epoch = 0;
  loader.start_epoch(epoch);
  for (int64_t step = 0; step <= o.steps; ++step) {
    if (!loader.next(&batch)) {
      loader.start_epoch(++epoch);
      STRATA_CHECK(loader.next(&batch)) << "dataset " << data->name() << " yields no batches";
    }
    graph::ForwardOptions fwd;
    fwd.seed = o.seed;
    fwd.step = step;
    graph::train_forward_backward(ctx, model, batch.input, batch.target, {}, fwd,
                                  result.profiler.get());
    store.zero_grads(ctx);
    if (step == 0) result.profiler->reset();  // the warm-up step
  }
  return result;
}

int run_profile(const ProfileOptions& o) {
  if (o.colocation) return run_colocation_profile(o);
  const ProfileOptions d;
  STRATA_CHECK(o.colocation_samples == d.colocation_samples && o.colocation_output.empty() &&
               o.load_threads == d.load_threads && o.inject.empty())
      << "--colocation-samples, --colocation-output, --load-threads and --inject are flags of "
         "--colocation";
  const ModelProfile p = profile_model(o);
  std::printf("profile of %s on %s, batch %lld, %lld steps (%s)\n\n%s", p.model->name().c_str(),
              p.dataset.c_str(), static_cast<long long>(o.batch_size),
              static_cast<long long>(o.steps), p.threads.c_str(), p.profiler->table().c_str());
  if (!o.output.empty()) {
    std::ofstream out(o.output);
    STRATA_CHECK(out.good()) << "cannot write profile to '" << o.output << "'";
    out << p.profiler->to_json() << "\n";
    std::printf("wrote %s\n", o.output.c_str());
  }
  return 0;
}

}  // namespace strata::tools
