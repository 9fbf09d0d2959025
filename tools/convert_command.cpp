// `strata convert`: build the model, fill a CPU ParamStore (the seed's initialization, then the
// input's values: a safetensors file or a training checkpoint), write it (safetensors, or a
// checkpoint of step 0). Every check lives in the library (models/weight_files.h,
// io/safetensors.h, graph/checkpoint.h); this file chooses the model and reports what was read
// and written.
#include "tools/convert_command.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>

#include "engine/allocator.h"
#include "engine/check.h"
#include "graph/checkpoint.h"
#include "graph/model_spec.h"
#include "graph/optimizer.h"
#include "graph/param_store.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "models/weight_files.h"
#include "parallel/checkpointing.h"
#include "tools/common.h"
#include "tools/weights_source.h"

namespace strata::tools {

CLI::App* add_convert_command(CLI::App& app, ConvertOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "convert",
      "Write a model's weights as safetensors (Hugging Face/torchvision or Strata names)");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--model", o.model,
                  "Built-in model: " + models::model_names() +
                      " (empty = the model recorded in the input's metadata)");
  cmd->add_option("--size", o.size, "Model size (empty = the model's default)");
  cmd->add_option("--model-spec", o.model_spec, "ModelSpec .prototxt file instead of --model");
  cmd->add_option(
      "--input-shape", o.input_shape,
      "Image models: one sample C,H,W (empty = 3,224,224); below 65 px ResNet takes its "
      "small-image stem, as in `strata train`");
  cmd->add_option("--num-classes", o.num_classes,
                  "Classes of image models (0 = 1000), vocabulary of gpt2/bert (0 = the size's: "
                  "50257/30522, 256 for tiny); match the dataset you train on");
  cmd->add_option("--seed", o.seed, "Seed of the initialization (when no --input is given)");
  cmd->add_option("--input,--weights", o.input,
                  "Safetensors file to read, checked against the model, or a training checkpoint "
                  "directory: DIR/step-NNNNNN, or a --checkpoint-dir root DIR (its newest complete "
                  "checkpoint); its manifest gives the model (empty = initialize from --seed)");
  cmd->add_option("--input-format", o.input_format,
                  "Names in the input: hf, strata, or auto (its strata.naming metadata, else the "
                  "naming that matches more of its names)")
      ->check(CLI::IsMember({"auto", "hf", "strata"}));
  cmd->add_flag("--ignore-extra", o.ignore_extra,
                "Skip input tensors the model has no place for (e.g. BERT's pooler) instead of "
                "failing; they are listed");
  CLI::Option* output = cmd->add_option("--output", o.output,
                                        "Safetensors file to write (or give --output-checkpoint)");
  cmd->add_option("--output-checkpoint", o.output_checkpoint,
                  "Write a training checkpoint instead: DIR/step-000000 (DIR new or empty), with "
                  "zero optimizer state; `strata train --checkpoint-dir DIR --resume auto` (same "
                  "--optimizer) starts from it")
      ->excludes(output);
  cmd->add_option("--optimizer", o.optimizer,
                  "--output-checkpoint: the optimizer of the run that resumes from it (its state "
                  "slots, zero): sgd, adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}));
  cmd->add_option("--momentum", o.momentum,
                  "--output-checkpoint with sgd: the run's --momentum (0 = no momentum state)");
  cmd->add_option("--format", o.format,
                  "Names in the output: hf (Hugging Face for gpt2/bert, torchvision for vgg/"
                  "resnet) or strata (Strata's parameter names)")
      ->check(CLI::IsMember({"hf", "strata"}));
  return cmd;
}

