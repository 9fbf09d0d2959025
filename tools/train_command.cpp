// `strata train`: turns flags into a model, datasets, a layout of ranks and a Trainer per rank,
// prints the resolved configuration on rank 0, and reports progress, evaluations, per-stage
// utilization and a final summary.
//
// Ranks come from the launcher: under mpirun/srun every process is a rank of an MPI world; with
// --local the G x S ranks are threads of this process; otherwise the process is the only rank.
// Everything every rank must agree on (the partition) is decided once: by rank 0 and broadcast
// under MPI, before the threads start with --local.
#include "tools/train_command.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/cuda_runtime.h"
#include "engine/exec_context.h"
#include "engine/log.h"
#include "graph/model_spec.h"
#include "io/datasets.h"
#include "io/metrics.h"
#include "models/registry.h"
#include "ops/cpu_runtime.h"
#include "ops/dispatch.h"
#include "ops/lr_schedule.h"
#include "parallel/checkpointing.h"
#include "parallel/comm/local_comm.h"
#include "parallel/partition/partition.h"
#include "parallel/runtime/injector.h"
#include "parallel/sdpipe/sync_config.h"
#include "parallel/topology.h"
#include "parallel/trainer.h"
#include "tools/common.h"
#include "tools/progress.h"
#include "tools/text_commands.h"
#include "tools/train_array.h"
#include "tools/train_layout.h"
#include "tools/train_link.h"
#include "tools/train_reports.h"
#include "tools/train_signals.h"

#ifdef STRATA_WITH_MPI
#include "parallel/comm/mpi_comm.h"
#endif
#if defined(STRATA_WITH_NCCL) && defined(STRATA_WITH_MPI)
#include "parallel/comm/nccl_comm.h"
#endif

