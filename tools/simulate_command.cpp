// `strata simulate`: builds the model from its flags (no data is read), the cost model (measured
// profiles or a device model), the cluster and the layout, then simulates one layout or searches
// them (parallel/sim). A layout the cluster cannot hold (more ranks than GPUs, a stage whose
// parameters, gradients and optimizer state exceed the device) is refused with the numbers
// before anything is simulated; a stage whose simulated peak exceeds the device is reported with
// the full report and exit status 1.
#include "tools/simulate_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "engine/allocator.h"
#include "engine/check.h"
#include "graph/model.h"
#include "graph/model_spec.h"
#include "models/flops.h"
#include "models/registry.h"
#include "parallel/partition/partition.h"
#include "parallel/sim/search.h"
#include "parallel/sim/sim_trace.h"
#include "tools/simulate_report.h"
#include "tools/svg_plot.h"

namespace strata::tools {

namespace sim = parallel::sim;

CLI::App* add_simulate_command(CLI::App& app, SimulateOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "simulate", "Simulate a pipeline layout on a cluster (or search layouts) from a cost model");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--model", o.model, "Built-in model: " + models::model_names());
  cmd->add_option("--size", o.size, "Model size (empty = the model's default)");
  cmd->add_option("--model-spec", o.model_spec, "ModelSpec .prototxt file instead of --model");
  cmd->add_option("--seq-len", o.seq_len, "Text models: tokens per sample (0 = the positions)");
  cmd->add_option("--input-shape", o.input_shape, "Image models: C,H,W (empty = 3,224,224)");
  cmd->add_option("--num-classes", o.num_classes, "Image models: classes (0 = 1000)");
  cmd->add_option("--layers", o.layers, "Transformer blocks (0 = the size's)");
  cmd->add_option("--width", o.width, "Model width (0 = the size's)");
  cmd->add_option("--heads", o.heads, "Attention heads (0 = the size's)");
  cmd->add_option("--vocab", o.vocab, "Vocabulary (0 = the size's)");
  cmd->add_option("--profile", o.profile,
                  "Per-layer times from `strata profile --output` (FILE or FILE@BATCH; several "
                  "at distinct batch sizes fit a fixed + per-sample cost); repeatable");
  cmd->add_option("--device-model", o.device_model,
                  "Device cost model: h100, h200, a100, or any name with --device-tflops, "
                  "--device-bandwidth and --device-memory (empty: h100 unless --profile)");
  cmd->add_option("--device-tflops", o.device_tflops,
                  "Peak TFLOP/s at the run's --precision (0 = the device model's)");
  cmd->add_option("--device-bandwidth", o.device_bandwidth, "Memory GB/s (0 = the model's)");
  cmd->add_option("--device-memory", o.device_memory,
                  "Memory per GPU, e.g. 80GB (empty = the model's)");
  cmd->add_option("--host-bandwidth", o.host_bandwidth,
                  "Device-host GB/s for --memory-policy swap (0 = the model's)");
  cmd->add_option("--nvlink-bandwidth", o.nvlink_bandwidth,
                  "NVLink GB/s per direction (0 = the model's)");
  cmd->add_option("--launch-us", o.launch_us, "Kernel launch overhead, us (-1 = the model's)");
  cmd->add_option("--efficiency", o.efficiency,
                  "Fraction of peak per op class, e.g. matmul=0.7,attention=0.5,memory=0.8");
  cmd->add_option("--precision", o.precision, "fp32, tf32, bf16 or fp16 (as strata train)");
  cmd->add_option("--optimizer-gbs", o.optimizer_gbs,
                  "GB/s of parameters the optimizer step updates (0 = from the device model; a "
                  "profile alone: free)");
  cmd->add_option("--step-overhead-ms", o.step_overhead_ms,
                  "Per step and rank outside the instructions (data, metrics), ms");
  cmd->add_option("--gpus", o.gpus,
                  "GPUs in the cluster (0 = groups x stages); with --search a list, e.g. "
                  "8,64,512,4096");
  cmd->add_option("--gpus-per-node", o.gpus_per_node, "GPUs per node");
  cmd->add_option("--intra-link", o.intra_link,
                  "Link inside a node: same-device, nvlink, pcie, infiniband, ethernet (empty = "
                  "nvlink, or pcie without NVLink)");
  cmd->add_option("--inter-link", o.inter_link, "Link between nodes (same names)");
  cmd->add_option("--intra-bandwidth", o.intra_bandwidth,
                  "GB/s of the intra-node link (0 = its class's)");
  cmd->add_option("--inter-bandwidth", o.inter_bandwidth,
                  "GB/s of the inter-node link per GPU (0 = its class's)");
  cmd->add_option("--intra-latency-us", o.intra_latency_us,
                  "Latency of the intra-node link (-1 = its class's)");
  cmd->add_option("--inter-latency-us", o.inter_latency_us,
                  "Latency of the inter-node link (-1 = its class's)");
  cmd->add_option("--all-reduce", o.all_reduce, "Collective algorithm: ring, tree");
  cmd->add_option("--stages", o.stages, "Pipeline stages S");
  cmd->add_option("--groups", o.groups, "Data-parallel groups G (0 = GPUs / S)");
  cmd->add_option("--micro-batches", o.micro_batches, "Micro-batches M per step of each group");
  cmd->add_option("--batch-size", o.batch_size, "Global batch (samples per step)");
  cmd->add_option("--batch-per-gpu", o.batch_per_gpu,
                  "Global batch = this x GPUs (0 = --batch-size); for scaling over --gpus");
  cmd->add_option("--schedule", o.schedule, "Pipeline schedule: gpipe, 1f1b, async-1f1b, 2bw");
  cmd->add_option("--partition", o.partition,
                  "Stage boundaries: auto (--partitioner), uniform, or ranges (0-3,4-11)");
  cmd->add_option("--partitioner", o.partitioner, "With --partition auto: dp, projection");
  cmd->add_option("--memory-policy", o.memory_policy,
                  "Per-layer activation memory: keep, swap, recompute (every layer)");
  cmd->add_option("--optimizer", o.optimizer, "Optimizer: adamw (2 state slots), sgd");
  cmd->add_option("--momentum", o.momentum, "SGD momentum (0: no state)");
  cmd->add_option("--dp-overlap", o.dp_overlap,
                  "Launch each gradient bucket after its backward: on, off");
  cmd->add_option("--dp-bucket-mb", o.dp_bucket_mb, "Gradient bucket MiB (0 = one per stage)");
  cmd->add_option("--dp-delay", o.dp_delay, "Apply all-reduced gradients D steps late");
  cmd->add_option("--steps", o.steps, "Steps to simulate (0 = 1, or D + 2 with --dp-delay D)");
  cmd->add_option("--mem-limit", o.mem_limit, "Memory per GPU, over the device's (e.g. 40GiB)");
  cmd->add_option("--json", o.json, "Write the results as JSON to this file");
  cmd->add_option("--trace", o.trace,
                  "Write the simulated timeline as a Chrome trace (the format of strata train "
                  "--trace)");
  cmd->add_option("--plot", o.plot,
                  "Write an SVG: the per-rank timeline, or with --search throughput vs GPUs");
  cmd->add_flag("--search", o.search,
                "Search (G, S, M, schedule, memory policy, partitioner) for the best layouts");
  cmd->add_option("--top", o.top, "--search: layouts printed per GPU count");
  cmd->add_option("--search-micro-batches", o.search_micro_batches,
                  "--search: values of M (empty = 1, 2, 4, ... up to the batch per group)");
  cmd->add_option("--search-schedules", o.search_schedules, "--search: schedules to try");
  cmd->add_option("--search-policies", o.search_policies, "--search: memory policies to try");
  cmd->add_option("--search-partitioners", o.search_partitioners,
                  "--search: partitioners to try (dp, projection, uniform)");
  return cmd;
}

namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int64_t parse_count(const std::string& text, const char* flag) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  STRATA_CHECK(used == text.size() && !text.empty() && v >= 0)
      << flag << " '" << text << "': expected a non-negative integer";
  return v;
}

bool is_text_model(const std::string& name) { return name == "gpt2" || name == "bert"; }

proto::ModelSpec model_of(const SimulateOptions& o, int64_t* tokens) {
  if (!o.model_spec.empty()) {
    STRATA_CHECK(o.layers == 0 && o.width == 0 && o.heads == 0 && o.vocab == 0)
        << "--layers/--width/--heads/--vocab apply to --model, not --model-spec";
    return graph::load_model_spec(o.model_spec);
  }
  models::ModelRequest r;
  r.name = o.model;
  r.size = o.size;
  r.dims.layers = o.layers;
  r.dims.width = o.width;
  r.dims.heads = o.heads;
  r.dims.vocab_size = o.vocab;
  if (is_text_model(o.model)) {
    STRATA_CHECK(o.input_shape.empty())
        << "--input-shape is for image models; " << o.model << " takes tokens (--seq-len)";
    if (o.seq_len > 0) {
      r.input_shape = o.model == "bert" ? Shape{3, o.seq_len} : Shape{o.seq_len};
      if (o.seq_len > 1024) r.dims.seq_len = o.seq_len;  // more positions than the named size
    }
  } else {
    STRATA_CHECK(o.seq_len == 0) << "--seq-len is for text models (gpt2, bert), not " << o.model;
    Shape shape{3, 224, 224};
    if (!o.input_shape.empty()) {
      shape.clear();
      for (const std::string& d : split_list(o.input_shape)) {
        shape.push_back(parse_count(d, "--input-shape"));
      }
      STRATA_CHECK(shape.size() == 3) << "--input-shape '" << o.input_shape << "': expected C,H,W";
    }
    r.input_shape = shape;
    r.num_classes = o.num_classes > 0 ? o.num_classes : 1000;
  }
  proto::ModelSpec spec = models::model_spec(r);
  if (is_text_model(o.model)) *tokens = spec.input().shape(spec.input().shape_size() - 1);
  return spec;
}

