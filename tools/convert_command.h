// `strata convert`: write a model's weights as safetensors, from the seed's initialization or from
// a weights file, under Hugging Face / torchvision names (hf) or Strata's own (strata).
//
//   strata convert --model gpt2 --size 124M [--seed S] --output model.safetensors
//   strata convert --model gpt2 --size 124M --weights hf.safetensors --output model.safetensors
//   strata convert --input model.safetensors --output other.safetensors --format strata
//   strata convert --weights ckpt/step-000200 --output model.safetensors   (or --weights ckpt/)
//   strata convert --input model.safetensors --output-checkpoint ckpt2 [--optimizer sgd]
//
// The model comes from --model/--size (image models also take --input-shape and --num-classes)
// or --model-spec, or else from the strata.model_spec metadata of the input that Strata wrote (or
// the manifest of an input checkpoint). An input directory is a training checkpoint (a step-NNNNNN
// directory, or a --checkpoint-dir root: its newest complete one). --output-checkpoint writes a
// checkpoint of step 0 (zero optimizer state) that `strata train --resume` starts from.
// Reading checks the file against the model (models/weight_files.h).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace strata::tools {

struct ConvertOptions {
  std::string model;  // "" = from the input's metadata
  std::string size;
  std::string model_spec;
  std::string input_shape;  // "C,H,W" of image models; "" = 3,224,224
  int64_t num_classes = 0;  // 0 = 1000 for image models, the family's vocabulary for text models
  uint64_t seed = 0;
  std::string input;  // --input / --weights
  std::string input_format = "auto";
  bool ignore_extra = false;
  std::string output;
  std::string format = "hf";
  std::string output_checkpoint;    // a checkpoint root: writes DIR/step-000000
  std::string optimizer = "adamw";  // whose (zero) state slots --output-checkpoint holds
  double momentum = 0.9;
};

CLI::App* add_convert_command(CLI::App& app, ConvertOptions& options);
int run_convert(const ConvertOptions& options);

}  // namespace strata::tools
