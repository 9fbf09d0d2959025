// The model benchmark: W warm-up steps, then N timed training steps, each forward, loss
// (cross-entropy), backward and an AdamW update of every parameter, the same work as a step of
// `strata train` without the data loader and the accuracy counts. The batches are made once from
// the synthetic datasets and kept on the device, so the timing holds no data loading or
// host-to-device copy (as in PyTorch benchmarks on synthetic GPU tensors). The device is
// synchronized at the end of every step before the clock is read; the step times' median and mean
// are reported.
//
// Mixed precision (--precision bf16|fp16, CUDA only) does what a step of `strata train` does
// (parallel/runtime/executor.h): the ParamStore keeps f32 master weights, gradients and optimizer
// state and binds the layers to 16-bit working copies (running statistics stay f32); every step
// refreshes the working weights from the masters (load_working), rounds floating inputs (images)
// to 16 bits, runs forward, loss (f32, from 16-bit logits) and backward in 16 bits, moves the
// 16-bit gradients into the f32 masters (flush_grads) and updates the masters with AdamW; all of
// it is timed. fp16 runs without loss scaling (`strata
// train` turns on a dynamic scale): the benchmark measures throughput, not convergence. The CPU
// emulates 16 bits through its f32 kernels (ops/dispatch.cpp), slower than fp32: refused here.
#include "tools/bench/model_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/cuda_runtime.h"
#include "engine/exec_context.h"
#include "engine/tape.h"
#include "graph/model_spec.h"
#include "graph/optimizer.h"
#include "graph/param_store.h"
#include "io/metrics.h"
#include "io/synthetic.h"
#include "io/text_datasets.h"
#include "models/flops.h"
#include "models/registry.h"
#include "ops/cpu_runtime.h"
#include "ops/cross_entropy.h"
#include "ops/precision.h"
#include "tools/bench/roofline.h"
#include "tools/common.h"

namespace strata::tools {

CLI::App* add_bench_command(CLI::App& app, BenchOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Benchmark training throughput of a model (--model), or ops: CPU conv2d and matmul beside "
      "sgemm, or with --device cuda:N the GPT-2/ResNet-50 hot ops against the roofline");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--model", o.model,
                  "Train this built-in model on synthetic data and report step time, samples/s, "
                  "tokens/s, TFLOP/s and MFU: " +
                      models::model_names() + " (empty = the op benchmarks)");
  cmd->add_option("--size", o.size, "Model size (empty = the model's default)");
  cmd->add_option("--batch-size", o.batch_size, "Samples per training step (needed with --model)");
  cmd->add_option("--seq-len", o.seq_len,
                  "gpt2, bert: tokens per sample T (0 = the model's positions: 1024 for gpt2)");
  cmd->add_option("--vocab", o.vocab,
                  "gpt2, bert: vocabulary of the model and the synthetic tokens (0 = the model's "
                  "own: 50257 for gpt2 and 30522 for bert, 256 for their tiny sizes; strata train "
                  "takes its dataset's, 50257 for GPT-2's BPE)");
  cmd->add_option("--image-size", o.image_size,
                  "Image models: side of the synthetic images (0 = 224 px and 1000 classes for "
                  "resnet 18-152 and vgg 11-19, else 32 px and 10 classes)");
  cmd->add_option("--precision", o.precision,
                  "fp32; tf32 (fp32 tensors, TF32 tensor-core products on CUDA); bf16 or fp16: "
                  "mixed precision on CUDA (16-bit activations, gradients and products' inputs, "
                  "f32 master weights, gradients and AdamW state, f32 loss; fp16 without loss "
                  "scaling: the benchmark measures throughput only). With --model the CPU runs "
                  "fp32 only (it emulates 16 bits with f32 math: slower, not a benchmark)");
  cmd->add_option("--device", o.device,
                  "auto, cpu or cuda:N (empty = auto with --model, cpu for the op benchmarks; "
                  "cuda:N runs the CUDA op benchmarks)");
  cmd->add_option("--steps", o.steps, "--model: timed training steps");
  cmd->add_option("--warmup", o.warmup, "--model: warm-up steps before the timed ones");
  cmd->add_option("--seed", o.seed, "--model: seed of the weights and the synthetic data");
  cmd->add_option("--threads", o.ops.threads, "CPU threads (0 = all cores)");
  cmd->add_option("--min-seconds", o.ops.min_seconds, "Op benchmarks: minimum time per case");
  cmd->add_option("--filter", o.ops.filter, "Op benchmarks: only cases whose name contains this");
  cmd->add_option("--json", o.ops.json, "Also write the results as JSON Lines here");
  cmd->footer(
      "Model FLOPs per training step: transformers (gpt2, bert) 6 N + 12 L C T per token, the "
      "PaLM/llm.c formula, with N = all parameters (the tied token embedding counted once: it is "
      "also the output projection) and the attention term over the full T x T (llm.c counts "
      "6 L C T for causal models); other models 3 x the forward FLOPs of their conv and linear "
      "layers (2 x MACs). MFU = achieved FLOP/s / the device's dense peak for --precision "
      "(H100, H200, A100; other devices: peak unknown, no MFU).");
  return cmd;
}

