// Flat-buffer layout and name-keyed initialization of parameters.
#include "graph/param_store.h"

#include "engine/check.h"
#include "engine/cuda_runtime.h"
#include "engine/philox.h"
#include "graph/model.h"
#include "ops/precision.h"

namespace strata::graph {
namespace {

constexpr int64_t kAlign = 16;  // elements

int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

void fill_init(const Tensor& t, const ParamInit& init, uint64_t seed, const std::string& key) {
  switch (init.kind) {
    case ParamInit::Kind::kZeros:
      t.zero_();
      return;
    case ParamInit::Kind::kOnes:
      t.fill_(1.0);
      return;
    case ParamInit::Kind::kUniform:
    case ParamInit::Kind::kNormal:
      break;
  }
  PhiloxStream rng(seed, stable_hash(key));
  Tensor values = Tensor::empty(t.shape(), DType::kF64);
  double* p = values.data<double>();
  for (int64_t i = 0; i < values.numel(); ++i) {
    p[i] = init.kind == ParamInit::Kind::kUniform ? init.scale * (2.0 * rng.next_uniform() - 1.0)
                                                  : init.scale * rng.next_normal();
  }
  t.copy_from(values);
}

}  // namespace

ParamStore::ParamStore(Model& model, size_t begin, size_t end, Allocator& allocator, DType dtype,
                       DType compute)
    : model_(&model),
      begin_(begin),
      end_(end),
      allocator_(&allocator),
      dtype_(dtype),
      compute_(compute) {
  STRATA_CHECK(begin <= end && end <= model.size())
      << "ParamStore: layer range [" << begin << ", " << end << ") outside model " << model.name();
  STRATA_CHECK(dtype == DType::kF32 || dtype == DType::kF64)
      << "ParamStore keeps f32 (or f64 for gradient checks) master weights, got "
      << dtype_name(dtype);
  if (compute_ == DType::kF32) compute_ = dtype_;  // f64 gradient checks compute in f64
  STRATA_CHECK(compute_ == dtype_ ||
               (dtype_ == DType::kF32 && (compute_ == DType::kBF16 || compute_ == DType::kF16)))
      << "ParamStore: layers over " << dtype_name(dtype_) << " master weights compute in "
      << dtype_name(dtype_) << ", bf16 or f16, not " << dtype_name(compute_);
  int64_t param_elems = 0, buffer_elems = 0;
  for (size_t i = begin; i < end; ++i) {
    const Layer& layer = model.layer(i);
    for (const ParamSpec& spec : layer.param_specs()) {
      Entry e{i,          layer.name(),      spec.name,
              spec.shape, param_elems,       shape_numel(spec.shape),
              spec.init,  spec.weight_decay, spec.tied_to,
              false,      spec.valid_rows};
      STRATA_CHECK(
          spec.valid_rows >= 0 &&
          (spec.valid_rows == 0 || (!spec.shape.empty() && spec.valid_rows <= spec.shape[0])))
          << "parameter " << e.full_name() << " " << shape_str(spec.shape) << ": valid_rows "
          << spec.valid_rows << " must be in [0, " << (spec.shape.empty() ? 0 : spec.shape[0])
          << "]";
      if (!spec.tied_to.empty()) {
        for (const Entry& owner : param_entries_) {
          if (owner.full_name() != spec.tied_to) continue;
          STRATA_CHECK(owner.shape == spec.shape && owner.valid_rows == spec.valid_rows)
              << "parameter " << e.full_name() << " " << shape_str(spec.shape) << " (valid rows "
              << spec.valid_rows << ") is tied to " << spec.tied_to << " of shape "
              << shape_str(owner.shape) << " (valid rows " << owner.valid_rows << ")";
          e.offset = owner.offset;
          e.weight_decay = owner.weight_decay;
          e.alias = true;
        }
      }
      if (!e.alias) param_elems += align_up(e.numel);
      param_entries_.push_back(std::move(e));
    }
    for (const ParamSpec& spec : layer.buffer_specs()) {
      Entry e{i,         layer.name(), spec.name, spec.shape, buffer_elems, shape_numel(spec.shape),
              spec.init, false,        "",        false};
      buffer_elems += align_up(e.numel);
      buffer_entries_.push_back(std::move(e));
    }
  }
  params_ = Tensor::empty({param_elems}, dtype, allocator_);
  grads_ = Tensor::zeros({param_elems}, dtype, allocator_);
  buffers_ = Tensor::empty({buffer_elems}, dtype, allocator_);
  params_.zero_();  // alignment padding stays zero forever
  buffers_.zero_();
  if (mixed()) {
    work_params_ = Tensor::zeros({param_elems}, compute_, allocator_);
    work_grads_ = Tensor::zeros({param_elems}, compute_, allocator_);
  }
  bind_layers();
}

void ParamStore::bind_layers() {
  // The layers compute on the working copies under mixed precision, on the masters otherwise.
  // Buffers (running statistics) have no 16-bit copy: the layers update the f32 masters in place
  // (ops/batch_norm.h keeps statistics in f32 under bf16/f16).
  const Tensor& bound_params = mixed() ? work_params_ : params_;
  const Tensor& bound_grads = mixed() ? work_grads_ : grads_;
  const Tensor& bound_buffers = buffers_;
  size_t pi = 0, bi = 0;
  for (size_t i = begin_; i < end_; ++i) {
    Layer& layer = model_->layer(i);
    LayerParams views;
    for (; pi < param_entries_.size() && param_entries_[pi].layer_index == i; ++pi) {
      views.params.push_back(view_of(bound_params, param_entries_[pi]));
      views.grads.push_back(view_of(bound_grads, param_entries_[pi]));
    }
    for (; bi < buffer_entries_.size() && buffer_entries_[bi].layer_index == i; ++bi) {
      views.buffers.push_back(view_of(bound_buffers, buffer_entries_[bi]));
    }
    layer.bind(std::move(views), this);
  }
}

ParamStore::~ParamStore() {
  for (size_t i = begin_; i < end_; ++i) model_->layer(i).unbind(this);
}

void ParamStore::initialize(uint64_t seed) {
  for (size_t i = 0; i < param_entries_.size(); ++i) {
    const Entry& e = param_entries_[i];
    if (e.alias) continue;  // its owner's values are its values
    // Padding rows are drawn too (after the valid ones, row-major: the valid rows get the values
    // an unpadded parameter would), then zeroed.
    fill_init(param(i), e.init, seed, e.init_key());
    if (e.valid_numel() < e.numel)
      param(i).narrow(0, e.valid_rows, e.shape[0] - e.valid_rows).zero_();
  }
  for (size_t i = 0; i < buffer_entries_.size(); ++i) {
    fill_init(buffer(i), buffer_entries_[i].init, seed, buffer_entries_[i].full_name());
  }
}

void ParamStore::zero_grads() {
  grads_.zero_();
  if (mixed()) work_grads_.zero_();
}

namespace {
void zero_on_stream(ExecContext& ctx, const Tensor& t) {
  if (t.numel() == 0) return;
  if (t.device().is_cuda() && ctx.device() == t.device()) {
    cuda::memset_async(t.raw_data(), 0, t.nbytes(), cuda::exec_stream(ctx.cuda()));
  } else {
    t.zero_();
  }
}
}  // namespace

void ParamStore::zero_grads(ExecContext& ctx) {
  zero_on_stream(ctx, grads_);
  if (mixed()) zero_on_stream(ctx, work_grads_);
}

const Tensor& ParamStore::working_params() const { return mixed() ? work_params_ : params_; }
const Tensor& ParamStore::working_grads() const { return mixed() ? work_grads_ : grads_; }
const Tensor& ParamStore::working_buffers() const { return buffers_; }

void ParamStore::load_working(ExecContext& ctx) { load_working_params(ctx); }

void ParamStore::load_working_params(ExecContext& ctx) {
  if (mixed() && params_.numel() > 0) ops::cast_copy_(ctx, work_params_, params_);
}

void ParamStore::flush_grads(ExecContext& ctx) {
  if (mixed() && grads_.numel() > 0) ops::move_add_(ctx, grads_, work_grads_);
}

void ParamStore::flush_layer_grads(ExecContext& ctx, size_t layer_index) {
  if (!mixed()) return;
  // A layer's own entries are adjacent in the flat buffers (aliases point at an earlier layer).
  int64_t lo = -1, hi = -1;
  for (const Entry& e : param_entries_) {
    if (e.layer_index != layer_index || e.alias) continue;
    if (lo < 0) lo = e.offset;
    hi = e.offset + e.numel;
  }
  if (lo < 0) return;
  ops::move_add_(ctx, grads_.narrow(0, lo, hi - lo), work_grads_.narrow(0, lo, hi - lo));
}

Tensor ParamStore::view_of(const Tensor& flat, const Entry& e) const {
  return flat.narrow(0, e.offset, e.numel).view(e.shape);
}

Tensor ParamStore::param(size_t i) const {
  STRATA_CHECK_LT(i, param_entries_.size()) << "ParamStore::param";
  return view_of(params_, param_entries_[i]);
}

Tensor ParamStore::grad(size_t i) const {
  STRATA_CHECK_LT(i, param_entries_.size()) << "ParamStore::grad";
  return view_of(grads_, param_entries_[i]);
}

Tensor ParamStore::buffer(size_t i) const {
  STRATA_CHECK_LT(i, buffer_entries_.size()) << "ParamStore::buffer";
  return view_of(buffers_, buffer_entries_[i]);
}

int64_t ParamStore::num_params() const {
  int64_t n = 0;
  for (const Entry& e : param_entries_) n += e.alias ? 0 : e.valid_numel();
  return n;
}

std::vector<size_t> ParamStore::tied_copies() const {
  std::vector<size_t> copies;
  for (size_t i = 0; i < param_entries_.size(); ++i) {
    if (!param_entries_[i].tied_to.empty() && !param_entries_[i].alias) copies.push_back(i);
  }
  return copies;
}

void ParamStore::ensure_state(size_t slots) {
  while (state_.size() < slots)
    state_.push_back(Tensor::zeros(params_.shape(), dtype_, allocator_));
}

ParamStore::FlatBuffers ParamStore::flat_buffers() {
  FlatBuffers f;
  f.params = &params_;
  f.grads = &grads_;
  f.buffers = &buffers_;
  for (Tensor& t : state_) f.state.push_back(&t);
  if (mixed()) {
    f.working_params = &work_params_;
    f.working_grads = &work_grads_;
  }
  return f;
}

const Tensor& ParamStore::state(size_t slot) const {
  STRATA_CHECK_LT(slot, state_.size()) << "ParamStore: optimizer state slot not allocated";
  return state_[slot];
}

Tensor ParamStore::state_view(size_t slot, size_t i) const {
  STRATA_CHECK_LT(i, param_entries_.size()) << "ParamStore::state_view";
  return view_of(state(slot), param_entries_[i]);
}

Tensor ParamStore::bound_buffers(size_t first_layer, size_t end_layer) const {
  int64_t begin = -1, end = -1;
  for (const Entry& e : buffer_entries_) {
    if (e.layer_index < first_layer || e.layer_index >= end_layer) continue;
    if (begin < 0) begin = e.offset;
    end = e.offset + e.numel;
  }
  if (begin < 0) return Tensor();
  return buffers_.narrow(0, begin, end - begin);  // the layers are bound to the f32 statistics
}

}  // namespace strata::graph
