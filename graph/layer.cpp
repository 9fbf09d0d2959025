#include "graph/layer.h"

#include "engine/check.h"

namespace strata::graph {

std::string specs_str(const TensorSpecs& specs) {
  std::string s;
  for (const TensorSpec& t : specs) {
    s += (s.empty() ? "" : ", ") + std::string(dtype_name(t.dtype)) + " " + shape_str(t.shape);
  }
  return s;
}

TensorSpecs Layer::output_specs(const TensorSpecs& inputs) const {
  STRATA_CHECK_EQ(inputs.size(), 1u)
      << "layer " << name_ << " (" << type() << ") takes one input, got " << specs_str(inputs);
  return {TensorSpec{output_shape(inputs[0].shape), inputs[0].dtype}};
}

Shape Layer::output_shape(const Shape& input_shape) const {
  STRATA_THROW() << "layer " << name_ << " (" << type()
                 << ") does not map one input shape to one output shape; use output_specs";
}

void Layer::bind(LayerParams params, const void* owner) {
  const std::vector<ParamSpec> specs = param_specs();
  const std::vector<ParamSpec> buffers = buffer_specs();
  STRATA_CHECK(params.params.size() == specs.size() && params.grads.size() == specs.size())
      << "layer " << name_ << ": bound " << params.params.size() << " parameters and "
      << params.grads.size() << " gradients, expected " << specs.size();
  STRATA_CHECK_EQ(params.buffers.size(), buffers.size())
      << "layer " << name_ << ": wrong number of buffers bound";
  for (size_t i = 0; i < specs.size(); ++i) {
    STRATA_CHECK(params.params[i].shape() == specs[i].shape &&
                 params.grads[i].shape() == specs[i].shape)
        << "layer " << name_ << ": parameter " << specs[i].name << " bound with shape "
        << params.params[i].shape_str() << ", expected " << shape_str(specs[i].shape);
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    STRATA_CHECK(params.buffers[i].shape() == buffers[i].shape)
        << "layer " << name_ << ": buffer " << buffers[i].name << " bound with shape "
        << params.buffers[i].shape_str() << ", expected " << shape_str(buffers[i].shape);
  }
  params_ = std::move(params);
  bound_ = true;
  owner_ = owner;
}

void Layer::unbind(const void* owner) {
  if (!bound_ || owner_ != owner) return;
  params_ = LayerParams{};
  bound_ = false;
  owner_ = nullptr;
}

const Tensor& Layer::param(size_t i) const {
  STRATA_CHECK(bound_) << "layer " << name_ << " used before its parameters were bound";
  STRATA_CHECK_LT(i, params_.params.size()) << "layer " << name_;
  return params_.params[i];
}

const Tensor& Layer::grad(size_t i) const {
  STRATA_CHECK(bound_) << "layer " << name_ << " used before its parameters were bound";
  STRATA_CHECK_LT(i, params_.grads.size()) << "layer " << name_;
  return params_.grads[i];
}

const Tensor& Layer::buffer(size_t i) const {
  STRATA_CHECK(bound_) << "layer " << name_ << " used before its buffers were bound";
  STRATA_CHECK_LT(i, params_.buffers.size()) << "layer " << name_;
  return params_.buffers[i];
}

const Tensor& Layer::single_input(const TensorList& inputs) const {
  STRATA_CHECK(inputs.size() == 1 && inputs[0].defined())
      << "layer " << name_ << " (" << type() << ") takes one input, got " << inputs.size();
  return inputs[0];
}

}  // namespace strata::graph