namespace strata::tools {

namespace {

// --loss-scale auto: dynamic under fp16 (whose gradients underflow without it), off otherwise.
std::string resolved_loss_scale(const TrainOptions& o) {
  if (o.loss_scale != "auto") return o.loss_scale;
  return o.precision == "fp16" ? "dynamic" : "off";
}

// The dtype the layers compute in for --precision (tf32 is f32 with TF32 products).
DType compute_dtype(const std::string& precision) {
  if (precision == "bf16") return DType::kBF16;
  if (precision == "fp16") return DType::kF16;
  return DType::kF32;
}

// What every rank of this process shares: data, the model's spec, the layout.
struct Setup {
  std::shared_ptr<const io::Dataset> train, test;
  std::string dataset_line;  // for the configuration table
  std::string augmentation;
  proto::ModelSpec spec;
  std::vector<std::string> layer_names;
  std::string memory_line;  // the memory plan, for the configuration table
  // --memory-policy auto (rank 0): vPIPE's plan and predicted peak per stage, for --metrics.
  std::vector<parallel::StageMemoryPlanRecord> memory_records;
  std::string partition_note;  // --partitioner projection: what AMPA and its guard did
  int64_t num_params = 0;
  parallel::TrainConfig config;
  parallel::PipelineConfig pipeline;
  int64_t total_steps = 0;
  TrainReportsConfig reports;  // --tensorboard, --sample-every
  parallel::sdpipe::SyncConfig sync;
};

std::vector<std::pair<size_t, size_t>> to_ranges(const parallel::Partition& partition) {
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const parallel::LayerRange& r : partition) ranges.push_back({r.begin, r.end});
  return ranges;
}

// The partition and the memory plan, decided once (see tools/train_layout.h); the line that
// describes the memory plan goes into the configuration.
// Under --memory-policy auto the layout stays for the run: its planner plans every partition the
// layers move to, from the costs and bandwidth measured here (rank 0's: parallel/memory_replan.h).
void decide_layout(const TrainOptions& o, Setup* setup) {
  const std::shared_ptr<graph::Model> model = graph::build_model(setup->spec);
  const auto layout = std::make_shared<TrainLayout>(o, setup->train, setup->pipeline, *model);
  const parallel::Partition partition = layout->partition();
  setup->pipeline.partition = to_ranges(partition);
  setup->partition_note = layout->partition_note();
  setup->pipeline.memory_plan = layout->memory_plan(partition);
  layout->check_migrations(setup->pipeline.migrations);
  if (setup->pipeline.replan_memory) {
    setup->pipeline.memory_planner = [model, layout](const parallel::Partition& p) {
      return layout->plan_partition(p);
    };
  }
  setup->memory_line = describe_memory(o, setup->pipeline, setup->layer_names, layout->auto_plan());
  if (layout->auto_plan()) {
    setup->memory_records = parallel::memory_plan_records(
        setup->pipeline.memory_plan, layout->auto_plan()->stages, partition, setup->layer_names);
  }
  if (layout->swap_bandwidth() > 0) {
    setup->memory_line += "; host-device copies measured at " +
                          format_number(layout->swap_bandwidth() / 1e9) + " GB/s";
  }
}

// `launcher`: how the ranks run and talk; `devices`: the device, or every rank's.
void print_configuration(const TrainOptions& o, const Setup& s, int world,
                         const std::string& launcher, const std::string& devices) {
  const parallel::PipelineConfig& p = s.pipeline;
  std::printf("strata train\n");
  std::string partition;
  for (size_t i = 0; i < p.partition.size(); ++i) {
    partition += (i ? ", " : "") + std::string("stage ") + std::to_string(i) + ": " +
                 s.layer_names[p.partition[i].first] + ".." +
                 s.layer_names[p.partition[i].second - 1];
  }
  const graph::OptimizerConfig& opt = s.config.optimizer;
  // --partition auto names its partitioner; G > 1 says how gradients cross the groups.
  const std::string how =
      o.partition != "auto"
          ? o.partition
          : "auto, " + o.partitioner + (s.partition_note.empty() ? "" : ": " + s.partition_note);
  const std::string grad_sync =
      p.groups == 1 ? "none (one group)"
      : s.sync.kind != parallel::sdpipe::SyncKind::kAllReduce
          ? parallel::sdpipe::describe_sync(s.sync, p.groups)
          : "all-reduce over " + std::to_string(p.groups) + " groups, overlap " + o.dp_overlap +
                ", buckets " +
                (o.dp_bucket_mb > 0 ? format_number(o.dp_bucket_mb) + " MiB" : "per stage") +
                ", delay " + std::to_string(o.dp_delay);
  print_table(
      {{"model", s.spec.name() + (o.model_spec.empty() ? "" : " (" + o.model_spec + ")")},
       {"parameters", std::to_string(s.num_params)},
       {"dataset", s.dataset_line},
       {"input", shape_str(s.train->input_spec().shape) + " " +
                     dtype_name(s.train->input_spec().dtype) + ", " +
                     std::to_string(s.train->num_classes()) + " classes"},
       {"augmentation", s.augmentation},
       {"precision", o.precision + (compute_dtype(o.precision) != DType::kF32
                                        ? std::string(devices.find("cuda") == std::string::npos
                                                          ? " mixed, emulated on cpu (f32 "
                                                            "math on 16-bit values)"
                                                          : " mixed (f32 master weights)")
                                        : std::string())},
       {"device",
        devices + ", " + (o.threads > 0 ? std::to_string(o.threads) : "all") + " CPU threads"},
       {"system", describe_system(o)},
       {"cpu runtime", ops::cpu_runtime::describe()},
       {"layout", "G=" + std::to_string(p.groups) + " group" + (p.groups == 1 ? "" : "s") +
                      " x S=" + std::to_string(p.stages) + " stage" + (p.stages == 1 ? "" : "s") +
                      " (" + std::to_string(world) + " rank" + (world == 1 ? "" : "s") + ", " +
                      launcher + ")"},
       {"schedule", std::string(parallel::schedule_name(p.schedule)) + ", " +
                        std::to_string(p.micro_batches) + " micro-batch" +
                        (p.micro_batches == 1 ? "" : "es") + " of " +
                        std::to_string(o.batch_size / p.groups / p.micro_batches)},
       {"partition", p.stages == 1 ? "all layers" : partition + " (" + how + ")"},
       {"gradient sync", grad_sync},
       {"inject", o.inject.empty() ? "none" : o.inject},
       {"memory", s.memory_line},
       {"migrations", p.migrations.empty()
                          ? "none"
                          : describe_migrations(p.migrations, s.layer_names, o.migration)},
       {"repartition", describe_repartition(o)},
       {"epochs", o.steps > 0 ? "-" : std::to_string(o.epochs)},
       {"steps", std::to_string(s.total_steps)},
       {"batch size", std::to_string(o.batch_size)},
       {"optimizer",
        o.optimizer + ", lr " + format_number(o.lr) + ", weight decay " +
            format_number(o.weight_decay) +
            (opt.kind == graph::OptimizerKind::kSgd
                 ? ", momentum " + format_number(o.momentum) + (o.nesterov ? " (nesterov)" : "")
                 : "")},
       {"lr schedule",
        o.lr_schedule + ", warm-up " + std::to_string(o.warmup_steps) +
            (o.lr_schedule == "cosine" ? ", min lr " + format_number(o.min_lr) : "")},
       {"clip grad norm", o.clip_grad_norm > 0 ? format_number(o.clip_grad_norm) : "off"},
       {"label smoothing", format_number(o.label_smoothing)},
       {"seed", std::to_string(o.seed)},
       {"initial weights", o.init_weights.empty() ? "from the seed" : o.init_weights},
       {"memory limit", o.mem_limit.empty() ? "none" : o.mem_limit + " per rank"},
       {"comm timeout", format_number(o.comm_timeout) + " s"},
       {"metrics", o.metrics.empty() ? "off" : o.metrics},
       {"final weights", o.save_weights.empty() ? "not saved" : o.save_weights},
       {"tensorboard", o.tensorboard.empty() ? "off" : o.tensorboard},
       {"samples", o.sample_every > 0 ? std::to_string(o.sample_tokens) + " tokens every " +
                                            std::to_string(o.sample_every) + " steps"
                                      : "off"},
       {"trace", o.trace.empty() ? "off" : o.trace},
       {"checkpoints",
        o.checkpoint_dir.empty()
            ? "off"
            : o.checkpoint_dir + ", " +
                  (o.save_every > 0 ? "every " + std::to_string(o.save_every) + " steps"
                                    : "at the end") +
                  (o.keep_last > 0 ? ", keep " + std::to_string(o.keep_last) : "") +
                  "; SIGTERM/SIGINT/SIGUSR1 save and stop, SIGHUP/SIGUSR2 save"},
       {"resume", o.resume.empty() ? "no" : o.resume},
       {"nan policy", o.nan_policy},
       {"loss scale",
        resolved_loss_scale(o) == "dynamic"
            ? "dynamic, doubled after " + std::to_string(o.loss_scale_window) + " good steps"
            : resolved_loss_scale(o)},
       {"data workers", std::to_string(o.workers)}});
  std::fflush(stdout);
}

// One rank: its context, trainer and (on rank 0) the reports.
void run_rank(const TrainOptions& o, const Setup& setup, parallel::Communicator* world, int threads,
              const Device& device) {
  const int rank = world != nullptr ? world->rank() : 0;
  std::unique_ptr<LinkSession> link = LinkSession::start(o, world);  // --link-mbps
  if (link != nullptr) world = link->world();
  // Everything this rank allocates on its device comes from one allocator, so --mem-limit covers
  // all of it: a CPU allocator of its own, or the CUDA context's caching allocator.
  CpuAllocator cpu_allocator;
  ExecContext ctx(device, device.is_cpu() ? &cpu_allocator : nullptr, threads);
  if (ctx.cuda() != nullptr) cuda::set_tf32(ctx.cuda(), o.precision == "tf32");
  Allocator& allocator = ctx.allocator();
  if (!o.mem_limit.empty()) allocator.set_limit(parse_bytes(o.mem_limit));
  std::unique_ptr<io::JsonlWriter> metrics;
  std::unique_ptr<ConsoleReporter> reporter;
  if (rank == 0) {
    metrics = for_flag("--metrics", [&] { return std::make_unique<io::JsonlWriter>(o.metrics); });
    // vPIPE's plan, so that its predictions can be set beside the stage records at the end.
    write_memory_plan(metrics.get(), 0, setup.memory_records);
    const bool live = o.progress == "on" || (o.progress == "auto" && isatty(fileno(stdout)));
    reporter =
        std::make_unique<ConsoleReporter>(stdout, metrics.get(), o.steps > 0 ? 0 : o.epochs, live);
  }
  if (!o.array.empty()) {  // a job-array of sibling jobs (tools/train_array.h)
    run_array_rank(o, setup.spec, setup.train, setup.test, setup.config, setup.pipeline, world, ctx,
                   metrics.get());
    return;
  }
  // --tensorboard, --sample-every: every rank reports (collective; before the Trainer).
  std::unique_ptr<TrainReports> reports;
  if (!o.tensorboard.empty() || o.sample_every > 0) {
    reports = std::make_unique<TrainReports>(setup.reports, reporter.get(), metrics.get(), world,
                                             setup.pipeline.stages);
  }
  parallel::TrainObserver* observer =
      reports != nullptr ? static_cast<parallel::TrainObserver*>(reports.get()) : reporter.get();
  if (link != nullptr) observer = link->observe(observer);
  parallel::Trainer trainer(ctx, setup.spec, setup.train, setup.test, setup.config, setup.pipeline,
                            world, observer);
  if (reports != nullptr) {
    const auto [begin, end] = setup.pipeline.partition[trainer.stage()];
    reports->attach(ctx, trainer.model(), trainer.store(), begin, end);
  }
  if (link != nullptr) link->mark();
  const parallel::TrainSummary summary = trainer.run();
  if (link != nullptr) link->report(metrics.get());
  if (rank != 0) return;
  print_stages(summary, setup.layer_names, setup.pipeline, metrics.get());
  const MemoryStats mem = allocator.stats();
  if (summary.stopped) {
    std::printf("stopped at step %lld of %lld on request%s\n",
                static_cast<long long>(summary.steps), static_cast<long long>(setup.total_steps),
                summary.last_checkpoint.empty()
                    ? ""
                    : ("; checkpoint " + summary.last_checkpoint +
                       " (continue with --resume auto --checkpoint-dir " + o.checkpoint_dir + ")")
                          .c_str());
  }
  if (summary.skipped_steps > 0) {
    std::printf("skipped %lld steps with a non-finite loss or gradient",
                static_cast<long long>(summary.skipped_steps));
    if (summary.overflow_steps > 0) {
      std::printf(" (%lld of them loss-scale overflows)",
                  static_cast<long long>(summary.overflow_steps));
    }
    std::printf("\n");
  }
  if (summary.loss_scale > 0) std::printf("loss scale at the end: %g\n", summary.loss_scale);
  std::string resumed;
  if (summary.first_step > 0) {
    resumed = " (resumed at step " + std::to_string(summary.first_step) + " from " +
              summary.resumed_from + ")";
  }
  // The highest peak of any rank (rank 0 holds every rank's report), and which rank it was.
  size_t peak_bytes = mem.peak;
  int peak_rank = 0;
  for (const auto& r : summary.stages) {
    if (r.peak_bytes > peak_bytes)
      peak_bytes = static_cast<size_t>(r.peak_bytes), peak_rank = r.rank;
  }
  std::printf(
      "done: %lld steps%s in %s (training %s, %.0f samples/s); peak memory %s%s",
      static_cast<long long>(summary.steps), resumed.c_str(),
      format_duration(summary.wall_seconds).c_str(), format_duration(summary.train_seconds).c_str(),
      summary.train_seconds > 0 ? static_cast<double>(summary.samples) / summary.train_seconds
                                : 0.0,
      format_bytes(peak_bytes).c_str(),
      setup.pipeline.stages * setup.pipeline.groups > 1
          ? (" (rank " + std::to_string(peak_rank) + ")").c_str()
          : "");
  if (summary.last_eval) {
    std::printf("; test accuracy %.2f%% (top-5 %.2f%%)", 100.0 * summary.last_eval->accuracy,
                100.0 * summary.last_eval->top5);
  }
  if (!o.trace.empty()) std::printf("; trace %s", o.trace.c_str());
  std::printf("\n");
  if (summary.sync) {
    const parallel::SyncStats& y = *summary.sync;
    std::printf(
        "sync %s: %lld group syncs, mean group %.2f replicas, %lld enforcement waits, %lld "
        "skipped validations, %lld staleness waits\n",
        o.sync.c_str(), static_cast<long long>(y.groups), y.mean_group(),
        static_cast<long long>(y.enforcement_waits), static_cast<long long>(y.skipped_validations),
        static_cast<long long>(y.staleness_waits));
    if (metrics != nullptr) {
      metrics->write({{"type", "sync"},
                      {"sync", o.sync},
                      {"groups", y.groups},
                      {"mean_group", y.mean_group()},
                      {"enforcement_waits", y.enforcement_waits},
                      {"skipped_validations", y.skipped_validations},
                      {"staleness_waits", y.staleness_waits}});
    }
  }
  for (const parallel::StageReport& r : summary.stages) {  // --inject, per rank that it slowed
    if (r.injected_seconds <= 0 && r.load_seconds <= 0) continue;
    std::printf("--inject: rank %d slept %.3f s (slow %.3f, grow %.3f), load threads ran %.3f s\n",
                r.rank, r.injected_seconds, r.slow_seconds, r.grow_seconds, r.load_seconds);
  }
  const int64_t skipped_train = setup.train->skipped_samples();
  const int64_t skipped_test = setup.test->skipped_samples();
  if (skipped_train + skipped_test > 0) {
    std::printf("skipped %lld unreadable samples (train %lld, test %lld): see the warnings above\n",
                static_cast<long long>(skipped_train + skipped_test),
                static_cast<long long>(skipped_train), static_cast<long long>(skipped_test));
  }
  std::fflush(stdout);
}

Setup make_setup(const TrainOptions& o, int world_size) {
  check_train_flags(o);
  Setup s;
  io::DatasetOptions data_options;
  data_options.seq_len = o.seq_len;
  data_options.task = text_task_for_model(o.model, o.text_task);
  data_options.seed = o.seed;
  data_options.vocab_dir = o.vocab_dir;
  data_options.image_size = o.image_size;
  data_options.augment = o.augment;
  data_options.skip_bad_samples = o.skip_bad_samples;
  data_options.channels = o.synthetic_channels;
  data_options.num_classes = o.synthetic_classes;
  data_options.vocab_size = o.synthetic_vocab;
  s.train = io::open_dataset(o.dataset, o.data_dir, "train", data_options);
  s.test = io::open_dataset(o.dataset, o.data_dir, "test", data_options);
  s.dataset_line = s.train->name() + " (" + std::to_string(s.train->size()) + ") / " +
                   s.test->name() + " (" + std::to_string(s.test->size()) + ")";
  s.augmentation = io::describe_augmentation(o.dataset, data_options);
  if (io::dataset_info(o.dataset).text) {
    s.dataset_line += std::string("; ") + io::text_task_name(data_options.task) + ", " +
                      std::to_string(o.seq_len) + " tokens per sample, vocabulary " +
                      std::to_string(s.train->num_classes());
  }
  STRATA_CHECK_GE(o.train_samples, 0) << "--train-samples must be >= 0";
  STRATA_CHECK_GE(o.test_samples, 0) << "--test-samples must be >= 0";
  if (o.train_samples > 0 && o.train_samples < s.train->size()) {
    s.train = io::make_subset(s.train, 0, o.train_samples);
  }
  if (o.test_samples > 0 && o.test_samples < s.test->size()) {
    s.test = io::make_subset(s.test, 0, o.test_samples);
  }
  std::unique_ptr<graph::Model> model = build_cli_model(o.model, o.size, o.model_spec, *s.train);
  s.spec = o.model_spec.empty() ? models::model_spec(o.model, o.size, s.train->input_spec().shape,
                                                     s.train->num_classes())
                                : graph::load_model_spec(o.model_spec);
  for (size_t i = 0; i < model->size(); ++i) s.layer_names.push_back(model->layer(i).name());
  for (size_t i = 0; i < model->size(); ++i) {
    for (const graph::ParamSpec& p : model->layer(i).param_specs()) {
      if (p.tied_to.empty()) s.num_params += graph::valid_numel(p);  // padding rows excluded
    }
  }

  parallel::PipelineConfig& p = s.pipeline;
  STRATA_CHECK_GE(o.stages, 1) << "--stages must be at least 1";
  STRATA_CHECK_GE(o.groups, 0) << "--groups must be >= 0";
  STRATA_CHECK(o.stages <= static_cast<int>(model->size()))
      << "--stages " << o.stages << " is more than the " << model->size() << " layers of model "
      << model->name();
  p.stages = o.stages;
  p.groups = o.groups > 0 ? o.groups : std::max(1, world_size / o.stages);
  STRATA_CHECK_EQ(p.groups * p.stages, world_size)
      << "the world has " << world_size << " rank" << (world_size == 1 ? "" : "s")
      << " but --groups " << p.groups << " x --stages " << p.stages << " needs "
      << p.groups * p.stages
      << (world_size == 1 ? " (launch with mpirun -np N, or add --local to run them as threads)"
                          : "");
  p.micro_batches = o.micro_batches;
  p.schedule = parallel::parse_schedule(o.schedule);
  p.trace_path = o.trace;
  STRATA_CHECK_GE(o.micro_batches, 1) << "--micro-batches must be at least 1";
  STRATA_CHECK(o.batch_size > 0 && o.batch_size % p.groups == 0)
      << "--batch-size " << o.batch_size << " is not divisible by the " << p.groups << " groups";
  STRATA_CHECK_EQ((o.batch_size / p.groups) % o.micro_batches, 0)
      << "--micro-batches " << o.micro_batches << " does not divide the batch of each group ("
      << o.batch_size << " / " << p.groups << " = " << o.batch_size / p.groups << ")";
  STRATA_CHECK(o.comm_timeout > 0) << "--comm-timeout must be positive";
  // The memory plan's flags, checked before anything runs (the plan itself: decide_layout).
  if (o.memory_policy != "auto") parallel::parse_memory_policy(o.memory_policy, "--memory-policy");
  parallel::parse_memory_plan(
      o.memory_plan, s.layer_names,
      parallel::MemoryPlan::uniform(s.layer_names.size(), parallel::MemoryPolicy::kKeep));
  p.replan_memory = o.memory_policy == "auto";  // the plan follows the layers (decide_layout)
  p.swap_pool_bytes = parse_bytes(o.swap_pool);
  p.weight_cache = o.weight_cache == "on";
  // --migrate-at STEP:PARTITION, checked before training (ranges as --partition writes them).
  p.migration = parallel::parse_migration_mode(o.migration);
  p.migration_chunk_bytes = static_cast<size_t>(o.migration_chunk_mb * (1 << 20));
  p.migration_window_bytes = static_cast<size_t>(o.migration_window_mb * (1 << 20));
  for (const std::string& spec : o.migrate_at) {
    const size_t colon = spec.find(':');
    STRATA_CHECK(colon != std::string::npos && colon > 0)
        << "--migrate-at '" << spec << "': expected STEP:PARTITION, e.g. 10:0-3,4-11";
    const std::string step = spec.substr(0, colon);
    STRATA_CHECK(step.find_first_not_of("0123456789") == std::string::npos && step.size() < 10)
        << "--migrate-at '" << spec << "': the step '" << step << "' is not a number";
    parallel::Migration m;
    m.step = std::stoll(step);
    STRATA_CHECK(o.stages > 1) << "--migrate-at moves layers between stages: it needs --stages > 1";
    m.partition =
        to_ranges(parallel::parse_partition(spec.substr(colon + 1), s.layer_names, o.stages));
    p.migrations.push_back(std::move(m));
  }
  STRATA_CHECK(p.swap_pool_bytes > 0) << "--swap-pool must be positive, got " << o.swap_pool;
  p.grad_sync.overlap = o.dp_overlap == "on";
  p.grad_sync.bucket_mb = o.dp_bucket_mb;
  p.grad_sync.delay = o.dp_delay;
  parallel::check_grad_sync(p.grad_sync);
  parallel::sdpipe::SyncConfig& sync = s.sync;
  sync.kind = parallel::sdpipe::parse_sync(o.sync);
  parallel::sdpipe::parse_sync_window(o.sync_window, &sync);
  sync.history = o.sync_history;
  sync.token = o.sync_token == "on";
  sync.async_query = o.sync_query == "async";
  sync.trace = o.sync_trace;
  sync.staleness = o.ssp_staleness;
  const bool local_updates = sync.kind != parallel::sdpipe::SyncKind::kAllReduce;
  STRATA_CHECK(!local_updates || p.groups > 1)
      << "--sync " << o.sync << " synchronizes the replicas of several data-parallel groups, but "
      << "there is one group (use --groups > 1)";
  STRATA_CHECK(o.sync_trace.empty() || sync.kind == parallel::sdpipe::SyncKind::kSdpipe)
      << "--sync-trace records the decisions of SDPipe's scheduler: it needs --sync sdpipe";
  STRATA_CHECK(!local_updates || p.migrations.empty())
      << "--migrate-at with --sync " << o.sync << ": moving layers while the replicas average "
      << "their weights is not supported (use --sync allreduce)";
  p.update_sync = parallel::sdpipe::make_update_sync_factory(sync);
  p.inject = parallel::parse_inject(o.inject);
  for (const parallel::InjectSpec& spec : p.inject) {
    if (spec.kind == "grow") parallel::inject_layer_range(spec, s.layer_names);
    STRATA_CHECK(spec.kind != "fail" || !o.local)
        << "--inject \"" << spec.text << "\": kind=fail needs MPI ranks (mpirun), not --local "
        << "(a stalled thread would outlive the run)";
  }
  p.repartition = {o.repartition,
                   o.repartition_every,
                   o.repartition_threshold,
                   o.slowdown_model,
                   o.slowdown_fallback,
                   o.repartition_top_k,
                   o.monitor_interval_ms >= 0 ? o.monitor_interval_ms
                   : o.repartition != "off"   ? 500.0
                                              : 0.0};
  STRATA_CHECK(o.dp_delay == 0 || p.groups > 1)
      << "--dp-delay " << o.dp_delay << " delays the all-reduce across data-parallel groups, "
      << "but there is one group (use --groups > 1)";
  STRATA_CHECK(o.dp_delay == 0 || parallel::is_synchronous(p.schedule))
      << "--dp-delay " << o.dp_delay << " needs a synchronous schedule (gpipe or 1f1b), not "
      << o.schedule;

  parallel::TrainConfig& config = s.config;
  config.epochs = o.epochs;
  config.steps = o.steps;
  config.batch_size = o.batch_size;
  config.seed = o.seed;
  config.init_weights = o.init_weights;
  config.log_every = o.log_every;
  config.eval_every = o.eval_every;
  config.num_workers = o.workers;
  STRATA_CHECK_GE(o.eval_batch_size, 0) << "--eval-batch-size must be >= 0";
  // Evaluation runs one micro-batch per evaluation batch; under --mem-limit the default is the
  // training micro-batch, which the memory plan was made for.
  config.eval_batch_size = o.eval_batch_size > 0              ? o.eval_batch_size
                           : !o.mem_limit.empty()             ? micro_batch_rows(o, p)
                           : io::dataset_info(o.dataset).text ? o.batch_size
                                                              : 500;
  config.loss.label_smoothing = o.label_smoothing;
  config.save_weights = o.save_weights;
  // A vocabulary padded inside the engine: the loss counts the real one (graph/transformer.h).
  config.loss.num_classes = model->loss_classes();
  config.checkpoint.dir = o.checkpoint_dir;
  config.checkpoint.save_every = o.save_every;
  config.checkpoint.keep_last = o.keep_last;
  config.checkpoint.resume = o.resume;
  config.nan_policy = parallel::parse_nan_policy(o.nan_policy);
  config.loss_scale = parallel::parse_loss_scale(resolved_loss_scale(o));
  config.compute_dtype = compute_dtype(o.precision);
  // fp16 scales its loss by default; say so when that is what stands in the way.
  STRATA_CHECK(o.loss_scale != "auto" || o.precision != "fp16" ||
               (parallel::is_synchronous(p.schedule) && o.dp_delay == 0))
      << "--precision fp16 scales the loss (--loss-scale auto is dynamic under fp16), which needs "
         "a synchronous schedule and no --dp-delay; use bf16, or --loss-scale off to run fp16 "
         "without scaling (small gradients may underflow to zero)";
  config.loss_scale.window = o.loss_scale_window;
  parallel::check_loss_scale(config.loss_scale);
  STRATA_CHECK(o.save_every >= 0 && o.keep_last >= 0)
      << "--save-every and --keep-last must be >= 0";
  STRATA_CHECK(o.save_every == 0 || !o.checkpoint_dir.empty())
      << "--save-every needs --checkpoint-dir";
  STRATA_CHECK(o.resume != "auto" || !o.checkpoint_dir.empty())
      << "--resume auto needs --checkpoint-dir (where to look, and to write)";
  STRATA_CHECK(o.checkpoint_dir.empty() || parallel::is_synchronous(p.schedule))
      << "checkpoints (--checkpoint-dir) need a schedule that flushes every step (gpipe, 1f1b), "
         "not "
      << o.schedule;
  graph::OptimizerConfig& opt = config.optimizer;
  opt.kind = graph::parse_optimizer(o.optimizer);
  opt.weight_decay = o.weight_decay;
  opt.momentum = o.momentum;
  opt.nesterov = o.nesterov;
  opt.clip_grad_norm = o.clip_grad_norm;
  // adamw-vr: the variance of a replica's own gradient, against the mean of G (1 when the
  // gradients are all-reduced already).
  opt.variance_scale = local_updates ? 1.0 / p.groups : 1.0;
  opt.schedule.kind = ops::parse_lr_schedule(o.lr_schedule);
  opt.schedule.base_lr = o.lr;
  opt.schedule.warmup_steps = o.warmup_steps;
  opt.schedule.min_lr = o.min_lr;
  opt.schedule.step_size = o.lr_step_size;
  opt.schedule.gamma = o.lr_gamma;
  s.total_steps = parallel::total_steps(config, p, s.train->size());
  for (const parallel::Migration& m : p.migrations) {
    STRATA_CHECK(m.step >= 1 && m.step < s.total_steps)
        << "--migrate-at " << m.step << ": the run has " << s.total_steps
        << " steps; a migration goes before one of steps 1.." << s.total_steps - 1;
  }
  opt.schedule.total_steps = s.total_steps;
  opt.schedule.lr_at(0);  // validates the schedule before any rank starts

  TrainReportsConfig& reports = s.reports;
  reports.tensorboard = o.tensorboard;
  reports.sample_every = o.sample_every;
  reports.sample_tokens = o.sample_tokens;
  reports.vocab_dir = o.vocab_dir;
  reports.log_every = o.log_every;
  reports.total_steps = s.total_steps;
  reports.text = io::dataset_info(o.dataset).text;
  reports.seed = o.seed;
  STRATA_CHECK(o.sample_every >= 0) << "--sample-every must be >= 0, got " << o.sample_every;
  if (o.sample_every > 0) {
    const bool gpt2 = s.spec.layer_size() > 0 && s.spec.layer(0).has_token_embedding();
    STRATA_CHECK(gpt2 && s.spec.num_classes() > 50256)
        << "--sample-every needs a GPT-2 over GPT-2's tokens (--model gpt2 with --dataset brown "
           "or tokens); model "
        << s.spec.name() << " "
        << (gpt2 ? "has a vocabulary of " + std::to_string(s.spec.num_classes()) + " tokens"
                 : "does not start with a token embedding");
    STRATA_CHECK(o.sample_tokens > 0) << "--sample-tokens must be > 0, got " << o.sample_tokens;
    reports.positions = s.spec.layer(0).token_embedding().max_positions();
  }
  return s;
}

std::chrono::milliseconds timeout_of(const TrainOptions& o) {
  return std::chrono::milliseconds(static_cast<int64_t>(o.comm_timeout * 1000.0));
}

#if defined(STRATA_WITH_NCCL) && defined(STRATA_WITH_MPI)
constexpr bool kHaveNccl = true;
#else
constexpr bool kHaveNccl = false;
#endif

#ifdef STRATA_WITH_MPI
// Where the MPI ranks run: this rank's device, every rank's (for the configuration) and what
// carries tensors between them. Collective over `world`.
struct MpiPlacement {
  Device device;
  std::string devices;  // "cpu", or per rank: "rank 0: cuda:0, rank 1: cuda:1"
  std::string comm;     // parallel::choose_comm: "nccl" or "mpi"
  std::string warning;  // rank 0's, when processes of its node share a GPU
};

MpiPlacement place_mpi_ranks(const TrainOptions& o, const parallel::ProcessInfo& process,
                             parallel::MpiCommunicator& world) {
  MpiPlacement placement;
  // The device from --device and this process's rank on its node: the launcher's, else MPI's.
  const parallel::NodeRanks node = world.node_ranks();
  const int local_rank = process.has_local_rank ? process.local_rank : node.rank;
  const int gpus =
      o.device == "auto" && !ops::has_kernels_for(DeviceType::kCUDA) ? 0 : cuda_device_count();
  const parallel::DeviceChoice choice =
      parallel::choose_device(o.device, world.size(), local_rank, node.size, gpus);
  placement.device = choice.device;
  placement.warning = choice.warning;
  // Every rank's device, and the GPU behind it (host name and UUID): NCCL cannot put two ranks on
  // one GPU.
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string gpu;
  if (choice.device.is_cuda()) {
    const std::string uuid = cuda::device_uuid(choice.device.index);
    gpu = std::string(host) + "/" + (uuid.empty() ? choice.device.str() : uuid);
  }
  const std::vector<std::string> all =
      parallel::all_gather_strings(&world, choice.device.str() + "\t" + gpu);
  std::vector<std::string> devices, gpus_used;
  bool all_cuda = true, shared = false;
  for (const std::string& a : all) {
    const size_t tab = a.find('\t');
    devices.push_back(a.substr(0, tab));
    const std::string g = a.substr(tab + 1);
    all_cuda = all_cuda && !g.empty();
    if (g.empty()) continue;
    shared = shared || std::find(gpus_used.begin(), gpus_used.end(), g) != gpus_used.end();
    gpus_used.push_back(g);
  }
  if (std::all_of(devices.begin(), devices.end(),
                  [&](const std::string& d) { return d == devices[0]; })) {
    placement.devices = devices[0];
  } else {
    for (size_t r = 0; r < devices.size() && r < 8; ++r) {
      placement.devices +=
          (r ? ", " : "") + std::string("rank ") + std::to_string(r) + ": " + devices[r];
    }
    if (devices.size() > 8) placement.devices += ", ...";
  }
  placement.comm = parallel::choose_comm(o.comm, world.size(), false, all_cuda, kHaveNccl, shared);
  return placement;
}

int run_mpi(const TrainOptions& o, const parallel::ProcessInfo& process) {
  parallel::MpiSession session;
  std::unique_ptr<parallel::MpiCommunicator> world = session.world();
  world->set_timeout(timeout_of(o));
  set_log_rank(world->rank());
  try {
    const MpiPlacement placement = place_mpi_ranks(o, process, *world);
    const Device device = placement.device;
    if (world->rank() == 0 && !placement.warning.empty()) {
      std::printf("%s\n", placement.warning.c_str());
    }
    Setup setup = make_setup(o, world->size());
    // Rank 0 decides the partition and the memory plan (profiling is timing: ranks would
    // disagree) and sends them: 2 bounds per stage, then a policy per layer.
    const int64_t S = setup.pipeline.stages;
    const int64_t L = static_cast<int64_t>(setup.layer_names.size());
    Tensor layout = Tensor::zeros({2 * S + L}, DType::kI64);
    int64_t* v = layout.data<int64_t>();
    if (world->rank() == 0) {
      decide_layout(o, &setup);
      for (int64_t i = 0; i < S; ++i) {
        v[2 * i] = static_cast<int64_t>(setup.pipeline.partition[i].first);
        v[2 * i + 1] = static_cast<int64_t>(setup.pipeline.partition[i].second);
      }
      for (int64_t l = 0; l < L; ++l) {
        v[2 * S + l] = static_cast<int64_t>(setup.pipeline.memory_plan.at(l));
      }
    }
    world->broadcast(layout, 0)->wait(world->timeout(),
                                      "the partition and memory plan from rank 0");
    if (world->rank() != 0) {
      for (int64_t i = 0; i < S; ++i) {
        setup.pipeline.partition.push_back(
            {static_cast<size_t>(v[2 * i]), static_cast<size_t>(v[2 * i + 1])});
      }
      setup.pipeline.memory_plan.layers.resize(static_cast<size_t>(L));
      for (int64_t l = 0; l < L; ++l) {
        setup.pipeline.memory_plan.layers[l] = static_cast<parallel::MemoryPolicy>(v[2 * S + l]);
      }
    }
    if (world->rank() == 0) {
      // The launcher, and what carries CUDA tensors when the ranks have any.
      const std::string launcher = placement.comm == "nccl" ? "mpi; CUDA tensors over nccl"
                                   : !device.is_cuda()      ? "mpi"
                                   : session.cuda_aware()   ? "mpi; CUDA-aware"
                                                          : "mpi; CUDA tensors staged through host";
      print_configuration(o, setup, world->size(), launcher, placement.devices);
    }
    parallel::RunControl control;
    if (!o.checkpoint_dir.empty()) setup.config.control = &control;
    SignalScope signals(setup.config.control);
    const int threads = o.threads;
    // --comm nccl: the ranks' communicator carries CUDA tensors over NCCL, host ones over MPI
    // (created before the rank's context: collective over every rank).
    std::unique_ptr<parallel::Communicator> nccl_world;
    parallel::Communicator* ranks = world.get();
#if defined(STRATA_WITH_NCCL) && defined(STRATA_WITH_MPI)
    if (placement.comm == "nccl") {
      std::unique_ptr<parallel::MpiCommunicator> host = session.world();
      host->set_timeout(timeout_of(o));
      nccl_world = std::make_unique<parallel::NcclMpiCommunicator>(std::move(host), device);
      ranks = nccl_world.get();
    }
#endif
    run_rank(o, setup, ranks, threads, device);
    nccl_world.reset();
    world->barrier("the end of training");
    return 0;
  } catch (const std::exception& e) {
    print_error(e);
    parallel::abort_world(1);
  }
}
#endif

}  // namespace

