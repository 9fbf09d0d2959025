// ModelSpec <-> text, and the explicit factory from LayerSpec to Layer (no registrars: the list
// of types is the switch below).
#include "graph/model_spec.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <fstream>
#include <sstream>

#include "engine/check.h"
#include "graph/layers.h"
#include "graph/resnet_block.h"
#include "graph/transformer.h"

namespace strata::graph {
namespace {

class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  explicit CollectErrors(std::string source) : source_(std::move(source)) {}
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!first_.empty()) return;
    std::ostringstream s;
    s << source_ << ":" << line + 1 << ":" << column + 1 << ": " << message;
    first_ = s.str();
  }
  const std::string& first() const { return first_; }

 private:
  std::string source_;
  std::string first_;
};

std::string layer_label(int index, const proto::LayerSpec& l) {
  std::ostringstream s;
  s << "layer " << index << " ('" << l.name() << "', type '" << l.type() << "')";
  return s.str();
}

std::string valid_types() {
  std::string list;
  for (const std::string& t : spec_layer_types()) list += (list.empty() ? "" : ", ") + t;
  return list;
}

ops::Pool2dParams pool_params(const proto::PoolSpec& p) {
  ops::Pool2dParams params;
  params.kernel_h = params.kernel_w = p.kernel_size();
  params.stride_h = params.stride_w = p.has_stride() ? p.stride() : p.kernel_size();
  params.pad_h = params.pad_w = p.padding();
  params.ceil_mode = p.ceil_mode();
  params.count_include_pad = p.count_include_pad();
  return params;
}

std::unique_ptr<Layer> make_layer(int index, const proto::LayerSpec& l, const TensorSpecs& inputs) {
  const std::string& type = l.type();
  const std::string name = l.name();
  const std::string where = layer_label(index, l);
  // Layers of several inputs or outputs.
  if (type == "transformer_block")
    return make_transformer_block(name, inputs, l.transformer_block());
  if (type == "token_embedding") return make_token_embedding(name, inputs, l.token_embedding());
  if (type == "bert_embedding") return make_bert_embedding(name, inputs, l.bert_embedding());
  if (type == "lm_head") return make_lm_head(name, inputs, l.lm_head());
  if (type == "mlm_head") return make_mlm_head(name, inputs, l.mlm_head());
  // One input, one output.
  STRATA_CHECK_EQ(inputs.size(), 1u) << where << ": takes one input, got " << specs_str(inputs);
  const Shape& in = inputs[0].shape;
  if (type == "resnet_block") {
    STRATA_CHECK_EQ(in.size(), 3u)
        << where << ": resnet_block needs (C, H, W) samples, got " << shape_str(in);
    return make_resnet_block(name, in, l.resnet_block());
  }
  if (type == "conv2d") {
    const proto::Conv2dSpec& c = l.conv2d();
    STRATA_CHECK(c.out_channels() > 0) << where << ": conv2d.out_channels must be set (> 0)";
    STRATA_CHECK_EQ(in.size(), 3u)
        << where << ": conv2d needs (C, H, W) samples, got " << shape_str(in);
    ops::Conv2dParams p;
    p.stride_h = p.stride_w = c.stride();
    p.pad_h = p.pad_w = c.padding();
    p.dilation_h = p.dilation_w = c.dilation();
    p.groups = c.groups();
    const int64_t kh = c.has_kernel_h() ? c.kernel_h() : c.kernel_size();
    const int64_t kw = c.has_kernel_w() ? c.kernel_w() : c.kernel_size();
    return std::make_unique<Conv2dLayer>(name, in, c.out_channels(), kh, kw, p, c.bias());
  }
  if (type == "linear") {
    STRATA_CHECK(l.linear().out_features() > 0)
        << where << ": linear.out_features must be set (> 0)";
    STRATA_CHECK(!in.empty()) << where << ": linear needs at least 1-D samples";
    return std::make_unique<LinearLayer>(name, in.back(), l.linear().out_features(),
                                         l.linear().bias());
  }
  if (type == "relu") return std::make_unique<ReluLayer>(name);
  if (type == "gelu") return std::make_unique<GeluLayer>(name);
  if (type == "max_pool2d" || type == "avg_pool2d") {
    STRATA_CHECK_EQ(in.size(), 3u)
        << where << ": pooling needs (C, H, W) samples, got " << shape_str(in);
    if (type == "max_pool2d")
      return std::make_unique<MaxPool2dLayer>(name, in, pool_params(l.pool()));
    return std::make_unique<AvgPool2dLayer>(name, in, pool_params(l.pool()));
  }
  if (type == "adaptive_avg_pool2d") {
    STRATA_CHECK_EQ(in.size(), 3u)
        << where << ": pooling needs (C, H, W) samples, got " << shape_str(in);
    return std::make_unique<AdaptiveAvgPool2dLayer>(name, in, l.adaptive_pool().output_h(),
                                                    l.adaptive_pool().output_w());
  }
  if (type == "batch_norm") {
    return std::make_unique<BatchNormLayer>(name, in, l.batch_norm().momentum(),
                                            l.batch_norm().eps(), l.batch_norm().affine());
  }
  if (type == "layer_norm") {
    STRATA_CHECK(!in.empty()) << where << ": layer_norm needs at least 1-D samples";
    return std::make_unique<LayerNormLayer>(name, in.back(), l.layer_norm().eps(),
                                            l.layer_norm().affine());
  }
  if (type == "dropout") return std::make_unique<DropoutLayer>(name, l.dropout().p());
  if (type == "flatten") return std::make_unique<FlattenLayer>(name);
  STRATA_THROW() << where << ": unknown layer type '" << type << "' (valid: " << valid_types()
                 << ")";
}

}  // namespace

