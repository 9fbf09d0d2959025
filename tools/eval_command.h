// `strata eval`: a model's loss, accuracy (top-1, top-5) and, for text, perplexity on a split of a
// dataset, from --weights (a safetensors file or a training checkpoint of any layout), printed as
// one line and written to --metrics as a JSON object.
//
//   strata eval --weights runs/r1 --dataset brown --seq-len 64
//   strata eval --model resnet --size 18 --weights r18.safetensors --dataset cifar10 --split test
//
// The numbers are those `strata train` logs for an evaluation at the checkpoint's step ("eval
// test | step N | loss ..."): the same test samples in the same batches (--batch-size 0 takes
// train's evaluation batch), the loss a mean over every counted target.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "tools/weights_source.h"

namespace strata::tools {

struct EvalOptions {
  ModelSource source;
  std::string dataset = "fashion-mnist";
  std::string data_dir;
  std::string split = "test";
  int64_t seq_len = 128;
  std::string text_task = "auto";
  std::string vocab_dir;
  int64_t image_size = 0;
  int64_t synthetic_channels = 3;
  int64_t synthetic_classes = 10;
  int64_t samples = 0;     // the first N samples of the split (0 = all)
  int64_t batch_size = 0;  // 0: train's evaluation batch (500 for images, 64 for text)
  double label_smoothing = 0.0;
  uint64_t data_seed = 0;
  std::string device = "auto";
  int threads = 0;
  int workers = 2;
  std::string metrics;
};

CLI::App* add_eval_command(CLI::App& app, EvalOptions& options);
int run_eval(const EvalOptions& options);

}  // namespace strata::tools
