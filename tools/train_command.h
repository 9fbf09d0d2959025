// `strata train`: flags, resolved configuration, and the run.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace strata::tools {

struct TrainOptions {
  // A published system's configuration (parallel/gropipe/preset.h): custom (none) or gropipe.
  // Applied when the flags are parsed: flags given on the command line win; the ones whose value
  // differs from the preset's are listed in system_overrides ("--dp-delay 1").
  std::string system = "custom";
  std::vector<std::string> system_overrides;
  std::string model = "cnn";
  std::string size;  // "" = the model's default
  std::string model_spec;
  std::string dataset = "fashion-mnist";
  std::string data_dir;            // "" = the dataset's default location
  int64_t seq_len = 128;           // text datasets: tokens per sample
  std::string text_task = "auto";  // text datasets: lm, mlm, or auto (from the model family)
  std::string vocab_dir;           // text datasets: GPT-2's vocabulary ("" = the default)
  int64_t epochs = 2;
  int64_t steps = 0;
  int64_t batch_size = 64;
  double lr = 2e-3;
  std::string optimizer = "adamw";
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0.0;
  std::string lr_schedule = "cosine";
  int64_t warmup_steps = 0;
  double min_lr = 0.0;
  int64_t lr_step_size = 1000;
  double lr_gamma = 0.1;
  double clip_grad_norm = 0.0;
  double label_smoothing = 0.0;
  uint64_t seed = 0;
  std::string init_weights;  // safetensors file to start from ("" = initialize from --seed)
  std::string device = "auto";
  std::string precision = "fp32";  // fp32 | tf32 | bf16 | fp16 (mixed precision)
  int threads = 0;
  std::string mem_limit;
  std::string metrics;
  std::string save_weights;  // final weights (safetensors); empty: none
  std::string tensorboard;   // TensorBoard event files in this directory ("" = none)
  int64_t sample_every = 0;  // GPT-2: a text sample every N steps (0 = none)
  int64_t sample_tokens = 64;
  int64_t log_every = 100;
  int64_t eval_every = 0;
  int workers = 2;
  int64_t train_samples = 0;
  int64_t test_samples = 0;
  int64_t eval_batch_size = 0;  // 0: 500 for images, --batch-size for text
  int64_t image_size = 0;       // 0 = the dataset's own
  bool augment = true;
  bool skip_bad_samples = false;
  int64_t synthetic_channels = 3;
  int64_t synthetic_classes = 10;
  int64_t synthetic_vocab = 0;  // synthetic-tokens: vocabulary (0 = GPT-2's 50257)
  std::string progress = "auto";
  // Pipeline and data parallelism.
  int stages = 1;
  int groups = 0;  // 0: world size / stages
  int64_t micro_batches = 1;
  std::string schedule = "1f1b";
  std::string partition = "auto";
  std::string profile;  // per-layer profile JSON for --partition auto
  double bandwidth_gbps = 10.0;
  std::string partitioner = "dp";  // --partition auto: dp (min-max DP) or projection (GroPipe)
  // AMPA (--partitioner projection, parallel/partition/projection.h).
  std::string ampa_normalize = "on";  // Eq. 9's min-max normalization of the layer times
  double ampa_threshold = 0.01;       // stop when PD / mean <= this
  std::string ampa_guard = "even";    // off | even | dp: never slower than these in real time
  // Saved tensors per layer (parallel/runtime/memory_plan.h): keep | swap | recompute | auto.
  std::string memory_policy = "keep";
  std::string memory_plan;  // per-layer overrides, "RANGE:POLICY,..."
  std::string swap_pool = "8GiB";
  std::string weight_cache = "off";     // --weight-cache off|on
  std::vector<std::string> migrate_at;  // "STEP:PARTITION" re-layouts (vPIPE part 2)
  std::string migration = "live";       // live | restart
  double migration_chunk_mb = 1.0;      // a live migration's chunks (0: whole tensors)
  double migration_window_mb = 4.0;     // and the most in flight (0: no flow control)
  double link_mbps = 0.0;               // an emulated link between ranks (0: none)
  // --link-flow-control: on (training messages first) or off (FIFO).
  std::string link_flow_control = "on";
  // off | vpipe | dynpipe | dynpipe-no-rf | pipedream-re (parallel/repartition_loop.h)
  std::string repartition = "off";
  int64_t repartition_every = 0;  // 0: the policy's default (20; pipedream-re: an epoch)
  double repartition_threshold = 0.05;
  int64_t repartition_top_k = 0;
  std::string slowdown_model;       // --repartition dynpipe
  std::string slowdown_fallback;    // "" | no-rf
  double monitor_interval_ms = -1;  // -1: 500 with --repartition, else off; 0: off
  // Gradient all-reduce across the groups (parallel/grouped_dp.h).
  std::string dp_overlap = "on";
  double dp_bucket_mb = 25.0;
  int dp_delay = 0;
  // How the replicas of a stage agree across the groups (parallel/sdpipe/sync_config.h).
  std::string sync = "allreduce";  // allreduce | sdpipe | adpsgd | ps-ssp
  std::string sync_window = "auto";
  int sync_history = 10;
  std::string sync_token = "on";
  std::string sync_query = "async";
  std::string sync_trace;
  int ssp_staleness = 3;
  std::string inject;  // parallel/runtime/injector.h
  bool local = false;
  std::string comm = "auto";    // auto | mpi | nccl: what carries tensors between MPI processes
  double comm_timeout = 300.0;  // seconds
  std::string trace;
  // Checkpoints and reliability.
  std::string checkpoint_dir;
  int64_t save_every = 0;
  int keep_last = 0;
  std::string resume;  // "", "auto", or a path
  std::string nan_policy = "abort";
  std::string loss_scale = "auto";  // auto (dynamic under fp16, else off) | off | dynamic | 2^k
  int64_t loss_scale_window = 2000;
  // ArrayPipe job-arrays (tools/train_array.h): sibling jobs sharing the pipeline.
  std::string array;  // SPEC or FILE; "" = one job
  std::string array_mode = "grid";
  std::string array_scheduler = "bnb";
  int array_bnb_max = 30;
  std::string array_slots;  // "" (every job resident), K, or "auto" (under --mem-limit)
};

CLI::App* add_train_command(CLI::App& app, TrainOptions& options);
// --system: sets the preset's flags that `given` says were not on the command line, and lists the
// given ones whose value differs in options->system_overrides. Throws for an unknown system.
void apply_system(TrainOptions* options, const std::function<bool(const std::string&)>& given);
// The configuration's line for --system: "custom (no preset)" or "gropipe: --schedule gpipe ...
// (overridden: --dp-delay 1)".
std::string describe_system(const TrainOptions& options);
// --repartition as the configuration prints it: "off" or "vpipe, every 20 steps, threshold 0.05".
std::string describe_repartition(const TrainOptions& options);
// Every flag's own range and name (--lr >= 0, a known --optimizer, ...), before anything is
// read: an error names the flag and the value given.
void check_train_flags(const TrainOptions& options);
int run_train(const TrainOptions& options);

}  // namespace strata::tools