DType compute_dtype(const std::string& precision) {
  if (precision == "fp32" || precision == "tf32") return DType::kF32;
  if (precision == "bf16") return DType::kBF16;
  if (precision == "fp16") return DType::kF16;
  STRATA_THROW() << "unknown --precision '" << precision << "' (valid: fp32, tf32, bf16, fp16)";
}

sim::DeviceSpec device_of(const SimulateOptions& o) {
  sim::DeviceSpec d;
  const std::string name =
      o.device_model.empty() ? (o.profile.empty() ? "h100" : "") : o.device_model;
  const auto names = sim::builtin_device_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) {
    d = sim::builtin_device(name);
  } else if (!name.empty()) {
    STRATA_CHECK(o.device_tflops > 0 && o.device_bandwidth > 0 && !o.device_memory.empty())
        << "unknown device model '" << name << "' (valid: h100, h200, a100; a device of another "
        << "name needs --device-tflops, --device-bandwidth and --device-memory)";
    d.name = name;
    d.launch_seconds = 4e-6;
  } else {
    d.name = "profiled device";
  }
  if (o.device_tflops > 0) {
    d.peak_flops = d.peak_flops_tf32 = d.peak_flops_fp32 = o.device_tflops * 1e12;
  }
  if (o.device_bandwidth > 0) d.memory_bandwidth = o.device_bandwidth * 1e9;
  if (!o.device_memory.empty()) d.memory_bytes = static_cast<double>(parse_bytes(o.device_memory));
  if (o.host_bandwidth > 0) d.host_bandwidth = o.host_bandwidth * 1e9;
  if (o.nvlink_bandwidth > 0) d.nvlink_bandwidth = o.nvlink_bandwidth * 1e9;
  if (o.launch_us >= 0) d.launch_seconds = o.launch_us * 1e-6;
  return d;
}

double peak_of(const sim::DeviceSpec& d, const std::string& precision) {
  if (precision == "fp32") return d.peak_flops_fp32;
  if (precision == "tf32") return d.peak_flops_tf32;
  return d.peak_flops;
}

sim::Cluster cluster_of(const SimulateOptions& o, const sim::DeviceSpec& device, int gpus) {
  sim::Cluster c = sim::make_cluster(device, gpus, o.gpus_per_node);
  if (!o.intra_link.empty())
    c.intra = sim::default_link(sim::parse_link_class(o.intra_link), device);
  c.inter = sim::default_link(sim::parse_link_class(o.inter_link), device);
  if (o.intra_bandwidth > 0) c.intra.bandwidth = o.intra_bandwidth * 1e9;
  if (o.inter_bandwidth > 0) c.inter.bandwidth = o.inter_bandwidth * 1e9;
  if (o.intra_latency_us >= 0) c.intra.latency_s = o.intra_latency_us * 1e-6;
  if (o.inter_latency_us >= 0) c.inter.latency_s = o.inter_latency_us * 1e-6;
  return c;
}

struct Setup {
  proto::ModelSpec spec;
  std::unique_ptr<graph::Model> model;
  sim::CostModel costs;
  sim::DeviceSpec device;
  SimContext ctx;
  sim::SimConfig base;
};

