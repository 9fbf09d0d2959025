// The name tables of models/weight_names.h, derived layer by layer from the built model (layer
// types and parameter specs), so that a model from a .prototxt file maps as the registry's does.
//
// The family of the transformer blocks is the model's embedding: token_embedding is GPT-2
// (pre-norm, HF's GPT2LMHeadModel), bert_embedding is BERT (post-norm, BertForMaskedLM). Blocks
// are numbered in order (transformer.h.{i}, bert.encoder.layer.{i}) whatever the layers are called.
#include "models/weight_names.h"

#include "engine/check.h"

namespace strata::models {
namespace {

enum class Family { kNone, kGpt2, kBert };

const char* const kBatchNormMean = "running_mean";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// BERT's block names for each parameter of Strata's transformer block (c_attn is split).
const std::map<std::string, std::string>& bert_block_names() {
  static const std::map<std::string, std::string> names{
      {"ln_1.weight", "attention.output.LayerNorm.weight"},
      {"ln_1.bias", "attention.output.LayerNorm.bias"},
      {"attn.c_proj.weight", "attention.output.dense.weight"},
      {"attn.c_proj.bias", "attention.output.dense.bias"},
      {"ln_2.weight", "output.LayerNorm.weight"},
      {"ln_2.bias", "output.LayerNorm.bias"},
      {"mlp.c_fc.weight", "intermediate.dense.weight"},
      {"mlp.c_fc.bias", "intermediate.dense.bias"},
      {"mlp.c_proj.weight", "output.dense.weight"},
      {"mlp.c_proj.bias", "output.dense.bias"}};
  return names;
}

class Builder {
 public:
  Builder(const graph::Model& model, WeightNaming naming) : model_(model) {
    map_.naming = naming;
    map_.model = model.name();
  }

  void add(const std::string& name, const Shape& shape, const std::string& source,
           WeightTransform transform = WeightTransform::kCopy, bool buffer = false,
           int64_t row_begin = 0) {
    WeightName w;
    w.name = name;
    w.shape = shape;
    w.source = source;
    w.buffer = buffer;
    w.transform = transform;
    w.row_begin = row_begin;
    if (transform == WeightTransform::kCounter) w.dtype = DType::kI64;
    STRATA_CHECK(names_.insert(name).second)
        << "model " << model_.name() << ": two parameters map to the " << naming() << " name '"
        << name << "'";
    if (!source.empty()) external_[source] = name;
    map_.tensors.push_back(std::move(w));
  }

  // A parameter as its spec says: the whole tensor, or its valid rows when it has padding rows
  // (a padded vocabulary: files keep the real one).
  void add_spec(const std::string& name, const graph::ParamSpec& p, const std::string& source) {
    if (p.valid_rows > 0 && !p.shape.empty() && p.valid_rows < p.shape[0]) {
      Shape shape = p.shape;
      shape[0] = p.valid_rows;
      add(name, shape, source, WeightTransform::kRows, false, 0);
    } else {
      add(name, p.shape, source);
    }
  }

  // A tied parameter: files may carry `name`, which must equal the owner's tensor.
  void tied(const std::string& name, const graph::ParamSpec& p, const std::string& param) {
    const auto owner = external_.find(p.tied_to);
    STRATA_CHECK(owner != external_.end())
        << "model " << model_.name() << ": " << param << " is tied to " << p.tied_to
        << ", which has no " << naming() << " name";
    map_.tied.push_back({name, owner->second, param});
  }

  // Strata's names; every batch norm buffer pair gains torchvision's counter under hf.
  void keep_names(const graph::Layer& layer, bool counters) {
    for (const graph::ParamSpec& p : layer.param_specs()) {
      const std::string full = layer.name() + "." + p.name;
      if (p.tied_to.empty()) {
        add_spec(full, p, full);
      } else if (counters) {
        tied(full, p, full);  // tied outside GPT-2/BERT's heads: the same name, if stored
      }
    }
    for (const graph::ParamSpec& b : layer.buffer_specs()) {
      const std::string full = layer.name() + "." + b.name;
      add(full, b.shape, full, WeightTransform::kCopy, /*buffer=*/true);
      if (counters && ends_with(full, kBatchNormMean)) {
        const std::string prefix = full.substr(0, full.size() - std::string(kBatchNormMean).size());
        add(prefix + "num_batches_tracked", {}, "", WeightTransform::kCounter);
      }
    }
  }

  void gpt2_block(const graph::Layer& layer, int64_t index) {
    const std::string prefix = "transformer.h." + std::to_string(index) + ".";
    for (const graph::ParamSpec& p : layer.param_specs()) {
      const std::string full = layer.name() + "." + p.name;
      if (p.shape.size() == 2) {  // the four linear weights: Conv1D's (in, out)
        add(prefix + p.name, {p.shape[1], p.shape[0]}, full, WeightTransform::kTranspose);
      } else {
        add_spec(prefix + p.name, p, full);
      }
    }
    map_.non_parameters.insert(prefix + "attn.bias");
    map_.non_parameters.insert(prefix + "attn.masked_bias");
  }