namespace {

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Writes `store` as the checkpoint ROOT/step-000000 of one stage holding every layer, with the
// zero state of the optimizer `o` asks for. Returns its path.
std::string write_checkpoint(const ConvertOptions& o, const proto::ModelSpec& spec,
                             const graph::Model& model, graph::ParamStore& store) {
  const std::string& root = o.output_checkpoint;
  std::error_code ec;
  STRATA_CHECK(!std::filesystem::exists(root, ec) ||
               (std::filesystem::is_directory(root, ec) && std::filesystem::is_empty(root, ec)))
      << "--output-checkpoint " << root
      << " exists and is not an empty directory: give a new one (a resume would otherwise take "
         "a newer checkpoint there)";
  graph::OptimizerConfig opt;
  opt.kind = graph::parse_optimizer(o.optimizer);
  opt.momentum = o.momentum;
  STRATA_CHECK(o.momentum >= 0 && o.momentum < 1) << "--momentum must be in [0, 1)";
  const std::vector<std::string> slots = graph::optimizer_slot_names(opt);
  store.ensure_state(slots.size());  // zeros: a fresh optimizer
  proto::CheckpointManifest m;
  *m.mutable_model() = spec;
  m.set_created_at(utc_now());
  m.set_reason("convert");
  proto::CheckpointLayout* layout = m.mutable_layout();
  layout->set_stages(1);
  layout->set_groups(1);
  layout->set_micro_batches(1);
  proto::CheckpointStage* stage = layout->add_stage();
  stage->set_begin(0);
  stage->set_end(static_cast<int64_t>(model.size()));
  stage->set_first_layer(model.layer(0).name());
  stage->set_last_layer(model.layer(model.size() - 1).name());
  m.mutable_run()->set_seed(o.seed);
  proto::CheckpointOptimizer* mo = m.mutable_optimizer();
  mo->set_kind(graph::optimizer_name(opt.kind));
  for (const std::string& slot : slots) mo->add_slot(slot);
  if (opt.kind == graph::OptimizerKind::kSgd) mo->set_momentum(opt.momentum);
  return parallel::save_checkpoint(nullptr, root, 0, 0, m, store, slots, true).path;
}

}  // namespace

int run_convert(const ConvertOptions& o) {
  STRATA_CHECK(!o.output.empty() || !o.output_checkpoint.empty())
      << "strata convert needs --output (a safetensors file) or --output-checkpoint (a "
         "checkpoint directory)";
  ModelSource from;
  from.model = o.model;
  from.size = o.size;
  from.model_spec = o.model_spec;
  from.input_shape = o.input_shape;
  from.num_classes = o.num_classes;
  from.seed = o.seed;
  from.weights = o.input;
  from.weights_format = o.input_format;
  from.ignore_extra = o.ignore_extra;
  from.weights_flag = "--input";
  from.command = "strata convert";
  const LoadedModel loaded = load_model_source(from, default_cpu_allocator());
  const proto::ModelSpec& spec = loaded.spec;
  const graph::Model& model_ref = *loaded.model;
  graph::ParamStore& store = *loaded.store;
  const std::string& source = loaded.source;
  std::string to;
  if (!o.output_checkpoint.empty()) {
    const std::string path = write_checkpoint(o, spec, model_ref, store);
    to = path + " (checkpoint of step 0, optimizer " + o.optimizer +
         " with zero state; resume "
         "with --checkpoint-dir " +
         o.output_checkpoint + " --resume auto --optimizer " + o.optimizer + ")";
  } else {
    const models::WeightNaming naming = models::parse_weight_naming(o.format);
    models::save_weights(o.output, model_ref, store, naming,
                         {{models::kWeightsModelSpecKey, graph::model_spec_to_text(spec)}});
    const io::SafetensorsReader written(o.output);
    to = o.output + " (" + models::weight_naming_name(naming) + " names, " +
         std::to_string(written.tensors().size()) + " tensors, " +
         format_bytes(std::filesystem::file_size(o.output)) + ")";
  }
  std::printf("strata convert\n");
  print_table(
      {{"model", model_ref.name() + " (" + std::to_string(store.num_params()) + " parameters, " +
                     std::to_string(store.buffer_entries().size()) + " buffers)"},
       {"from", source},
       {"to", to}});
  return 0;
}

}  // namespace strata::tools
