// `strata convert`: build the model, fill a CPU ParamStore (the seed's initialization, then the
// input's values), write it. Every check lives in the library (models/weight_files.h,
// io/safetensors.h); this file chooses the model and reports what was read and written.
#include "tools/convert_command.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>

#include "engine/allocator.h"
#include "engine/check.h"
#include "graph/model_spec.h"
#include "graph/param_store.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "models/weight_files.h"
#include "tools/common.h"

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
                  "Safetensors file to read, checked against the model (empty = initialize from "
                  "--seed)");
  cmd->add_option("--input-format", o.input_format,
                  "Names in the input: hf, strata, or auto (its strata.naming metadata, else the "
                  "naming that matches more of its names)")
      ->check(CLI::IsMember({"auto", "hf", "strata"}));
  cmd->add_flag("--ignore-extra", o.ignore_extra,
                "Skip input tensors the model has no place for (e.g. BERT's pooler) instead of "
                "failing; they are listed");
  cmd->add_option("--output", o.output, "Safetensors file to write")->required();
  cmd->add_option("--format", o.format,
                  "Names in the output: hf (Hugging Face for gpt2/bert, torchvision for vgg/"
                  "resnet) or strata (Strata's parameter names)")
      ->check(CLI::IsMember({"hf", "strata"}));
  return cmd;
}

namespace {

Shape parse_input_shape(const std::string& text) {
  Shape shape;
  std::stringstream s(text);
  std::string part;
  while (std::getline(s, part, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    STRATA_CHECK(used == part.size() && !part.empty() && v > 0)
        << "--input-shape '" << text << "': expected positive integers C,H,W, e.g. 3,224,224";
    shape.push_back(v);
  }
  STRATA_CHECK_EQ(shape.size(), 3u)
      << "--input-shape '" << text << "': expected three dimensions C,H,W";
  return shape;
}

bool is_text_model(const std::string& name) { return name == "gpt2" || name == "bert"; }

// The model of the flags, or the one the input's metadata records.
proto::ModelSpec convert_spec(const ConvertOptions& o, const io::SafetensorsReader* input) {
  if (!o.model_spec.empty()) return graph::load_model_spec(o.model_spec);
  if (!o.model.empty()) {
    models::ModelRequest r;
    r.name = o.model;
    r.size = o.size;
    r.num_classes = o.num_classes;
    if (!is_text_model(o.model)) {
      r.input_shape = o.input_shape.empty() ? Shape{3, 224, 224} : parse_input_shape(o.input_shape);
      if (r.num_classes == 0) r.num_classes = 1000;
    } else {
      STRATA_CHECK(o.input_shape.empty())
          << "--input-shape is for image models; " << o.model << " takes tokens";
    }
    return models::model_spec(r);
  }
  STRATA_CHECK(input != nullptr) << "strata convert needs a model: --model (with --size) or "
                                    "--model-spec, or an --input written by Strata";
  const auto it = input->metadata().find(models::kWeightsModelSpecKey);
  STRATA_CHECK(it != input->metadata().end())
      << "--input " << input->path() << " records no model (no " << models::kWeightsModelSpecKey
      << " metadata: not written by strata convert); give --model (with --size) or --model-spec";
  return graph::parse_model_spec(
      it->second, input->path() + " (metadata " + models::kWeightsModelSpecKey + ")");
}

std::string describe_report(const std::string& path, const models::WeightsReadReport& r) {
  std::string s = path + " (" + models::weight_naming_name(r.naming) + " names, " +
                  std::to_string(r.tensors_loaded) + " tensors read";
  if (!r.converted.empty()) {
    s += "; " + std::to_string(r.converted.size()) + " converted to f32, e.g. " + r.converted[0];
  }
  if (!r.ignored.empty()) {
    s += "; " + std::to_string(r.ignored.size()) + " ignored, e.g. " + r.ignored[0];
  }
  if (!r.extra.empty()) {
    s += "; --ignore-extra skipped " + std::to_string(r.extra.size()) + ":";
    for (const std::string& n : r.extra) s += " " + n;
  }
  return s + ")";
}

}  // namespace

int run_convert(const ConvertOptions& o) {
  // Hook for training checkpoints: a checkpoint directory (layer-keyed tensor files and a
  // manifest) is not readable here yet. When the checkpoint reader exists, a directory --input
  // loads through it into `store` below instead of through load_weights, and the rest stays.
  STRATA_CHECK(o.input.empty() || !std::filesystem::is_directory(o.input))
      << "--input " << o.input << " is a directory: reading training checkpoints is not "
      << "supported yet; give a .safetensors file";
  std::unique_ptr<io::SafetensorsReader> input;
  if (!o.input.empty()) input = std::make_unique<io::SafetensorsReader>(o.input);
  const proto::ModelSpec spec = convert_spec(o, input.get());
  const std::unique_ptr<graph::Model> model = graph::build_model(spec);
  graph::ParamStore store(*model, 0, model->size(), default_cpu_allocator());
  store.initialize(o.seed);
  std::string source = "initialization, seed " + std::to_string(o.seed);
  if (input != nullptr) {
    models::WeightsReadOptions read;
    if (o.input_format != "auto") read.naming = models::parse_weight_naming(o.input_format);
    read.ignore_extra = o.ignore_extra;
    source = describe_report(o.input, models::load_weights(o.input, *model, store, read));
  }
  const models::WeightNaming naming = models::parse_weight_naming(o.format);
  models::save_weights(o.output, *model, store, naming,
                       {{models::kWeightsModelSpecKey, graph::model_spec_to_text(spec)}});
  const io::SafetensorsReader written(o.output);
  std::printf("strata convert\n");
  print_table(
      {{"model", model->name() + " (" + std::to_string(store.num_params()) + " parameters, " +
                     std::to_string(store.buffer_entries().size()) + " buffers)"},
       {"from", source},
       {"to", o.output + " (" + models::weight_naming_name(naming) + " names, " +
                  std::to_string(written.tensors().size()) + " tensors, " +
                  format_bytes(std::filesystem::file_size(o.output)) + ")"}});
  return 0;
}

}  // namespace strata::tools