  void bert_block(const graph::Layer& layer, int64_t index) {
    const std::string prefix = "bert.encoder.layer." + std::to_string(index) + ".";
    for (const graph::ParamSpec& p : layer.param_specs()) {
      const std::string full = layer.name() + "." + p.name;
      if (p.name == "attn.c_attn.weight" || p.name == "attn.c_attn.bias") {
        STRATA_CHECK(p.shape[0] % 3 == 0) << "layer " << layer.name() << ": " << p.name << " "
                                          << shape_str(p.shape) << " is not three blocks of rows";
        const int64_t c = p.shape[0] / 3;
        const std::string kind = p.name == "attn.c_attn.weight" ? "weight" : "bias";
        Shape shape = p.shape;
        shape[0] = c;
        const char* parts[] = {"query", "key", "value"};
        for (int k = 0; k < 3; ++k) {
          add(prefix + "attention.self." + parts[k] + "." + kind, shape, full,
              WeightTransform::kRows, false, k * c);
        }
        continue;
      }
      const auto it = bert_block_names().find(p.name);
      STRATA_CHECK(it != bert_block_names().end())
          << "layer " << layer.name() << ": no BERT name for parameter " << p.name;
      add_spec(prefix + it->second, p, full);
    }
  }

  WeightMap build(Family family) {
    int64_t block = 0;
    for (size_t i = 0; i < model_.size(); ++i) {
      const graph::Layer& layer = model_.layer(i);
      const std::string type = layer.type();
      if (map_.naming == WeightNaming::kStrata) {
        keep_names(layer, false);
      } else if (type == "transformer_block") {
        STRATA_CHECK(family != Family::kNone)
            << "model " << model_.name() << ": layer " << layer.name()
            << " (transformer_block) has Hugging Face names only in a GPT-2 model (with a "
               "token_embedding layer) or a BERT model (with a bert_embedding layer); use "
               "Strata's names";
        if (family == Family::kGpt2) gpt2_block(layer, block);
        if (family == Family::kBert) bert_block(layer, block);
        ++block;
      } else if (type == "token_embedding") {
        for (const graph::ParamSpec& p : layer.param_specs()) {
          add_spec("transformer." + p.name, p, layer.name() + "." + p.name);
        }
      } else if (type == "lm_head") {
        for (const graph::ParamSpec& p : layer.param_specs()) {
          const std::string full = layer.name() + "." + p.name;
          if (p.name == "weight") {
            if (p.tied_to.empty()) add_spec("lm_head.weight", p, full);
            if (!p.tied_to.empty()) tied("lm_head.weight", p, full);
          } else {
            add_spec("transformer." + p.name, p, full);  // ln_f
          }
        }
      } else if (type == "bert_embedding") {
        for (const graph::ParamSpec& p : layer.param_specs()) {
          add_spec("bert.embeddings." + p.name, p, layer.name() + "." + p.name);
        }
        map_.non_parameters.insert("bert.embeddings.position_ids");
      } else if (type == "mlm_head") {
        for (const graph::ParamSpec& p : layer.param_specs()) {
          const std::string full = layer.name() + "." + p.name;
          if (p.name == "decoder.weight") {
            if (p.tied_to.empty()) add_spec("cls.predictions.decoder.weight", p, full);
            if (!p.tied_to.empty()) tied("cls.predictions.decoder.weight", p, full);
          } else {
            add_spec("cls.predictions." + p.name, p, full);  // transform.*, bias
          }
        }
        // HF ties the decoder's bias to cls.predictions.bias; files may store both.
        graph::ParamSpec bias;
        bias.tied_to = layer.name() + ".bias";
        tied("cls.predictions.decoder.bias", bias, layer.name() + ".bias");
      } else {
        keep_names(layer, true);
      }
    }
    if (map_.naming == WeightNaming::kHuggingFace && family == Family::kGpt2) {
      map_.optional_prefix = "transformer.";
    }
    if (map_.naming == WeightNaming::kHuggingFace && family == Family::kBert) {
      map_.optional_prefix = "bert.";
    }
    return std::move(map_);
  }

 private:
  const char* naming() const { return weight_naming_name(map_.naming); }

  const graph::Model& model_;
  WeightMap map_;
  std::set<std::string> names_;                  // file names so far
  std::map<std::string, std::string> external_;  // Strata full name -> file name
};

}  // namespace

const char* weight_naming_name(WeightNaming naming) {
  return naming == WeightNaming::kHuggingFace ? "hf" : "strata";
}

WeightNaming parse_weight_naming(const std::string& text) {
  if (text == "hf") return WeightNaming::kHuggingFace;
  if (text == "strata") return WeightNaming::kStrata;
  STRATA_THROW() << "unknown weight naming '" << text
                 << "' (valid: hf (Hugging Face / torchvision names), strata)";
}

const WeightName* WeightMap::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors[it->second];
}

const TiedName* WeightMap::find_tied(const std::string& name) const {
  for (const TiedName& t : tied) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::vector<const WeightName*> WeightMap::from_source(const std::string& full_name) const {
  std::vector<const WeightName*> out;
  const auto it = by_source_.find(full_name);
  if (it == by_source_.end()) return out;
  for (size_t i : it->second) out.push_back(&tensors[i]);
  return out;
}

WeightMap weight_map(const graph::Model& model, WeightNaming naming) {
  Family family = Family::kNone;
  for (size_t i = 0; i < model.size(); ++i) {
    const std::string type = model.layer(i).type();
    if (type == "token_embedding") family = Family::kGpt2;
    if (type == "bert_embedding") family = Family::kBert;
  }
  WeightMap map = Builder(model, naming).build(family);
  for (size_t i = 0; i < map.tensors.size(); ++i) {
    map.by_name_[map.tensors[i].name] = i;
    if (!map.tensors[i].source.empty()) map.by_source_[map.tensors[i].source].push_back(i);
  }
  return map;
}

}  // namespace strata::models
