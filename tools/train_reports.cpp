// See the header. Every collective here runs at the same steps on every rank (on_rank_step is
// called at every step, and the decisions use only the step and the configuration).
#include "tools/train_reports.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "engine/allocator.h"
#include "engine/check.h"
#include "models/generation.h"
#include "parallel/checkpointing.h"

namespace strata::tools {
namespace {

constexpr int32_t kEndOfText = 50256;  // GPT-2's <|endoftext|>: where a sample starts
constexpr int kHiddenTag = 1, kTokenTag = 2;

Tensor to_host(ExecContext& ctx, const Tensor& t) {
  ctx.synchronize();
  return to_allocator(t.contiguous(), default_cpu_allocator());
}

}  // namespace

TrainReports::TrainReports(const TrainReportsConfig& config, parallel::TrainObserver* console,
                           io::JsonlWriter* metrics, parallel::Communicator* world, int stages)
    : config_(config), console_(console), metrics_(metrics), stages_(stages) {
  rank_ = world != nullptr ? world->rank() : 0;
  if (world != nullptr && world->size() > 1) {
    all_ = world->split(0, world->rank());
    all_->set_timeout(world->timeout());
    const bool group0 = world->rank() < stages;
    pipeline_ = world->split(group0 ? 0 : -1, world->rank());
    if (pipeline_ != nullptr) pipeline_->set_timeout(world->timeout());
  }
  if (rank_ == 0 && !config_.tensorboard.empty()) {
    tensorboard_ = std::make_unique<io::TensorBoardWriter>(config_.tensorboard);
  }
  if (rank_ == 0 && config_.sample_every > 0) {
    tokenizer_ = std::make_unique<io::BpeTokenizer>(io::gpt2_vocab_dir(config_.vocab_dir));
  }
}

void TrainReports::attach(ExecContext& ctx, graph::Model& model, graph::ParamStore& store,
                          size_t begin, size_t end) {
  ctx_ = &ctx;
  model_ = &model;
  store_ = &store;
  begin_ = begin;
  end_ = end;
}

void TrainReports::on_step(const parallel::StepRecord& r) {
  if (console_ != nullptr) console_->on_step(r);
}

void TrainReports::on_log(const parallel::StepRecord& r) {
  if (console_ != nullptr) console_->on_log(r);
  if (tensorboard_ == nullptr) return;
  std::vector<std::pair<std::string, double>> scalars = {
      {"train/loss", r.loss},
      {"train/lr", r.lr},
      {"train/grad_norm", r.grad_norm},
      {"train/samples_per_s", r.samples_per_s},
      {"train/skipped_steps", static_cast<double>(r.skipped_steps)}};
  if (r.loss_scale > 0) scalars.push_back({"train/loss_scale", r.loss_scale});
  tensorboard_->add_scalars(scalars, r.step);
}

void TrainReports::on_migration(const parallel::MigrationRecord& r) {
  if (console_ != nullptr) console_->on_migration(r);
}

void TrainReports::on_repartition(const parallel::RepartitionRecord& r) {
  if (console_ != nullptr) console_->on_repartition(r);
}

void TrainReports::on_eval(const parallel::EvalRecord& r) {
  if (console_ != nullptr) console_->on_eval(r);
  if (tensorboard_ == nullptr) return;
  std::vector<std::pair<std::string, double>> scalars = {
      {"eval/loss", r.loss}, {"eval/accuracy", r.accuracy}, {"eval/top5", r.top5}};
  if (config_.text) scalars.push_back({"eval/perplexity", std::exp(r.loss)});
  tensorboard_->add_scalars(scalars, r.step);
}

void TrainReports::on_rank_step(const parallel::RankStepRecord& r) {
  busy_ += r.busy_seconds;
  wall_ += r.wall_seconds;
  const bool last = r.step == config_.total_steps;
  if (!config_.tensorboard.empty() && (r.step % config_.log_every == 0 || last)) {
    report_ranks(r);
  }
  if (config_.sample_every > 0 && (r.step % config_.sample_every == 0 || last)) {
    const std::string mine = sample(r.step, r.stage);
    // The last stage of group 0 has the text's ids; rank 0 prints them.
    std::string ids = mine;
    if (all_ != nullptr) {
      ids.clear();
      for (const std::string& s : parallel::all_gather_strings(all_.get(), mine)) ids += s;
    }
    if (rank_ == 0) {
      std::vector<int32_t> tokens;
      std::istringstream in(ids);
      for (int32_t id; in >> id;) tokens.push_back(id);
      std::string text = tokenizer_->decode(tokens);
      std::replace(text.begin(), text.end(), '\n', ' ');
      std::printf("sample | step %lld | %s\n", static_cast<long long>(r.step), text.c_str());
      std::fflush(stdout);
      if (metrics_ != nullptr) {
        metrics_->write({{"type", "sample"}, {"step", r.step}, {"text", text}, {"ids", tokens}});
      }
    }
  }
}

void TrainReports::report_ranks(const parallel::RankStepRecord& r) {
  const int n = all_ != nullptr ? all_->size() : 1;
  const MemoryStats mem = ctx_ != nullptr ? ctx_->allocator().stats() : MemoryStats{};
  Tensor all = Tensor::zeros({4 * static_cast<int64_t>(n)}, DType::kF64);
  double* a = all.data<double>() + 4 * rank_;
  a[0] = busy_;
  a[1] = wall_;
  a[2] = static_cast<double>(mem.current);
  a[3] = static_cast<double>(mem.peak);
  busy_ = wall_ = 0.0;
  if (all_ != nullptr) {
    parallel::wait(*all_->all_reduce(all), *all_, "the ranks' busy time and memory");
  }
  if (tensorboard_ == nullptr) return;
  std::vector<std::pair<std::string, double>> scalars;
  for (int k = 0; k < n; ++k) {
    const double* v = all.data<double>() + 4 * k;
    const std::string p = "rank" + std::to_string(k) + "/";
    const double busy = v[1] > 0 ? std::min(1.0, v[0] / v[1]) : 0.0;
    scalars.push_back({p + "busy_fraction", busy});
    scalars.push_back({p + "idle_fraction", 1.0 - busy});
    scalars.push_back({p + "memory_mib", v[2] / (1024.0 * 1024.0)});
    scalars.push_back({p + "peak_memory_mib", v[3] / (1024.0 * 1024.0)});
  }
  tensorboard_->add_scalars(scalars, r.step);
}

std::string TrainReports::sample(int64_t step, int stage) {
  if (stages_ > 1 && pipeline_ == nullptr) return "";  // not group 0
  STRATA_CHECK(model_ != nullptr) << "--sample-every: TrainReports::attach was not called";
  ExecContext& ctx = *ctx_;
  const bool first = stage == 0, last = stage == stages_ - 1;
  const int64_t n = std::min(config_.sample_tokens, config_.positions - 1);
  store_->load_working(ctx);  // mixed precision: the weights of this step
  graph::Decoder decoder(*model_, begin_, end_);
  models::SamplingOptions sampling;
  sampling.seed = config_.seed + static_cast<uint64_t>(step);
  const graph::TensorSpec hidden = model_->specs_before(begin_).at(0);  // (T, C), stages > 0
  int32_t token = kEndOfText;
  std::string ids;
  for (int64_t i = 0; i < n; ++i) {
    Tensor x;
    if (first) {
      x = Tensor::from_vector<int32_t>({token}, {1, 1});
    } else {
      x = Tensor::empty({1, 1, hidden.shape.at(1)}, store_->compute_dtype());
      parallel::wait(*pipeline_->irecv(x, stage - 1, kHiddenTag), *pipeline_,
                     "--sample-every: the hidden state from stage " + std::to_string(stage - 1));
    }
    const Tensor y = decoder.forward(ctx, {to_allocator(x, ctx.allocator())})[0];
    if (!last) {
      const Tensor h = to_host(ctx, y);
      parallel::wait(*pipeline_->isend(h, stage + 1, kHiddenTag), *pipeline_,
                     "--sample-every: the hidden state to stage " + std::to_string(stage + 1));
    } else {
      const Tensor logits = to_host(ctx, y.select(1, 0)).to(DType::kF32);  // (1, V)
      token = models::sample_token(logits.data<float>(), logits.numel(), sampling, i);
      ids += std::to_string(token) + " ";
    }
    if (stages_ > 1 && (first || last)) {
      Tensor t = Tensor::from_vector<int32_t>({token}, {1});
      if (last) {
        parallel::wait(*pipeline_->isend(t, 0, kTokenTag), *pipeline_,
                       "--sample-every: the sampled token to stage 0");
      } else {
        parallel::wait(*pipeline_->irecv(t, stages_ - 1, kTokenTag), *pipeline_,
                       "--sample-every: the sampled token from the last stage");
        token = t.data<int32_t>()[0];
      }
    }
  }
  return ids;
}

// Per rank: utilization, and memory (peak device bytes, swapped bytes, recompute time, the most
// micro-batches whose saved tensors it held); also as {"type":"stage",...} metrics records.
void print_stages(const parallel::TrainSummary& summary,
                  const std::vector<std::string>& layer_names,
                  const parallel::PipelineConfig& pipeline, io::JsonlWriter* metrics) {
  const parallel::MemoryPlan& plan = pipeline.memory_plan;
  const bool planned = plan.uses(parallel::MemoryPolicy::kSwap, 0, layer_names.size()) ||
                       plan.uses(parallel::MemoryPolicy::kRecompute, 0, layer_names.size());
  for (const parallel::StageReport& r : summary.stages) {
    if (metrics == nullptr) break;
    metrics->write({{"type", "stage"},
                    {"rank", r.rank},
                    {"group", r.group},
                    {"stage", r.stage},
                    {"first_layer", layer_names[r.first_layer]},
                    {"last_layer", layer_names[r.end_layer - 1]},
                    {"busy_s", r.busy_seconds},
                    {"wall_s", r.wall_seconds},
                    {"peak_bytes", r.peak_bytes},
                    {"swapped_bytes", r.swapped_bytes},
                    {"swap_pool_peak_bytes", r.swap_pool_peak_bytes},
                    {"recompute_s", r.recompute_seconds},
                    {"swap_wait_s", r.swap_wait_seconds},
                    {"max_micro_batches", r.max_micro_batches},
                    {"injected_s", r.injected_seconds},
                    {"injected_slow_s", r.slow_seconds},
                    {"injected_grow_s", r.grow_seconds},
                    {"injected_load_s", r.load_seconds}});
  }
  if (pipeline.stages * pipeline.groups == 1 && !planned) return;
  std::printf("\n%-5s %-5s %-5s %-26s %8s %8s %6s %10s %10s %9s %6s\n", "rank", "group", "stage",
              "layers", "busy s", "wall s", "idle", "peak MiB", "swap MiB", "recomp s", "mbs");
  for (const parallel::StageReport& r : summary.stages) {
    const std::string layers = layer_names[r.first_layer] + ".." + layer_names[r.end_layer - 1];
    std::printf("%-5d %-5d %-5d %-26s %8.2f %8.2f %5.1f%% %10.2f %10.2f %9.3f %6.0f\n", r.rank,
                r.group, r.stage, layers.c_str(), r.busy_seconds, r.wall_seconds,
                100.0 * r.idle_fraction(), r.peak_bytes / (1 << 20), r.swapped_bytes / (1 << 20),
                r.recompute_seconds, r.max_micro_batches);
  }
  if (pipeline.stages * pipeline.groups > 1) {
    std::printf(
        "bubble: measured %.1f%% (mean idle fraction of the ranks), schedule's ideal %.1f%%\n",
        100.0 * summary.measured_bubble, 100.0 * summary.theoretical_bubble);
  }
}

}  // namespace strata::tools