int run_train(const TrainOptions& o) {
  const parallel::ProcessInfo process = parallel::discover_process();
  // MPI processes choose their devices and communicator together (run_mpi).
  if (process.world_size > 1) {
#ifdef STRATA_WITH_MPI
    return run_mpi(o, process);
#else
    STRATA_THROW() << "launched as rank " << process.rank << " of " << process.world_size << " by "
                   << process.launcher
                   << ", but this build has no MPI support (configure with -DSTRATA_WITH_MPI=ON)";
#endif
  }
  // One process: the only rank, or local ranks (threads) sharing the one device given by
  // --device, their tensors crossing through host copies. --device auto keeps local ranks on the
  // CPU.
  const bool local_ranks = o.local && o.stages * std::max(1, o.groups) > 1;
  Device device = Device::cpu();
  if (o.device == "auto" && local_ranks) {
    if (cuda_device_count() > 0) {
      std::printf(
          "device auto: pipelines and data-parallel groups run on cpu (with --local, "
          "--device cuda:N runs every local rank on that GPU)\n");
    }
  } else {
    device = resolve_device(o.device);
  }
  parallel::choose_comm(o.comm, 1, local_ranks, device.is_cuda(), kHaveNccl, false);
  const int ranks = o.local ? std::max(1, o.groups) * o.stages : 1;
  Setup setup = make_setup(o, ranks);
  decide_layout(o, &setup);
  print_configuration(o, setup, ranks, o.local && ranks > 1 ? "local threads" : "single process",
                      device.str());
  parallel::RunControl control;
  if (!o.checkpoint_dir.empty()) setup.config.control = &control;
  SignalScope signals(setup.config.control);
  if (ranks == 1) {
    run_rank(o, setup, nullptr, o.threads, device);
    return 0;
  }
  // Threads share the cores: each rank gets an even share (at least one).
  const int cores =
      o.threads > 0 ? o.threads : static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  const int threads = std::max(1, cores / ranks);
  parallel::LocalWorld world(ranks);
  parallel::run_local_ranks(world, [&](parallel::LocalCommunicator& comm) {
    comm.set_timeout(timeout_of(o));
    set_log_stage(comm.rank() % setup.pipeline.stages);
    run_rank(o, setup, &comm, threads, device);
  });
  return 0;
}

}  // namespace strata::tools