int run_bench(const BenchOptions& o) {
  check_precision(o.precision);
  if (!o.model.empty()) return run_model_bench(o);
  const Device device = resolve_device(o.device.empty() ? "cpu" : o.device);
  if (device.is_cuda()) return run_cuda_op_bench(o.ops, device, o.precision);
  STRATA_CHECK(o.precision == "fp32")
      << "--precision " << o.precision
      << ": the CPU op benchmark runs fp32 only (tf32, bf16 and fp16 with --device cuda:N)";
  return run_op_bench(o.ops);
}

namespace {

using Clock = std::chrono::steady_clock;

bool is_text_model(const std::string& name) { return name == "gpt2" || name == "bert"; }

// The dtype the layers compute in for --precision (tf32 is f32 with TF32 products).
DType compute_dtype(const std::string& precision) {
  if (precision == "bf16") return DType::kBF16;
  if (precision == "fp16") return DType::kF16;
  return DType::kF32;
}

// The report's precision: "bf16 (f32 master weights)" under mixed precision.
std::string describe_precision(const std::string& precision) {
  if (precision == "bf16") return "bf16 (f32 master weights)";
  if (precision == "fp16") return "fp16 (f32 master weights, no loss scaling)";
  return precision;
}

// ImageNet-sized image models: 224 px, 1000 classes by default.
bool is_imagenet_model(const std::string& name, const std::string& size) {
  if (name == "resnet") return size != "tiny";
  if (name == "vgg") {
    return size.find("small") == std::string::npos && size.find("tiny") == std::string::npos;
  }
  return false;
}

struct Workload {
  std::shared_ptr<const io::Dataset> data;
  proto::ModelSpec spec;
  std::string data_line;          // in words
  int64_t tokens_per_sample = 0;  // text models: T
};

Workload make_workload(const BenchOptions& o, const std::string& size) {
  Workload w;
  if (is_text_model(o.model)) {
    // The model's own vocabulary (or --vocab) and positions, from its spec without a dataset.
    const proto::ModelSpec plain = models::model_spec(o.model, size, {}, 0);
    const int64_t vocab = o.vocab > 0 ? o.vocab : plain.num_classes();
    const int64_t positions = plain.input().shape(plain.input().shape_size() - 1);
    const int64_t t = o.seq_len > 0 ? o.seq_len : positions;
    STRATA_CHECK(t <= positions) << "--seq-len " << t << " exceeds the " << positions
                                 << " positions of " << o.model << " " << size;
    const int64_t tokens = 2 * o.batch_size * t + 1;
    auto source = io::make_synthetic_token_source("synthetic-tokens/bench", tokens, vocab, o.seed);
    if (o.model == "bert") {
      io::MlmOptions mlm;
      mlm.vocab_size = vocab;
      mlm.mask_id = vocab > 103 ? 103 : vocab - 1;  // BERT's [MASK], inside the vocabulary
      mlm.seed = o.seed;
      w.data = std::make_shared<io::MaskedLanguageModelDataset>(source, t, mlm);
    } else {
      w.data = std::make_shared<io::LanguageModelDataset>(source, t, vocab);
    }
    w.tokens_per_sample = t;
    w.data_line = "synthetic-tokens, vocabulary " + std::to_string(vocab) +
                  (o.vocab > 0 ? " (--vocab)" : " (the model's own; --vocab sets another)") + ", " +
                  (o.model == "bert" ? "masked LM" : "next token");
  } else {
    const bool imagenet = is_imagenet_model(o.model, size);
    io::SyntheticImageOptions so;
    so.samples = 2 * o.batch_size;
    so.height = so.width = o.image_size > 0 ? o.image_size : imagenet ? 224 : 32;
    so.num_classes = imagenet ? 1000 : 10;
    so.seed = o.seed;
    w.data = io::open_synthetic_images(io::Split::kTrain, so);
    w.data_line = "synthetic-images 3 x " + std::to_string(so.height) + " x " +
                  std::to_string(so.width) + ", " + std::to_string(so.num_classes) + " classes";
  }
  w.spec = models::model_spec(o.model, size, w.data->input_spec().shape, w.data->num_classes());
  return w;
}

struct Batch {
  Tensor input, target;
};

// Samples [first, first + n) of `data` as one batch on `alloc`'s device.
Batch load_batch(const io::Dataset& data, int64_t first, int64_t n, Allocator& alloc) {
  const io::SampleSpec in = data.input_spec(), tg = data.target_spec();
  Shape in_shape{n}, tg_shape{n};
  in_shape.insert(in_shape.end(), in.shape.begin(), in.shape.end());
  tg_shape.insert(tg_shape.end(), tg.shape.begin(), tg.shape.end());
  Tensor input = Tensor::empty(in_shape, in.dtype), target = Tensor::empty(tg_shape, tg.dtype);
  const size_t in_bytes = input.nbytes() / n, tg_bytes = target.nbytes() / n;
  for (int64_t i = 0; i < n; ++i) {
    data.get(first + i, static_cast<char*>(input.raw_data()) + i * in_bytes,
             static_cast<char*>(target.raw_data()) + i * tg_bytes);
  }
  return {to_allocator(input, alloc), to_allocator(target, alloc)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// Three significant digits: 0.000512, 12.3, 456.
std::string significant(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}

// 124439808 -> "124,439,808"
std::string grouped(int64_t v) {
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

}  // namespace

int run_model_bench(const BenchOptions& o) {
  check_precision(o.precision);
  STRATA_CHECK_GT(o.batch_size, 0) << "--batch-size must be given (> 0) with --model";
  STRATA_CHECK_GT(o.steps, 0) << "--steps must be positive";
  STRATA_CHECK_GE(o.warmup, 0) << "--warmup must be >= 0";
  STRATA_CHECK_GE(o.seq_len, 0) << "--seq-len must be >= 0";
  STRATA_CHECK_GE(o.image_size, 0) << "--image-size must be >= 0";
  const std::string size = o.size.empty() ? models::model_info(o.model).default_size : o.size;
  STRATA_CHECK(is_text_model(o.model) || o.seq_len == 0)
      << "--seq-len applies to gpt2 and bert, not to " << o.model;
  STRATA_CHECK(!is_text_model(o.model) || o.image_size == 0)
      << "--image-size applies to image models, not to " << o.model;
  STRATA_CHECK_GE(o.vocab, 0) << "--vocab must be >= 0";
  STRATA_CHECK(is_text_model(o.model) || o.vocab == 0)
      << "--vocab applies to gpt2 and bert, not to " << o.model;
  const Device device = resolve_device(o.device.empty() ? "auto" : o.device);
  const DType compute = compute_dtype(o.precision);
  STRATA_CHECK(device.is_cuda() || compute == DType::kF32)
      << "--precision " << o.precision << " on " << device.str()
      << ": the CPU emulates 16-bit mixed precision through its f32 kernels, slower than fp32, so "
         "it is not benchmarked; use --precision fp32 on the CPU, or --device cuda:N";
  STRATA_CHECK(device.is_cuda() || o.precision == "fp32")
      << "--precision " << o.precision << " applies to CUDA devices; the CPU runs fp32";

  const Workload w = make_workload(o, size);
  std::unique_ptr<graph::Model> model = graph::build_model(w.spec);
  const models::TrainingFlops flops = models::training_flops(*model);

  CpuAllocator cpu_allocator;
  ExecContext ctx(device, device.is_cpu() ? &cpu_allocator : nullptr, o.ops.threads);
  if (device.is_cuda()) cuda::set_tf32(ctx.cuda(), o.precision == "tf32");
  const std::string device_name = device.is_cuda()
                                      ? cuda_device_name(device.index)
                                      : describe_threads(ctx) + "; " + ops::cpu_runtime::describe();
  const DevicePeaks peaks = device.is_cuda() ? device_peaks(device_name) : DevicePeaks{};
  const double peak = peak_flops(peaks, o.precision);

  // Mixed precision: f32 masters, the layers bound to 16-bit working copies.
  graph::ParamStore store(*model, 0, model->size(), ctx.allocator(), DType::kF32, compute);
  store.initialize(o.seed);
  graph::OptimizerConfig opt;
  opt.kind = graph::OptimizerKind::kAdamW;
  opt.schedule.base_lr = 1e-4;
  opt.weight_decay = 0.01;
  // As strata train by default (--nan-policy abort, no clipping): the update computes the
  // gradient norm as it reads the gradients, with no pass of its own.
  opt.skip_non_finite = false;
  graph::Optimizer optimizer(store, opt);

  // Two batches, alternating: every step sees fresh samples but no loading.
  std::vector<Batch> batches;
  for (int64_t b = 0; b < 2; ++b) {
    batches.push_back(load_batch(*w.data, b * o.batch_size, o.batch_size, ctx.allocator()));
  }

  std::printf(
      "benchmark: %s on %s, %s, batch %lld%s\n", model->name().c_str(), device.str().c_str(),
      describe_precision(o.precision).c_str(), static_cast<long long>(o.batch_size),
      is_text_model(o.model) ? (" x " + std::to_string(w.tokens_per_sample) + " tokens").c_str()
                             : "");
  std::fflush(stdout);

  std::vector<double> step_seconds;
  double first_step_seconds = 0.0, first_loss = 0.0, last_loss = 0.0;
  const int64_t total = o.warmup + o.steps;
  ctx.synchronize();
  for (int64_t step = 0; step < total; ++step) {
    const Batch& batch = batches[step % batches.size()];
    const auto t0 = Clock::now();
    store.load_working(ctx);  // mixed precision: 16-bit weights and statistics from the masters
    Tape tape;
    graph::ForwardOptions fwd;
    fwd.seed = o.seed;
    fwd.step = step;
    fwd.sample_offset = (step % 2) * o.batch_size;
    // Mixed precision: images rounded to 16 bits (token ids stay integers).
    const Tensor input = store.mixed() && is_floating(batch.input.dtype())
                             ? ops::cast(ctx, batch.input, compute)
                             : batch.input;
    const TensorList out = model->forward(ctx, 0, model->size(), {input}, tape, fwd);
    const Tensor& logits = out.at(0);
    const Tensor flat_logits = logits.reshape({-1, logits.size(-1)});
    const Tensor flat_target = batch.target.reshape({-1});
    ops::CrossEntropyOptions loss_options;
    loss_options.num_classes = model->loss_classes();  // a padded vocabulary's real classes
    const Tensor loss = ops::cross_entropy_forward(ctx, flat_logits, flat_target, loss_options);
    const Tensor dlogits =
        ops::cross_entropy_backward(ctx, flat_logits, flat_target, loss_options, 1.0);
    model->backward(ctx, 0, model->size(), {dlogits.view(logits.shape())}, tape);
    store.flush_grads(ctx);  // mixed precision: 16-bit gradients into the f32 masters
    optimizer.step(ctx, step);
    store.zero_grads(ctx);
    ctx.synchronize();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const double loss_value = loss.to(DType::kF64).item<double>();  // after the clock
    if (step == 0) {
      first_step_seconds = seconds;
      first_loss = loss_value;
    }
    last_loss = loss_value;
    if (step >= o.warmup) step_seconds.push_back(seconds);
  }

  const double med = median(step_seconds);
  const double mean =
      std::accumulate(step_seconds.begin(), step_seconds.end(), 0.0) / step_seconds.size();
  const double lo = *std::min_element(step_seconds.begin(), step_seconds.end());
  const double hi = *std::max_element(step_seconds.begin(), step_seconds.end());
  const double samples_per_s = static_cast<double>(o.batch_size) / med;
  const double tokens_per_s = samples_per_s * static_cast<double>(w.tokens_per_sample);
  const double flops_per_step = flops.per_sample * static_cast<double>(o.batch_size);
  const double achieved = flops_per_step / med;
  const MemoryStats mem = ctx.allocator().stats();

  std::vector<std::pair<std::string, std::string>> rows;
  rows.push_back({"model", model->name() + ", " + grouped(flops.params.total) + " parameters (" +
                               grouped(flops.params.embedding) + " in embeddings)"});
  rows.push_back({"device", device.str() + " (" + device_name + ")"});
  rows.push_back({"precision", describe_precision(o.precision)});
  rows.push_back({"batch", std::to_string(o.batch_size) +
                               (is_text_model(o.model)
                                    ? " x " + std::to_string(w.tokens_per_sample) + " tokens"
                                    : std::string(o.batch_size == 1 ? " image" : " images")) +
                               " (" + w.data_line + "; resident on the device)"});
  rows.push_back({"steps", std::to_string(o.steps) + " timed after " + std::to_string(o.warmup) +
                               (store.mixed() ? " warm-up (16-bit weights from the f32 masters, "
                                                "forward, loss, backward, gradients to the "
                                                "masters, AdamW); first step "
                                              : " warm-up (forward, loss, backward, AdamW); first "
                                                "step ") +
                               fixed(first_step_seconds * 1e3, 1) + " ms"});
  rows.push_back({"step time", "median " + fixed(med * 1e3, 2) + " ms, mean " +
                                   fixed(mean * 1e3, 2) + " ms (min " + fixed(lo * 1e3, 2) +
                                   ", max " + fixed(hi * 1e3, 2) + ")"});
  rows.push_back({"samples/s", fixed(samples_per_s, 1)});
  if (is_text_model(o.model)) rows.push_back({"tokens/s", fixed(tokens_per_s, 0)});
  rows.push_back(
      {"model FLOPs", fixed(flops_per_step / 1e9, 3) + " GFLOP per step = " + flops.formula});
  rows.push_back({"achieved", significant(achieved / 1e12) + " TFLOP/s"});
  if (peak > 0) {
    rows.push_back({"peak", fixed(peak / 1e12, 1) + " TFLOP/s (" + peaks.name + ", " + o.precision +
                                " dense)"});
    // Under bf16/fp16 the precision's peak is the bf16 one already.
    rows.push_back(
        {"MFU",
         fixed(100.0 * achieved / peak, 2) + "% (of the " + o.precision + " peak" +
             (store.mixed() ? std::string(")")
                            : "; " + fixed(100.0 * achieved / (peaks.bf16_tflops * 1e12), 2) +
                                  "% of the bf16 peak, llm.c's yardstick)")});
  } else {
    rows.push_back(
        {"peak", "peak unknown for " + (device.is_cuda() ? device_name : "the CPU") + " (no MFU)"});
  }
  rows.push_back({"loss", fixed(first_loss, 4) + " (step 0) -> " + fixed(last_loss, 4) + " (step " +
                              std::to_string(total - 1) + ")"});
  rows.push_back({"peak memory", format_bytes(mem.peak)});
  print_table(rows);
  std::fflush(stdout);

  io::JsonlWriter json(o.ops.json);
  nlohmann::json record = {{"model", o.model},
                           {"size", size},
                           {"name", model->name()},
                           {"params", flops.params.total},
                           {"embedding_params", flops.params.embedding},
                           {"device", device.str()},
                           {"device_name", device_name},
                           {"precision", o.precision},
                           {"compute_dtype", dtype_name(compute)},
                           {"master_dtype", "f32"},
                           {"loss_scaling", false},
                           {"batch_size", o.batch_size},
                           {"steps", o.steps},
                           {"warmup", o.warmup},
                           {"step_ms_median", med * 1e3},
                           {"step_ms_mean", mean * 1e3},
                           {"step_ms_min", lo * 1e3},
                           {"step_ms_max", hi * 1e3},
                           {"first_step_ms", first_step_seconds * 1e3},
                           {"samples_per_s", samples_per_s},
                           {"flops_per_step", flops_per_step},
                           {"flops_formula", flops.formula},
                           {"tflops", achieved / 1e12},
                           {"loss_first", first_loss},
                           {"loss_last", last_loss},
                           {"peak_memory_bytes", mem.peak}};
  if (is_text_model(o.model)) {
    record["seq_len"] = w.tokens_per_sample;
    record["vocab"] = w.spec.num_classes();
    record["tokens_per_s"] = tokens_per_s;
  } else {
    record["image_size"] = w.data->input_spec().shape.at(1);
  }
  if (peak > 0) {
    record["peak_tflops"] = peak / 1e12;
    record["mfu"] = achieved / peak;
  } else {
    record["peak_tflops"] = nullptr;
    record["mfu"] = nullptr;
  }
  json.write(record);
  return 0;
}

}  // namespace strata::tools
