// The model and weights of --model/--size/--model-spec and --weights (see the header). Every
// check of the values lives in the library (models/weight_files.h, io/safetensors.h,
// graph/checkpoint.h); this file chooses the model and says what was read.
#include "tools/weights_source.h"

#include <filesystem>
#include <sstream>

#include "engine/check.h"
#include "graph/model_spec.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "models/weight_files.h"
#include "parallel/checkpointing.h"

namespace strata::tools {
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
  STRATA_CHECK(shape.size() == 3u)
      << "--input-shape '" << text << "': expected three dimensions C,H,W, got " << shape.size();
  return shape;
}

bool is_text_model(const std::string& name) { return name == "gpt2" || name == "bert"; }

// A GPT-2 of Hugging Face names without Strata's metadata: its dimensions from its tensors.
std::optional<proto::ModelSpec> infer_gpt2(const io::SafetensorsReader& file) {
  std::string prefix = "transformer.";
  const io::SafetensorsInfo* wte = file.find(prefix + "wte.weight");
  if (wte == nullptr) {
    prefix = "";
    wte = file.find("wte.weight");
  }
  const io::SafetensorsInfo* wpe = file.find(prefix + "wpe.weight");
  if (wte == nullptr || wpe == nullptr || wte->shape.size() != 2 || wpe->shape.size() != 2) {
    return std::nullopt;
  }
  int64_t layers = 0;
  while (file.find(prefix + "h." + std::to_string(layers) + ".ln_1.weight") != nullptr) ++layers;
  models::ModelRequest r;
  r.name = "gpt2";
  r.size = "124M";
  r.dims.layers = layers;
  r.dims.width = wte->shape[1];
  r.dims.heads = std::max<int64_t>(1, wte->shape[1] / 64);
  r.dims.seq_len = wpe->shape[0];
  r.dims.vocab_size = wte->shape[0];
  proto::ModelSpec spec = models::model_spec(r);
  spec.set_name("gpt2 (" + std::to_string(layers) + " layers, width " +
                std::to_string(wte->shape[1]) + ", from " + file.path() + ")");
  return spec;
}

// The model of the flags, or the one the weights record.
proto::ModelSpec source_spec(const ModelSource& o, const io::SafetensorsReader* input,
                             const graph::CheckpointRef* checkpoint,
                             const proto::CheckpointManifest* manifest) {
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
  if (checkpoint != nullptr) {
    STRATA_CHECK(manifest->has_model())
        << o.weights_flag << " checkpoint " << checkpoint->path
        << " records no model in its manifest; give --model (with --size) or --model-spec";
    return manifest->model();
  }
  STRATA_CHECK(input != nullptr) << o.command
                                 << " needs a model: --model (with --size) or --model-spec, or "
                                 << o.weights_flag << " written by Strata";
  const auto it = input->metadata().find(models::kWeightsModelSpecKey);
  if (it != input->metadata().end()) {
    return graph::parse_model_spec(
        it->second, input->path() + " (metadata " + models::kWeightsModelSpecKey + ")");
  }
  if (std::optional<proto::ModelSpec> gpt2 = infer_gpt2(*input)) return *gpt2;
  STRATA_THROW() << o.weights_flag << " " << input->path() << " records no model (no "
                 << models::kWeightsModelSpecKey
                 << " metadata: not written by strata convert, and not a GPT-2 of Hugging Face "
                    "names); give --model (with --size) or --model-spec";
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

// The checkpoint a directory names: DIR itself (it has a manifest) or the newest complete
// checkpoint under DIR.
graph::CheckpointRef directory_checkpoint(const std::string& flag, const std::string& dir) {
  if (std::filesystem::exists(dir + "/manifest.pb")) {
    return {dir, graph::check_checkpoint(dir).step()};
  }
  const std::optional<graph::CheckpointRef> latest = graph::find_latest_checkpoint(dir);
  if (!latest) {
    throw graph::CheckpointError(flag + " " + dir +
                                 " is a directory without a complete checkpoint (a manifest.pb, "
                                 "or step-NNNNNN/ directories with one)");
  }
  return *latest;
}

}  // namespace

void add_model_source_flags(CLI::App* cmd, ModelSource& o, const std::string& weights_help) {
  cmd->add_option(
      "--model", o.model,
      "Built-in model: " + models::model_names() + " (empty = the model the weights record)");
  cmd->add_option("--size", o.size, "Model size (empty = the model's default)");
  cmd->add_option("--model-spec", o.model_spec, "ModelSpec .prototxt file instead of --model");
  cmd->add_option(o.weights_flag, o.weights, weights_help);
  cmd->add_option("--input-format", o.weights_format,
                  "Names in the weights file: hf, strata, or auto (its strata.naming metadata, "
                  "else the naming that matches more of its names)")
      ->check(CLI::IsMember({"auto", "hf", "strata"}));
  cmd->add_flag("--ignore-extra", o.ignore_extra,
                "Skip tensors of the weights file the model has no place for (e.g. BERT's "
                "pooler) instead of failing; they are listed");
}

LoadedModel load_model_source(const ModelSource& o, Allocator& allocator,
                              const Shape& sample_shape) {
  LoadedModel m;
  std::unique_ptr<io::SafetensorsReader> input;
  if (!o.weights.empty() && std::filesystem::is_directory(o.weights)) {
    m.checkpoint = directory_checkpoint(o.weights_flag, o.weights);
    m.manifest = graph::read_manifest(m.checkpoint->path);
  } else if (!o.weights.empty()) {
    STRATA_CHECK(std::filesystem::exists(o.weights))
        << o.weights_flag << " " << o.weights
        << ": no such file or directory (a safetensors file, or a checkpoint directory)";
    input = std::make_unique<io::SafetensorsReader>(o.weights);
  }
  m.spec = source_spec(o, input.get(), m.checkpoint ? &*m.checkpoint : nullptr, &m.manifest);
  if (!sample_shape.empty() && m.spec.input().shape_size() == 1 && sample_shape.size() == 1) {
    m.spec.mutable_input()->set_shape(0, sample_shape[0]);
  }
  m.model = graph::build_model(m.spec);
  m.store = std::make_unique<graph::ParamStore>(*m.model, 0, m.model->size(), allocator);
  m.store->initialize(o.seed);
  m.source = "initialization, seed " + std::to_string(o.seed);
  if (m.checkpoint) {
    parallel::load_checkpoint(nullptr, m.checkpoint->path, *m.model, *m.store, {});
    m.source = "checkpoint " + m.checkpoint->path + " (step " + std::to_string(m.checkpoint->step) +
               ", " + std::to_string(m.manifest.tensor_size()) + " tensors in it)";
  } else if (input != nullptr) {
    models::WeightsReadOptions read;
    if (o.weights_format != "auto") read.naming = models::parse_weight_naming(o.weights_format);
    read.ignore_extra = o.ignore_extra;
    m.source =
        describe_report(o.weights, models::load_weights(o.weights, *m.model, *m.store, read));
  }
  return m;
}

}  // namespace strata::tools
