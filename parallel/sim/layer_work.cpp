// Per-layer work and tape memory (see layer_work.h).
//
// Formulas (per sample; T tokens, C width, H heads, F mlp hidden, V vocabulary, e bytes of the
// compute dtype; masks are u8, log-sum-exp f32, normalization statistics in the compute dtype):
//   transformer_block  keeps its input; own: both norms' statistics 4 T e, the attention input
//                      (pre-norm: ln1's output; post-norm: the block input, i.e. its input again),
//                      q, k, v, the attention output and the merged heads 5 T C e (+ T C e for
//                      pre-norm's ln1 output), the residual sum that ln2 (pre-norm) or ln1
//                      (post-norm) reads T C e, the MLP input (pre-norm: ln2's output) T C e, the
//                      fc output and GELU output 2 T F e, probabilities H T^2 e (CPU only),
//                      log-sum-exp 4 H T, dropout masks T C each (attention, attention output,
//                      MLP output; when their rate is not 0); post-norm also keeps ln2's input
//                      (the second residual sum) T C e.
//   token_embedding    keeps its input (ids); own: the dropout mask T C.
//   bert_embedding     own: copies of the ids and types (two of its three input rows), the sum of
//                      the embeddings T C e, statistics 2 T e, the dropout mask T C.
//   lm_head            keeps its input; own: statistics 2 T e, ln_f's output T C e.
//   mlm_head           keeps its input; own: dense output and GELU output 2 T C e, statistics
//                      2 T e, the norm's output T C e.
// Kernel temporaries (beyond inputs, outputs, tapes and gradients; measured with the probe on the
// CPU at two sequence lengths and written in the same terms):
//   transformer_block  forward T C e; backward 2 T F e + 3 T C e (pre-norm) or 5 T C e (post).
//   token_embedding    forward T C e; backward T C e + the position gradient's sum T C x 4 (once
//                      per micro-batch, not per sample).
//   bert_embedding     forward 2 T C e; backward 2 T C e + T C x 4 (once).
//   lm_head / mlm_head backward T C e / 3 T C e.
// Memory-bound bytes moved by the forward of the same layers (for the device model's time):
//   transformer_block  24 T C e + 2 T F e + 3 T C (masks): two norms, the q/k/v split and head
//                      merge, three dropouts, two residual adds, GELU.
//   token_embedding    7 T C e + T C (gather, the position add, dropout);
//   bert_embedding     9 T C e + T C; lm_head/mlm_head 2 T C e (+ 4 T C e for mlm's dense, GELU,
//                      norm) + 3 T V e (the loss reads the logits and writes their gradient).
#include "parallel/sim/layer_work.h"

#include <cstring>
#include <set>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/exec_context.h"
#include "graph/model.h"
#include "graph/param_store.h"

