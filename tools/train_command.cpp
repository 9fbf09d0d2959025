// `strata train`: turns flags into a model, datasets, an execution context and a Trainer, prints
// the resolved configuration, and reports progress, evaluations and a final summary.
#include "tools/train_command.h"

#include <unistd.h>

#include <cstdio>
#include <memory>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/exec_context.h"
#include "graph/param_store.h"
#include "io/datasets.h"
#include "io/metrics.h"
#include "models/registry.h"
#include "ops/lr_schedule.h"
#include "parallel/trainer.h"
#include "tools/common.h"
#include "tools/progress.h"

namespace strata::tools {

CLI::App* add_train_command(CLI::App& app, TrainOptions& o) {
  CLI::App* cmd = app.add_subcommand("train", "Train a model on a dataset");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--model", o.model, "Built-in model: " + models::model_names());
  cmd->add_option("--size", o.size, "Model size (tiny, small, ...; empty = the model's default)");
  cmd->add_option("--model-spec", o.model_spec,
                  "Define the model in a ModelSpec .prototxt file instead of --model");
  cmd->add_option("--dataset", o.dataset, "Dataset: " + io::dataset_names());
  cmd->add_option("--data-dir", o.data_dir,
                  "Directory holding the dataset's files (empty = the dataset's default)");
  cmd->add_option("--epochs", o.epochs, "Passes over the training set");
  cmd->add_option("--steps", o.steps, "Stop after this many optimizer steps (0 = use --epochs)");
  cmd->add_option("--batch-size", o.batch_size,
                  "Global batch size (split across data-parallel groups and micro-batches)");
  cmd->add_option("--lr", o.lr, "Peak learning rate");
  cmd->add_option("--optimizer", o.optimizer, "Optimizer: sgd, adamw");
  cmd->add_option("--momentum", o.momentum, "SGD momentum");
  cmd->add_flag("--nesterov", o.nesterov, "SGD with Nesterov momentum");
  cmd->add_option("--weight-decay", o.weight_decay,
                  "Weight decay (decoupled for adamw, L2 for sgd); not applied to biases and "
                  "normalization parameters");
  cmd->add_option("--lr-schedule", o.lr_schedule, "Learning-rate schedule: constant, step, cosine");
  cmd->add_option("--warmup-steps", o.warmup_steps, "Linear warm-up steps");
  cmd->add_option("--min-lr", o.min_lr, "Final learning rate of the cosine schedule");
  cmd->add_option("--lr-step-size", o.lr_step_size, "Steps between decays (step schedule)");
  cmd->add_option("--lr-gamma", o.lr_gamma, "Decay factor (step schedule)");
  cmd->add_option("--clip-grad-norm", o.clip_grad_norm, "Clip the global gradient norm (0 = off)");
  cmd->add_option("--label-smoothing", o.label_smoothing, "Label smoothing of the cross-entropy");
  cmd->add_option("--seed", o.seed, "Seed of initialization, shuffling and dropout");
  cmd->add_option("--device", o.device, "cpu, cuda:N, or auto");
  cmd->add_option("--threads", o.threads, "CPU threads for ops (0 = all cores)");
  cmd->add_option("--mem-limit", o.mem_limit,
                  "Cap on the memory the run may allocate on its device, e.g. 2GiB (empty = none)");
  cmd->add_option("--metrics", o.metrics, "Write metrics as JSON Lines to this file");
  cmd->add_option("--log-every", o.log_every, "Steps between log lines and metrics records");
  cmd->add_option("--eval-every", o.eval_every,
                  "Steps between evaluations on the test split (0 = after each epoch)");
  cmd->add_option("--workers", o.workers, "Data-loader threads (0 = load on the training thread)");
  cmd->add_option("--train-samples", o.train_samples,
                  "Train on the first N samples only (0 = all)");
  cmd->add_option("--test-samples", o.test_samples,
                  "Evaluate on the first N test samples only (0 = all)");
  cmd->add_option("--image-size", o.image_size,
                  "Side of the square samples: image-folder (0 = 224: resize the shorter side to "
                  "8/7 of it, center crop; random resized crops in training) and synthetic-images "
                  "(0 = 32); other datasets have a fixed size");
  cmd->add_flag("--augment{true},--no-augment{false}", o.augment,
                "Random crops and horizontal flips of the training images, on by default "
                "(cifar10, image-folder; never on the test split)");
  cmd->add_flag("--skip-bad-samples", o.skip_bad_samples,
                "image-folder: replace an unreadable image by the next readable one (logged, "
                "counted) instead of stopping");
  cmd->add_option("--synthetic-channels", o.synthetic_channels,
                  "synthetic-images: channels of the samples");
  cmd->add_option("--synthetic-classes", o.synthetic_classes,
                  "synthetic-images: number of classes");
  cmd->add_option("--progress", o.progress,
                  "Live progress line: auto (when stdout is a terminal), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  return cmd;
}

int run_train(const TrainOptions& o) {
  const Device device = resolve_device(o.device);
  CpuAllocator allocator;  // everything the run allocates, so --mem-limit covers all of it
  if (!o.mem_limit.empty()) allocator.set_limit(parse_bytes(o.mem_limit));
  ExecContext ctx(device, &allocator, o.threads);

  // Data.
  io::DatasetOptions data_options;
  data_options.image_size = o.image_size;
  data_options.augment = o.augment;
  data_options.skip_bad_samples = o.skip_bad_samples;
  data_options.seed = o.seed;
  data_options.channels = o.synthetic_channels;
  data_options.num_classes = o.synthetic_classes;
  std::shared_ptr<const io::Dataset> train =
      io::open_dataset(o.dataset, o.data_dir, "train", data_options);
  std::shared_ptr<const io::Dataset> test =
      io::open_dataset(o.dataset, o.data_dir, "test", data_options);
  STRATA_CHECK_GE(o.train_samples, 0) << "--train-samples must be >= 0";
  STRATA_CHECK_GE(o.test_samples, 0) << "--test-samples must be >= 0";
  if (o.train_samples > 0 && o.train_samples < train->size()) {
    train = io::make_subset(train, 0, o.train_samples);
  }
  if (o.test_samples > 0 && o.test_samples < test->size()) {
    test = io::make_subset(test, 0, o.test_samples);
  }

  // Model.
  std::unique_ptr<graph::Model> model = build_cli_model(o.model, o.size, o.model_spec, *train);
  graph::ParamStore store(*model, 0, model->size(), ctx.allocator());
  store.initialize(o.seed);

  // Optimization.
  parallel::TrainConfig config;
  config.epochs = o.epochs;
  config.steps = o.steps;
  config.batch_size = o.batch_size;
  config.seed = o.seed;
  config.log_every = o.log_every;
  config.eval_every = o.eval_every;
  config.num_workers = o.workers;
  config.loss.label_smoothing = o.label_smoothing;
  graph::OptimizerConfig& opt = config.optimizer;
  opt.kind = graph::parse_optimizer(o.optimizer);
  opt.weight_decay = o.weight_decay;
  opt.momentum = o.momentum;
  opt.nesterov = o.nesterov;
  opt.clip_grad_norm = o.clip_grad_norm;
  opt.schedule.kind = ops::parse_lr_schedule(o.lr_schedule);
  opt.schedule.base_lr = o.lr;
  opt.schedule.warmup_steps = o.warmup_steps;
  opt.schedule.min_lr = o.min_lr;
  opt.schedule.step_size = o.lr_step_size;
  opt.schedule.gamma = o.lr_gamma;
  const int64_t total = parallel::total_steps(config, train->size());
  opt.schedule.total_steps = total;

  // The resolved configuration.
  std::printf("strata train\n");
  print_table({{"model", model->name() + (o.model_spec.empty() ? "" : " (" + o.model_spec + ")")},
               {"parameters", std::to_string(store.num_params())},
               {"dataset", train->name() + " (" + std::to_string(train->size()) + ") / " +
                               test->name() + " (" + std::to_string(test->size()) + ")"},
               {"input", shape_str(train->input_spec().shape) + " " +
                             dtype_name(train->input_spec().dtype) + ", " +
                             std::to_string(train->num_classes()) + " classes"},
               {"augmentation", io::describe_augmentation(o.dataset, data_options)},
               {"device", device.str() + ", " + describe_threads(ctx)},
               {"layout", "single process (G=1 group x S=1 stage)"},
               {"epochs", o.steps > 0 ? "-" : std::to_string(o.epochs)},
               {"steps", std::to_string(total)},
               {"batch size", std::to_string(o.batch_size)},
               {"optimizer", o.optimizer + ", lr " + format_number(o.lr) + ", weight decay " +
                                 format_number(o.weight_decay) +
                                 (opt.kind == graph::OptimizerKind::kSgd
                                      ? ", momentum " + format_number(o.momentum) +
                                            (o.nesterov ? " (nesterov)" : "")
                                      : "")},
               {"lr schedule",
                o.lr_schedule + ", warm-up " + std::to_string(o.warmup_steps) +
                    (o.lr_schedule == "cosine" ? ", min lr " + format_number(o.min_lr) : "")},
               {"clip grad norm", o.clip_grad_norm > 0 ? format_number(o.clip_grad_norm) : "off"},
               {"label smoothing", format_number(o.label_smoothing)},
               {"seed", std::to_string(o.seed)},
               {"memory limit", o.mem_limit.empty() ? "none" : o.mem_limit},
               {"metrics", o.metrics.empty() ? "off" : o.metrics},
               {"data workers", std::to_string(o.workers)}});
  std::printf("\n%s\n", model->summary().c_str());
  std::fflush(stdout);

  io::JsonlWriter metrics(o.metrics);
  const bool live = o.progress == "on" || (o.progress == "auto" && isatty(fileno(stdout)));
  ConsoleReporter reporter(stdout, &metrics, o.steps > 0 ? 0 : o.epochs, live);
  parallel::Trainer trainer(ctx, *model, store, train, test, config, &reporter);
  const parallel::TrainSummary summary = trainer.run();

  const MemoryStats mem = allocator.stats();
  std::printf("done: %lld steps in %s (training %s, %.0f samples/s); peak memory %s",
              static_cast<long long>(summary.steps), format_duration(summary.wall_seconds).c_str(),
              format_duration(summary.train_seconds).c_str(),
              summary.train_seconds > 0
                  ? static_cast<double>(summary.samples) / summary.train_seconds
                  : 0.0,
              format_bytes(mem.peak).c_str());
  if (summary.last_eval) {
    std::printf("; test accuracy %.2f%% (top-5 %.2f%%)", 100.0 * summary.last_eval->accuracy,
                100.0 * summary.last_eval->top5);
  }
  std::printf("\n");
  const int64_t skipped_train = train->skipped_samples();
  const int64_t skipped_test = test->skipped_samples();
  if (skipped_train + skipped_test > 0) {
    std::printf("skipped %lld unreadable samples (train %lld, test %lld): see the warnings above\n",
                static_cast<long long>(skipped_train + skipped_test),
                static_cast<long long>(skipped_train), static_cast<long long>(skipped_test));
  }
  return 0;
}

}  // namespace strata::tools
