// The built-in models, selected by name and size (`--model gpt2 --size 124M`), or by their
// dimensions (`--layers 4 --width 256 ...`). Each is returned as a ModelSpec, the same data a
// .prototxt file holds, and built by graph::build_model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/tensor.h"
#include "io/proto/strata.pb.h"

namespace strata::models {

// Dimensions that override a named size (0: take the size's value).
struct ModelDims {
  int64_t layers = 0;      // transformer blocks
  int64_t width = 0;       // model width C
  int64_t heads = 0;       // attention heads
  int64_t seq_len = 0;     // maximum sequence length (positions)
  int64_t vocab_size = 0;  // vocabulary V
  // GPT-2 and BERT pad V inside the engine to a multiple of this (llm.c's Vp: 50257 -> 50304),
  // for the GPU's tiles; 1 turns the padding off. Files and losses keep V (graph/transformer.h).
  int64_t vocab_multiple = 128;
};

struct ModelRequest {
  std::string name;         // "cnn", "resnet", "gpt2", ...
  std::string size;         // "" = the model's default size
  Shape input_shape;        // one sample of the dataset: (C, H, W) images, (T,) or (3, T) tokens
  int64_t num_classes = 0;  // classes of an image dataset, or the vocabulary of a text one
  ModelDims dims;
};

struct ModelInfo {
  std::string name;
  std::vector<std::string> sizes;
  std::string default_size;
  std::string description;
};

// Every built-in model, in the order `--help` lists them.
const std::vector<ModelInfo>& model_catalog();
// "cnn, mlp, vgg, resnet, bert, gpt2"
std::string model_names();
const ModelInfo& model_info(const std::string& name);  // throws listing the valid names

// The spec of the requested model. Unknown names or sizes are errors listing the valid ones.
proto::ModelSpec model_spec(const ModelRequest& request);
// Shorthand for image classifiers.
proto::ModelSpec model_spec(const std::string& name, const std::string& size,
                            const Shape& input_shape, int64_t num_classes);

}  // namespace strata::models
