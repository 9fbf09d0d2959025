// `strata convert`: write a model's weights as safetensors, from the seed's initialization or from
// a weights file, under Hugging Face / torchvision names (hf) or Strata's own (strata).
//
//   strata convert --model gpt2 --size 124M [--seed S] --output model.safetensors
//   strata convert --model gpt2 --size 124M --weights hf.safetensors --output model.safetensors
//   strata convert --input model.safetensors --output other.safetensors --format strata
//
// The model comes from --model/--size (image models also take --input-shape and --num-classes)
// or --model-spec, or else from the strata.model_spec metadata of the input that Strata wrote.
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
};

CLI::App* add_convert_command(CLI::App& app, ConvertOptions& options);
int run_convert(const ConvertOptions& options);

}  // namespace strata::tools
