// The names under which a model's weights are exchanged: Strata's own (ParamStore full names,
// "blocks.0.attn.c_attn.weight") or those of the reference implementations, so that a file
// loads into Hugging Face transformers or torchvision and back:
//
//   GPT-2 (GPT2LMHeadModel)     transformer.wte/wpe.weight, transformer.h.{i}.ln_1, attn.c_attn,
//                               attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, transformer.ln_f. HF's
//                               Conv1D stores linear weights (in, out): Strata's (out, in)
//                               transposed. lm_head.weight is the token embedding: not stored.
//   BERT (BertForMaskedLM)      bert.embeddings.*, bert.encoder.layer.{i}.attention.self.query/
//                               key/value (the three row blocks of Strata's fused c_attn),
//                               attention.output.dense/LayerNorm (c_proj, ln_1), intermediate.dense
//                               (c_fc), output.dense/LayerNorm (c_proj, ln_2), cls.predictions.
//                               transform.dense/LayerNorm, cls.predictions.bias. The decoder is the
//                               word embedding: not stored.
//   ResNet, VGG (torchvision)   Strata's layer names are torchvision's (conv1, bn1, layer1.0.conv1,
//                               downsample.0/1, fc; features.{i}, classifier.{i}), so names carry
//                               over; every batch norm adds num_batches_tracked (I64 scalar,
//                               written 0 since Strata does not count batches, ignored on read).
//   other layers                keep Strata's names (the cnn and mlp models).
//
// Parameter counts match the references one to one (tests/models/), so every tensor of the model
// maps to exactly one tensor of a file or, for the query/key/value split, to three that together
// cover it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/tensor.h"
#include "graph/model.h"

namespace strata::models {

enum class WeightNaming {
  kHuggingFace,  // "hf": Hugging Face's names for GPT-2 and BERT, torchvision's for CNNs
  kStrata,       // "strata": ParamStore full names
};
const char* weight_naming_name(WeightNaming naming);        // "hf", "strata"
WeightNaming parse_weight_naming(const std::string& text);  // throws listing the valid names

// How a tensor of the file is made from a Strata tensor (and, reading, the other way).
enum class WeightTransform {
  kCopy,       // same shape, same values
  kTranspose,  // a 2-D weight, Strata's (out, in) stored as (in, out) (GPT-2's Conv1D)
  kRows,       // rows [row_begin, row_begin + shape[0]) of the Strata tensor (BERT's query/key/
               // value from the fused c_attn)
  kCounter,    // no Strata tensor: batch norm's num_batches_tracked, written 0, ignored on read
};

struct WeightName {
  std::string name;  // in the file
  Shape shape;       // in the file
  DType dtype = DType::kF32;
  std::string source;   // Strata's full name ("blocks.0.attn.c_attn.weight"); empty for kCounter
  bool buffer = false;  // the source is a buffer (running statistics), not a parameter
  WeightTransform transform = WeightTransform::kCopy;
  int64_t row_begin = 0;  // kRows
};

// A name some files also carry for a tied parameter, whose values must equal its owner's.
struct TiedName {
  std::string name;   // in the file: "lm_head.weight"
  std::string owner;  // the file name of the tensor it is: "transformer.wte.weight"
  std::string param;  // Strata's full name of the tied parameter: "head.weight"
};

struct WeightMap {
  WeightNaming naming = WeightNaming::kHuggingFace;
  std::string model;                // the model's name, for messages
  std::vector<WeightName> tensors;  // what a file holds, in the model's layer order
  std::vector<TiedName> tied;       // may be present, must equal their owner
  // Tensors some exporters include that are no parameters (GPT-2's causal masks
  // "transformer.h.{i}.attn.bias", BERT's "bert.embeddings.position_ids"): ignored on read.
  std::set<std::string> non_parameters;
  // A prefix that files of the base model leave out ("transformer." in GPT2Model files, as on the
  // hub): a name without it is read as the name with it.
  std::string optional_prefix;

  const WeightName* find(const std::string& name) const;  // null if absent
  const TiedName* find_tied(const std::string& name) const;
  // The tensors whose source is Strata's `full_name` (one, or the row blocks of a split).
  std::vector<const WeightName*> from_source(const std::string& full_name) const;

 private:
  friend WeightMap weight_map(const graph::Model& model, WeightNaming naming);
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::vector<size_t>> by_source_;
};

// The exchange names of every parameter and buffer of `model` (tied parameters once, under their
// owner). Throws naming the layer when a naming cannot describe it (a transformer block in a
// model that is neither GPT-2 nor BERT, under hf).
WeightMap weight_map(const graph::Model& model, WeightNaming naming);

}  // namespace strata::models