Setup setup(const SimulateOptions& o) {
  Setup s;
  int64_t tokens = 0;
  s.spec = model_of(o, &tokens);
  s.model = graph::build_model(s.spec);
  const DType compute = compute_dtype(o.precision);
  s.device = device_of(o);
  sim::WorkOptions wo;
  wo.compute = compute;
  wo.attention_probs = !o.profile.empty() && o.device_model.empty();  // the CPU keeps them
  const std::vector<sim::LayerWork> work = sim::model_work(*s.model, &s.spec, wo);
  if (!o.profile.empty()) {
    std::vector<sim::MeasuredProfile> profiles;
    for (const std::string& p : o.profile) profiles.push_back(sim::read_profile(p));
    s.costs = sim::profile_cost_model(work, profiles);
  } else {
    sim::DeviceCostOptions dco;
    dco.efficiency = sim::parse_efficiency(o.efficiency);
    dco.peak_flops = peak_of(s.device, o.precision);
    dco.optimizer_slots = o.optimizer == "adamw" ? 2 : (o.momentum > 0 ? 1 : 0);
    dco.causal_attention = s.spec.layer_size() > 0;  // GPT-2's blocks are causal
    for (const proto::LayerSpec& l : s.spec.layer()) {
      if (l.has_transformer_block()) dco.causal_attention = l.transformer_block().causal();
    }
    s.costs = sim::device_cost_model(work, s.device, dco);
    const sim::Efficiency& e = dco.efficiency;
    char text[200];
    std::snprintf(text, sizeof(text),
                  " (%.0f TFLOP/s %s, %.2f TB/s; efficiency matmul %.2f, attention %.2f, memory "
                  "%.2f)",
                  dco.peak_flops / 1e12, o.precision.c_str(), s.device.memory_bandwidth / 1e12,
                  e.matmul, e.attention, e.memory);
    s.costs.source += text;
  }
  STRATA_CHECK(o.optimizer == "adamw" || o.optimizer == "sgd")
      << "unknown --optimizer '" << o.optimizer << "' (valid: sgd, adamw)";
  const int slots = o.optimizer == "adamw" ? 2 : (o.momentum > 0 ? 1 : 0);
  if (o.optimizer_gbs > 0) s.costs.optimizer_s_per_param_byte = 1.0 / (o.optimizer_gbs * 1e9);
  s.costs.step_overhead_s = o.step_overhead_ms * 1e-3;
  STRATA_CHECK(o.dp_overlap == "on" || o.dp_overlap == "off")
      << "--dp-overlap must be on or off, got '" << o.dp_overlap << "'";
  STRATA_CHECK(o.dp_bucket_mb >= 0) << "--dp-bucket-mb must be >= 0";
  STRATA_CHECK(o.dp_delay >= 0) << "--dp-delay must be >= 0";
  s.base.grad_sync.overlap = o.dp_overlap == "on";
  s.base.grad_sync.bucket_mb = o.dp_bucket_mb;
  s.base.grad_sync.delay = o.dp_delay;
  s.base.all_reduce = sim::parse_all_reduce(o.all_reduce);
  s.base.optimizer_slots = slots;
  s.base.mixed_precision = compute != DType::kF32;
  s.base.steps = o.steps;
  // The executor posts receives 4 instructions ahead, but not over NCCL (stream-ordered).
  s.base.receive_lookahead = o.profile.empty() ? 0 : 4;

  SimContext& c = s.ctx;
  c.model = s.model->name();
  if (o.layers > 0 || o.width > 0 || o.heads > 0 || o.vocab > 0) {
    // Dimensions over a named size: say what the model is.
    char text[96];
    std::snprintf(text, sizeof(text), "%s (%.3gB parameters)", o.model.c_str(),
                  static_cast<double>(models::count_params(*s.model).total) / 1e9);
    c.model = text;
  }
  c.cost_source = s.costs.source;
  c.precision = o.precision;
  for (size_t l = 0; l < s.model->size(); ++l) c.layer_names.push_back(s.model->layer(l).name());
  c.tokens_per_sample = tokens;
  c.flops_per_sample = models::training_flops(*s.model).per_sample;
  c.peak_flops = peak_of(s.device, o.precision);
  c.capacity =
      o.mem_limit.empty() ? s.device.memory_bytes : static_cast<double>(parse_bytes(o.mem_limit));
  c.memory_policy = o.memory_policy;
  return s;
}

std::vector<int> gpu_counts(const SimulateOptions& o) {
  std::vector<int> out;
  for (const std::string& g : split_list(o.gpus)) {
    out.push_back(static_cast<int>(parse_count(g, "--gpus")));
  }
  STRATA_CHECK(!out.empty()) << "--gpus '" << o.gpus << "': expected a number or a list";
  return out;
}