const std::vector<std::string>& spec_layer_types() {
  static const std::vector<std::string> kTypes{"conv2d",
                                               "linear",
                                               "relu",
                                               "gelu",
                                               "max_pool2d",
                                               "avg_pool2d",
                                               "adaptive_avg_pool2d",
                                               "batch_norm",
                                               "layer_norm",
                                               "dropout",
                                               "flatten",
                                               "resnet_block",
                                               "transformer_block",
                                               "token_embedding",
                                               "bert_embedding",
                                               "lm_head",
                                               "mlm_head"};
  return kTypes;
}

proto::ModelSpec parse_model_spec(const std::string& text, const std::string& source) {
  proto::ModelSpec spec;
  CollectErrors errors(source);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  const bool ok = parser.ParseFromString(text, &spec);
  STRATA_CHECK(ok) << "bad model spec " << (errors.first().empty() ? source : errors.first());
  return spec;
}

proto::ModelSpec load_model_spec(const std::string& path) {
  std::ifstream in(path);
  STRATA_CHECK(in.good()) << "cannot open model spec '" << path
                          << "' (pass an existing .prototxt file)";
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_model_spec(buffer.str(), path);
}

std::string model_spec_to_text(const proto::ModelSpec& spec) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(spec, &text);
  return text;
}

std::unique_ptr<Model> build_model(const proto::ModelSpec& spec) {
  const std::string model_name = spec.has_name() ? spec.name() : "model";
  STRATA_CHECK(spec.has_input() && spec.input().shape_size() > 0)
      << "model spec '" << model_name << "' needs input { shape: [...] } (one sample, no batch)";
  Shape input(spec.input().shape().begin(), spec.input().shape().end());
  for (int64_t d : input) {
    STRATA_CHECK_GT(d, 0) << "model spec '" << model_name << "': input shape " << shape_str(input)
                          << " must be positive";
  }
  STRATA_CHECK_GT(spec.layer_size(), 0) << "model spec '" << model_name << "' has no layers";
  auto model = std::make_unique<Model>(model_name, input, parse_dtype(spec.input().dtype()));
  for (int i = 0; i < spec.layer_size(); ++i) {
    proto::LayerSpec layer = spec.layer(i);
    if (layer.name().empty()) layer.set_name(layer.type() + std::to_string(i));
    try {
      model->add(make_layer(i, layer, model->output_specs()));
    } catch (const Error& e) {
      STRATA_THROW() << "model spec '" << model_name << "', " << layer_label(i, layer) << ": "
                     << e.message();
    }
  }
  return model;
}

}  // namespace strata::graph