namespace strata::parallel::sim {
namespace {

double specs_bytes(const graph::TensorSpecs& specs, DType compute) {
  double bytes = 0.0;
  for (const graph::TensorSpec& s : specs) {
    const DType d = is_floating(s.dtype) ? compute : s.dtype;
    bytes += static_cast<double>(shape_numel(s.shape)) * static_cast<double>(dtype_size(d));
  }
  return bytes;
}

bool is(const graph::Layer& layer, const char* type) {
  return std::strcmp(layer.type(), type) == 0;
}

bool is_transformer_family(const graph::Layer& layer) {
  return is(layer, "transformer_block") || is(layer, "token_embedding") ||
         is(layer, "bert_embedding") || is(layer, "lm_head") || is(layer, "mlm_head");
}

// (T, C) of a hidden-state input.
std::pair<double, double> tokens_width(const graph::Model& model, size_t i) {
  const Shape& in = model.shape_before(i);
  STRATA_CHECK_EQ(in.size(), 2u) << "layer " << model.layer(i).name() << " ("
                                 << model.layer(i).type() << "): expected (T, C) samples, got "
                                 << shape_str(in);
  return {static_cast<double>(in[0]), static_cast<double>(in[1])};
}

void transformer_formula(const graph::Model& model, size_t i, const proto::LayerSpec& spec,
                         const WorkOptions& o, LayerWork* w) {
  const graph::Layer& layer = model.layer(i);
  const double e = static_cast<double>(dtype_size(o.compute));
  const double u8 = 1.0;
  if (is(layer, "transformer_block")) {
    const auto [t, c] = tokens_width(model, i);
    const proto::TransformerBlockSpec& b = spec.transformer_block();
    const double h = static_cast<double>(b.heads());
    const double f =
        static_cast<double>(b.has_mlp_hidden() ? b.mlp_hidden() : 4 * static_cast<int64_t>(c));
    const bool drop = o.training && b.dropout() > 0.0;
    const bool attn_drop = o.training && b.attention_dropout() > 0.0;
    double own = 4 * t * e + 5 * t * c * e + t * c * e + t * c * e + 2 * t * f * e + 4 * h * t;
    if (b.pre_norm()) own += t * c * e;   // ln1's output (post-norm: the input itself)
    if (!b.pre_norm()) own += t * c * e;  // the second residual sum (ln2's input)
    if (o.attention_probs) own += h * t * t * e;
    if (attn_drop) own += t * c * u8;
    if (drop) own += 2 * t * c * u8;
    w->own_saved = {0.0, own};
    w->saves_input = true;
    w->attention_flops = 4.0 * t * t * c;
    w->forward_workspace = {0.0, t * c * e};
    w->backward_workspace = {0.0, 2 * t * f * e + (b.pre_norm() ? 3 : 5) * t * c * e};
    w->memory_bytes = 24 * t * c * e + 2 * t * f * e + 3 * t * c * u8;
    w->kernels = 17;
  } else if (is(layer, "token_embedding")) {
    const double t = static_cast<double>(model.shape_before(i).at(0));
    const double c = static_cast<double>(model.shape_before(i + 1).at(1));
    const bool drop = o.training && spec.token_embedding().dropout() > 0.0;
    w->own_saved = {0.0, drop ? t * c * u8 : 0.0};
    w->saves_input = true;
    w->forward_workspace = {0.0, t * c * e};
    w->backward_workspace = {t * c * 4.0, t * c * e};  // + the position gradient's sum (f32)
    w->memory_bytes = 7 * t * c * e + t * c * u8;
    w->kernels = 3;
  } else if (is(layer, "bert_embedding")) {
    const double t = static_cast<double>(model.shape_before(i).back());
    const double c = static_cast<double>(model.shape_before(i + 1).at(1));
    const bool drop = o.training && spec.bert_embedding().dropout() > 0.0;
    // ids and types are copied out of the (3, T) input rows.
    w->own_saved = {0.0,
                    t * c * e + 2 * t * e + (drop ? t * c * u8 : 0.0) + 2.0 / 3.0 * w->input_bytes};
    w->forward_workspace = {0.0, 2 * t * c * e};
    w->backward_workspace = {t * c * 4.0, 2 * t * c * e};
    w->memory_bytes = 9 * t * c * e + t * c * u8;
    w->kernels = 6;
  } else if (is(layer, "lm_head") || is(layer, "mlm_head")) {
    const auto [t, c] = tokens_width(model, i);
    const double v = static_cast<double>(model.shape_before(i + 1).at(1));
    const bool mlm = is(layer, "mlm_head");
    w->own_saved = {0.0, 2 * t * e + t * c * e + (mlm ? 2 * t * c * e : 0.0)};
    w->saves_input = true;
    w->backward_workspace = {0.0, (mlm ? 3 : 1) * t * c * e};
    w->memory_bytes = 2 * t * c * e + (mlm ? 4 * t * c * e : 0.0) + 3 * t * v * e;
    w->kernels = mlm ? 6 : 4;
  }
  w->matmul_flops = layer.forward_flops(model.specs_before(i)) - w->attention_flops;
  w->memory_source = "formula";
}

std::set<const Storage*> storages(const TensorList& tensors) {
  std::set<const Storage*> s;
  for (const Tensor& t : tensors) {
    if (t.defined()) s.insert(t.storage().get());
  }
  return s;
}

// Runs layer i alone on `rows` samples; returns (own bytes, saves input, saves output).
struct ProbeResult {
  double own = 0.0;
  bool saves_input = false, saves_output = false;
  double forward_workspace = 0.0, backward_workspace = 0.0;
};

ProbeResult probe_rows(graph::Model& model, size_t i, DType compute, int64_t rows) {
  CpuAllocator allocator(/*caching=*/false);
  ExecContext ctx(Device::cpu(), &allocator, 1);
  graph::ParamStore store(model, i, i + 1, allocator, DType::kF32, compute);
  store.initialize(1);
  if (compute != DType::kF32) store.load_working(ctx);
  TensorList inputs;
  for (const graph::TensorSpec& s : model.specs_before(i)) {
    Shape shape{rows};
    shape.insert(shape.end(), s.shape.begin(), s.shape.end());
    const DType d = is_floating(s.dtype) ? compute : s.dtype;
    inputs.push_back(is_floating(d) ? Tensor::full(shape, 0.5, d, &allocator)
                                    : Tensor::zeros(shape, d, &allocator));
  }
  LayerTape tape;
  tape.rng = RngOffsets{1, static_cast<uint64_t>(i), 0, 0};
  tape.training = true;
  tape.needs_input_grad = i > 0;
  tape.input_shape = inputs.empty() ? Shape{} : inputs[0].shape();
  const double before = static_cast<double>(allocator.stats().current);
  allocator.reset_peak();
  const TensorList outputs = model.layer(i).forward(ctx, inputs, tape);
  const MemoryStats after = allocator.stats();
  ProbeResult r;
  r.forward_workspace = static_cast<double>(after.peak) - static_cast<double>(after.current);
  // Backward from output gradients of the outputs' shapes (integer outputs get none).
  TensorList grads;
  for (const Tensor& y : outputs) {
    grads.push_back(y.defined() && is_floating(y.dtype())
                        ? Tensor::full(y.shape(), 0.25, y.dtype(), &allocator)
                        : Tensor());
  }
  allocator.reset_peak();
  const TensorList grad_inputs = model.layer(i).backward(ctx, grads, tape);
  const MemoryStats done = allocator.stats();
  r.backward_workspace = static_cast<double>(done.peak) - static_cast<double>(done.current);
  (void)before;
  (void)grad_inputs;
  const std::set<const Storage*> in = storages(inputs), out = storages(outputs);
  for (const Storage* s : storages(tape.saved)) {
    if (in.count(s) != 0) {
      r.saves_input = true;
    } else if (out.count(s) != 0) {
      r.saves_output = true;
    } else {
      r.own += static_cast<double>(s->nbytes());
    }
  }
  return r;
}

void fill_sizes(const graph::Model& model, size_t i, DType compute, LayerWork* w) {
  const graph::Layer& layer = model.layer(i);
  w->name = layer.name();
  w->type = layer.type();
  w->input_bytes = specs_bytes(model.specs_before(i), compute);
  w->output_bytes = specs_bytes(model.specs_before(i + 1), compute);
  for (const graph::ParamSpec& p : layer.param_specs()) {
    const double bytes = 4.0 * static_cast<double>(shape_numel(p.shape));
    w->param_bytes += bytes;
    if (!p.tied_to.empty()) {
      w->tied_bytes += bytes;
      const std::optional<size_t> owner = model.find_param_layer(p.tied_to);
      STRATA_CHECK(owner.has_value()) << "layer " << layer.name() << ": parameter " << p.name
                                      << " is tied to " << p.tied_to << ", which no layer holds";
      w->tied_owner = static_cast<int64_t>(*owner);
    }
  }
}

}  // namespace

LayerWork probe_layer(const graph::Model& model, size_t layer, DType compute) {
  graph::Model& m = const_cast<graph::Model&>(model);  // bound to a throwaway store, then unbound
  LayerWork w;
  fill_sizes(model, layer, compute, &w);
  const ProbeResult one = probe_rows(m, layer, compute, 1);
  const ProbeResult two = probe_rows(m, layer, compute, 2);
  w.own_saved.per_sample = two.own - one.own;
  w.own_saved.fixed = one.own - w.own_saved.per_sample;
  w.saves_input = one.saves_input;
  w.saves_output = one.saves_output;
  w.forward_workspace.per_sample = two.forward_workspace - one.forward_workspace;
  w.forward_workspace.fixed = one.forward_workspace - w.forward_workspace.per_sample;
  w.backward_workspace.per_sample = two.backward_workspace - one.backward_workspace;
  w.backward_workspace.fixed = one.backward_workspace - w.backward_workspace.per_sample;
  w.memory_source = "probe";
  return w;
}

std::vector<LayerWork> model_work(const graph::Model& model, const proto::ModelSpec* spec,
                                  const WorkOptions& options) {
  if (spec != nullptr) {
    STRATA_CHECK_EQ(static_cast<size_t>(spec->layer_size()), model.size())
        << "model_work: the spec of " << spec->name() << " has " << spec->layer_size()
        << " layers, the model " << model.size();
  }
  std::vector<LayerWork> work;
  for (size_t i = 0; i < model.size(); ++i) {
    const graph::Layer& layer = model.layer(i);
    if (spec != nullptr) {
      STRATA_CHECK_EQ(spec->layer(static_cast<int>(i)).name(), layer.name())
          << "model_work: layer " << i << " of the spec is not the model's";
    }
    LayerWork w;
    if (is_transformer_family(layer)) {
      STRATA_CHECK(spec != nullptr) << "model_work: layer " << layer.name() << " (" << layer.type()
                                    << ") needs the model's spec";
      fill_sizes(model, i, options.compute, &w);
      transformer_formula(model, i, spec->layer(static_cast<int>(i)), options, &w);
    } else {
      if (options.probe) {
        w = probe_layer(model, i, options.compute);
      } else {
        fill_sizes(model, i, options.compute, &w);
        // Without the probe: a layer with parameters keeps its input, one without its output.
        w.saves_input = w.param_bytes > 0.0;
        w.saves_output = !w.saves_input;
        w.memory_source = "rule";
      }
      w.matmul_flops = layer.forward_flops(model.specs_before(i));
      w.memory_bytes = w.matmul_flops > 0.0 ? 0.0 : w.input_bytes + w.output_bytes;
      w.kernels = 1;
    }
    work.push_back(std::move(w));
  }
  return work;
}

}  // namespace strata::parallel::sim