int run_single(const SimulateOptions& o, Setup& s) {
  const std::vector<int> counts = gpu_counts(o);
  STRATA_CHECK(counts.size() == 1)
      << "--gpus '" << o.gpus << "': a list of GPU counts needs --search";
  STRATA_CHECK(o.stages >= 1) << "--stages must be at least 1, got " << o.stages;
  STRATA_CHECK(o.groups >= 0) << "--groups must be >= 0, got " << o.groups;
  int gpus = counts[0];
  const int groups = o.groups > 0 ? o.groups : std::max(1, gpus / o.stages);
  if (gpus == 0) gpus = groups * o.stages;
  STRATA_CHECK(groups * o.stages <= gpus)
      << "--groups " << groups << " x --stages " << o.stages << " = " << groups * o.stages
      << " ranks do not fit the cluster's " << gpus << " GPUs (--gpus " << gpus << ")";
  const int64_t batch = o.batch_per_gpu > 0 ? o.batch_per_gpu * gpus : o.batch_size;
  STRATA_CHECK(o.micro_batches >= 1) << "--micro-batches must be at least 1";
  STRATA_CHECK(batch > 0 && batch % (static_cast<int64_t>(groups) * o.micro_batches) == 0)
      << "--batch-size " << batch << " must be a multiple of --groups " << groups
      << " x --micro-batches " << o.micro_batches;
  STRATA_CHECK(static_cast<size_t>(o.stages) <= s.costs.layers.size())
      << "--stages " << o.stages << ": model " << s.ctx.model << " has only "
      << s.costs.layers.size() << " layers to cut";
  s.ctx.cluster = cluster_of(o, s.device, gpus);
  s.ctx.batch_size = batch;
  sim::SimConfig c = s.base;
  c.groups = groups;
  c.stages = o.stages;
  c.micro_batches = o.micro_batches;
  c.micro_batch_rows = static_cast<double>(batch) / groups / o.micro_batches;
  c.schedule = parallel::parse_schedule(o.schedule);
  c.policy.assign(s.costs.layers.size(),
                  sim::parse_memory_policy(o.memory_policy, "--memory-policy"));
  if (o.partition == "auto") {
    c.partition = sim::choose_partition(s.costs, o.stages, c.micro_batch_rows, o.partitioner,
                                        c.schedule, o.micro_batches, s.ctx.cluster.intra.bandwidth);
  } else if (o.partition == "uniform") {
    c.partition = parallel::uniform_partition(s.costs.layers.size(), o.stages);
  } else {
    c.partition = parallel::parse_partition(o.partition, s.ctx.layer_names, o.stages);
  }
  // Whole-run memory first: a stage that cannot hold its parameters is not simulated.
  const double capacity = s.ctx.capacity;
  for (int st = 0; st < o.stages && capacity > 0; ++st) {
    sim::StaticOptions so{c.optimizer_slots, c.mixed_precision, 0, c.grad_sync.delay, groups > 1};
    const sim::StageStatic m = sim::stage_static(s.costs.layers, c.partition[st], so);
    STRATA_CHECK(m.total() <= capacity)
        << "stage " << st << " (layers " << c.partition[st].begin << "-" << c.partition[st].end - 1
        << ") needs " << format_bytes(static_cast<size_t>(m.total())) << " for parameters ("
        << format_bytes(static_cast<size_t>(m.params)) << "), gradients and optimizer state alone, "
        << "more than the " << format_bytes(static_cast<size_t>(capacity)) << " of a "
        << s.device.name << " (--mem-limit / --device-memory): more --stages, or "
        << "--optimizer sgd";
  }
  c.record_timeline = !o.trace.empty() || !o.plot.empty();
  const sim::SimResult r = sim::simulate(c, s.costs, s.ctx.cluster);
  print_simulation(s.ctx, c, r);
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    STRATA_CHECK(out.good()) << "cannot write --json file '" << o.json << "'";
    out << simulation_json(s.ctx, c, r) << "\n";
    std::printf("wrote %s\n", o.json.c_str());
  }
  if (!o.trace.empty()) {
    sim::write_timeline_trace(o.trace, r, groups, o.stages);
    std::printf("wrote %s (open in Perfetto or chrome://tracing)\n", o.trace.c_str());
  }
  if (!o.plot.empty()) {
    write_timeline_svg(o.plot,
                       s.ctx.model + ": " + std::to_string(groups) + " x " +
                           std::to_string(o.stages) + ", " + o.schedule +
                           ", M=" + std::to_string(o.micro_batches),
                       r, std::min(groups * o.stages, 64), o.stages);
    std::printf("wrote %s\n", o.plot.c_str());
  }
  for (const sim::StageResult& st : r.stages) {
    STRATA_CHECK(capacity <= 0 || st.peak_bytes <= capacity)
        << "stage " << st.stage << " peaks at " << format_bytes(static_cast<size_t>(st.peak_bytes))
        << ", more than the " << format_bytes(static_cast<size_t>(capacity)) << " of a "
        << s.device.name << ": fewer micro-batches in flight (--schedule 1f1b, fewer "
        << "--micro-batches), --memory-policy recompute or swap, or more --stages";
  }
  return 0;
}

