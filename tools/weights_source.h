// Where a subcommand's model and weights come from, as `strata convert`, `strata generate` and
// `strata eval` take them: --model/--size (or --model-spec) and --weights, a safetensors file
// (Strata's or Hugging Face/torchvision names) or a training checkpoint directory (a step-NNNNNN
// directory or a --checkpoint-dir root: its newest complete checkpoint, written in any layout).
//
// Without --model, the model is the one the weights record: a checkpoint's manifest, the
// strata.model_spec metadata of a file Strata wrote, or, for a GPT-2 file of Hugging Face names
// without it (GPT2LMHeadModel or GPT2Model, as on the hub), the dimensions its tensors have
// (layers, width, positions, vocabulary; 64-wide heads, as every GPT-2 size has).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>

#include "engine/allocator.h"
#include "graph/checkpoint.h"
#include "graph/model.h"
#include "graph/param_store.h"
#include "io/proto/strata.pb.h"

namespace strata::tools {

struct ModelSource {
  std::string model;  // "" = from the weights
  std::string size;
  std::string model_spec;
  std::string input_shape;  // "C,H,W" of image models; "" = 3,224,224
  int64_t num_classes = 0;  // 0 = 1000 for image models, the size's vocabulary for text models
  uint64_t seed = 0;        // initialization (every value the weights do not set)
  std::string weights;      // "" = the seed's initialization
  std::string weights_format = "auto";  // hf, strata, auto
  bool ignore_extra = false;
  std::string weights_flag = "--weights";  // how the flag is called, for messages
  std::string command = "strata";          // "strata generate", for messages
};

struct LoadedModel {
  proto::ModelSpec spec;
  std::unique_ptr<graph::Model> model;       // declared before the store, which it outlives
  std::unique_ptr<graph::ParamStore> store;  // every layer, on `allocator`
  std::string source;  // "checkpoint DIR (step N, ...)", "FILE (hf names, ...)"
  std::optional<graph::CheckpointRef> checkpoint;
  proto::CheckpointManifest manifest;  // of the checkpoint, when the weights are one
};

// Adds --model, --size, --model-spec, --weights, --input-format and --ignore-extra to `cmd`.
void add_model_source_flags(CLI::App* cmd, ModelSource& source, const std::string& weights_help);

// Builds the model and fills a store of every layer on `allocator`: the seed's initialization,
// then the weights. `sample_shape`, when given, replaces the sample shape (T,) of a token model's
// spec (a GPT-2 trained on T tokens, evaluated on samples of another length).
LoadedModel load_model_source(const ModelSource& source, Allocator& allocator,
                              const Shape& sample_shape = {});

}  // namespace strata::tools