int run_search(const SimulateOptions& o, Setup& s) {
  sim::SearchSpace space;
  for (const std::string& m : split_list(o.search_micro_batches)) {
    space.micro_batches.push_back(parse_count(m, "--search-micro-batches"));
  }
  space.schedules.clear();
  for (const std::string& k : split_list(o.search_schedules)) {
    space.schedules.push_back(parallel::parse_schedule(k));
  }
  space.policies.clear();
  for (const std::string& p : split_list(o.search_policies)) {
    space.policies.push_back(sim::parse_memory_policy(p, "--search-policies"));
  }
  space.partitioners = split_list(o.search_partitioners);
  for (const std::string& p : space.partitioners) {
    STRATA_CHECK(p == "dp" || p == "projection" || p == "uniform")
        << "unknown partitioner '" << p << "' in --search-partitioners (valid: dp, projection, "
        << "uniform)";
  }
  space.memory_bytes = s.ctx.capacity;
  std::vector<std::vector<sim::Candidate>> all;
  std::vector<ScaleRow> rows;
  const std::vector<int> counts = gpu_counts(o);
  all.reserve(counts.size());
  for (int gpus : counts) {
    STRATA_CHECK(gpus >= 1) << "--search needs --gpus (a count or a list)";
    space.batch_size = o.batch_per_gpu > 0 ? o.batch_per_gpu * gpus : o.batch_size;
    SimContext ctx = s.ctx;
    ctx.cluster = cluster_of(o, s.device, gpus);
    ctx.batch_size = space.batch_size;
    all.push_back(sim::search_layouts(s.costs, ctx.cluster, space, s.base));
    const std::vector<sim::Candidate>& ranked = all.back();
    print_search(ctx, ranked, o.top);
    ScaleRow row;
    row.gpus = gpus;
    row.batch_size = space.batch_size;
    row.ctx = ctx;
    row.candidates = ranked.size();
    for (const sim::Candidate& c : ranked) {
      if (!c.fits) continue;
      if (row.best == nullptr) row.best = &c;
      if (c.stages == 1 && row.data_parallel == nullptr) row.data_parallel = &c;
      if (c.groups == 1 && row.pipeline == nullptr) row.pipeline = &c;
    }
    rows.push_back(row);
  }
  print_scaling(rows);
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    STRATA_CHECK(out.good()) << "cannot write --json file '" << o.json << "'";
    out << search_json(rows, all) << "\n";
    std::printf("wrote %s\n", o.json.c_str());
  }
  if (!o.plot.empty()) {
    Series best{"best layout", {}, {}}, dp{"plain data parallel (S = 1)", {}, {}},
        pp{"plain pipeline (G = 1)", {}, {}};
    for (const ScaleRow& r : rows) {
      for (auto [series, cand] :
           {std::make_pair(&best, r.best), std::make_pair(&dp, r.data_parallel),
            std::make_pair(&pp, r.pipeline)}) {
        series->x.push_back(r.gpus);
        series->y.push_back(cand != nullptr ? cand->samples_per_s : 0.0);
      }
    }
    write_line_chart_svg(o.plot, s.ctx.model + " on " + s.device.name + ": throughput vs GPUs",
                         "GPUs", "samples/s", {best, dp, pp});
    std::printf("wrote %s\n", o.plot.c_str());
  }
  STRATA_CHECK(std::all_of(rows.begin(), rows.end(), [](const ScaleRow& r) { return r.best; }))
      << "no layout fits the device's memory at some GPU count (see above)";
  return 0;
}

}  // namespace

int run_simulate(const SimulateOptions& o) {
  STRATA_CHECK(o.trace.empty() || !o.search) << "--trace needs a single layout, not --search";
  Setup s = setup(o);
  return o.search ? run_search(o, s) : run_single(o, s);
}

}  // namespace strata::tools
