// The transformer layers through a Model and a float64 ParamStore: finite-difference gradients of
// every float input and every parameter (tied output weights included, causal and padding masks,
// dropout in training), accumulation, the tied weight across stores, dropout in training versus
// evaluation, and a block against a composition of the ops with attention written out here.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "graph/model.h"
#include "graph/param_store.h"
#include "graph/transformer.h"
#include "ops/activation.h"
#include "ops/layer_norm.h"
#include "ops/matmul.h"
#include "testing/testing.h"

namespace strata::graph {
namespace {

using testing::all_close;
using testing::gradients_match;
using testing::random_ids;
using testing::random_tensor;

// An identity of any number of inputs: put first, so that the layer under test is not the
// model's first and its input gradients are asked for.
class PassThrough final : public Layer {
 public:
  PassThrough() : Layer("input") {}
  const char* type() const override { return "pass_through"; }
  TensorSpecs output_specs(const TensorSpecs& inputs) const override { return inputs; }
  TensorList forward(ExecContext&, const TensorList& inputs, LayerTape&) override { return inputs; }
  TensorList backward(ExecContext&, const TensorList& grads, LayerTape&) override { return grads; }
};

proto::TransformerBlockSpec block_spec(bool pre_norm, bool causal, double dropout,
                                       double attention_dropout) {
  proto::TransformerBlockSpec s;
  s.set_heads(2);
  s.set_mlp_hidden(12);
  s.set_pre_norm(pre_norm);
  s.set_causal(causal);
  s.set_dropout(dropout);
  s.set_attention_dropout(attention_dropout);
  return s;
}

proto::TokenEmbeddingSpec token_spec(double dropout) {
  proto::TokenEmbeddingSpec s;
  s.set_vocab_size(11);
  s.set_width(8);
  s.set_max_positions(7);
  s.set_dropout(dropout);
  return s;
}

proto::BertEmbeddingSpec bert_spec(double dropout) {
  proto::BertEmbeddingSpec s;
  s.set_vocab_size(11);
  s.set_width(8);
  s.set_max_positions(7);
  s.set_type_vocab_size(2);
  s.set_dropout(dropout);
  return s;
}

proto::LmHeadSpec lm_spec(const std::string& tied_to) {
  proto::LmHeadSpec s;
  s.set_vocab_size(11);
  s.set_tied_to(tied_to);
  return s;
}

proto::MlmHeadSpec mlm_spec(const std::string& tied_to) {
  proto::MlmHeadSpec s;
  s.set_vocab_size(11);
  s.set_tied_to(tied_to);
  return s;
}

const TensorSpecs kHidden{TensorSpec{{5, 8}, DType::kF32}};
const TensorSpecs kHiddenAndMask{TensorSpec{{5, 8}, DType::kF32}, TensorSpec{{5}, DType::kI32}};

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<ParamStore> store;
  // Appends a layer made from the model's current outputs.
  template <typename Make>
  Fixture& add(Make make) {
    model->add(make(model->output_specs()));
    return *this;
  }
  // Lays out a float64 store over every layer, with non-trivial parameter values.
  Fixture& finish() {
    store = std::make_unique<ParamStore>(*model, 0, model->size(), default_cpu_allocator(),
                                         DType::kF64);
    store->initialize(7);
    store->params().copy_from(random_tensor(store->params().shape(), 23, -0.5, 0.5));
    return *this;
  }
  Tensor param(const std::string& full_name) const {
    for (size_t i = 0; i < store->param_entries().size(); ++i) {
      if (store->param_entries()[i].full_name() == full_name) return store->param(i);
    }
    ADD_FAILURE() << "no parameter " << full_name;
    return Tensor();
  }
};

Fixture model_of(const TensorSpecs& inputs, bool pass_through) {
  Fixture f;
  f.model = std::make_unique<Model>("test", inputs);
  if (pass_through) f.model->add(std::make_unique<PassThrough>());
  return f;
}

auto block(const std::string& name, const proto::TransformerBlockSpec& spec) {
  return [=](const TensorSpecs& in) { return make_transformer_block(name, in, spec); };
}

ForwardOptions training(bool on) {
  ForwardOptions o;
  o.training = on;
  o.seed = 3;
  o.step = 5;
  o.sample_offset = 2;
  return o;
}

TensorList run_forward(Fixture& f, const TensorList& inputs, const ForwardOptions& options,
                       Tape* tape = nullptr) {
  ExecContext ctx;
  Tape local;
  return f.model->forward(ctx, 0, f.model->size(), inputs, tape ? *tape : local, options);
}

// Finite differences of sum(output 0 * upstream) against the analytic gradients of every float
// input and of the flat parameters (a tied weight is one storage: its gradient is the sum).
::testing::AssertionResult check(Fixture& f, const TensorList& inputs, const ForwardOptions& o) {
  ExecContext ctx;
  Tape tape;
  const TensorList y = f.model->forward(ctx, 0, f.model->size(), inputs, tape, o);
  TensorList dys(y.size());
  dys[0] = random_tensor(y[0].shape(), 99);
  f.store->zero_grads();
  const TensorList dx = f.model->backward(ctx, 0, f.model->size(), dys, tape);
  if (dx.size() != inputs.size()) {
    return ::testing::AssertionFailure()
           << "backward returned " << dx.size() << " gradients for " << inputs.size() << " inputs";
  }
  TensorList args = inputs, analytic;
  for (size_t i = 0; i < inputs.size(); ++i) {
    analytic.push_back(is_floating(inputs[i].dtype()) ? dx[i] : Tensor());
  }
  args.push_back(f.store->params().clone());
  analytic.push_back(f.store->grads().clone());
  auto forward = [&](const TensorList& xs) {
    f.store->params().copy_from(xs.back());
    return run_forward(f, TensorList(xs.begin(), xs.end() - 1), o)[0];
  };
  testing::GradCheckOptions tol;
  tol.atol = 1e-6;
  tol.rtol = 1e-4;
  return gradients_match(forward, args, dys[0], analytic, tol);
}

// Padding at the end of sample 1: (2, 5) i32, 1 attend, 0 padding.
Tensor padding_mask() {
  return Tensor::from_vector<int32_t>({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 5});
}

TEST(TransformerGradients, PreNormCausalBlockWithDropout) {
  Fixture f = model_of(kHidden, true);
  f.add(block("blk", block_spec(true, true, 0.2, 0.3))).finish();
  EXPECT_TRUE(check(f, {random_tensor({2, 5, 8}, 1)}, training(true)));
}

TEST(TransformerGradients, PostNormBlockWithPaddingMaskAndDropout) {
  Fixture f = model_of(kHiddenAndMask, true);
  f.add(block("blk", block_spec(false, false, 0.2, 0.3))).finish();
  EXPECT_TRUE(check(f, {random_tensor({2, 5, 8}, 1), padding_mask()}, training(true)));
}

TEST(TransformerGradients, CausalAndPaddingMasksInEvaluation) {
  for (bool pre_norm : {true, false}) {
    Fixture f = model_of(kHiddenAndMask, true);
    f.add(block("blk", block_spec(pre_norm, true, 0.2, 0.3))).finish();
    EXPECT_TRUE(check(f, {random_tensor({2, 5, 8}, 2), padding_mask()}, training(false)))
        << "pre_norm " << pre_norm;
  }
}

TEST(TransformerGradients, TokenEmbeddingBlockAndTiedLmHead) {
  Fixture f = model_of({TensorSpec{{6}, DType::kI64}}, false);
  f.add([](const TensorSpecs& in) { return make_token_embedding("embed", in, token_spec(0.25)); })
      .add(block("blk", block_spec(true, true, 0.1, 0.1)))
      .add([](const TensorSpecs& in) {
        return make_lm_head("head", in, lm_spec("embed.wte.weight"));
      })
      .finish();
  const ParamStore::Entry& tied = f.store->param_entries().back();
  ASSERT_EQ(tied.full_name(), "head.weight");
  EXPECT_TRUE(tied.alias);
  EXPECT_TRUE(f.param("head.weight").shares_storage(f.param("embed.wte.weight")));
  EXPECT_EQ(f.param("head.weight").offset(), f.param("embed.wte.weight").offset());
  EXPECT_TRUE(check(f, {random_ids({3, 6}, 11, 4)}, training(true)));
  // A shorter sequence uses the first positions.
  EXPECT_TRUE(check(f, {random_ids({2, 4}, 11, 5, DType::kI32)}, training(true)));
}

TEST(TransformerGradients, BertEmbeddingBlockAndTiedMlmHead) {
  Fixture f = model_of({TensorSpec{{3, 5}, DType::kI32}}, false);
  f.add([](const TensorSpecs& in) { return make_bert_embedding("emb", in, bert_spec(0.2)); })
      .add(block("blk", block_spec(false, false, 0.1, 0.1)))
      .add([](const TensorSpecs& in) {
        return make_mlm_head("mlm", in, mlm_spec("emb.word_embeddings.weight"));
      })
      .finish();
  EXPECT_TRUE(f.store->param_entries()[f.store->param_entries().size() - 2].alias);
  // (2, 3, 5): ids, token types, attention mask (sample 1 padded at the end).
  std::vector<int32_t> input{3, 7, 1, 10, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                             5, 5, 2, 9,  4, 0, 1, 1, 0, 0, 1, 1, 1, 0, 0};
  const Tensor x = Tensor::from_vector(input, {2, 3, 5});
  EXPECT_TRUE(check(f, {x}, training(true)));
  EXPECT_TRUE(check(f, {x}, training(false)));
}

TEST(TransformerGradients, UntiedHeadsOfHiddenStates) {
  Fixture lm = model_of(kHidden, true);
  lm.add([](const TensorSpecs& in) { return make_lm_head("head", in, lm_spec("")); }).finish();
  EXPECT_TRUE(check(lm, {random_tensor({2, 5, 8}, 3)}, training(true)));
  Fixture mlm = model_of(kHiddenAndMask, true);
  mlm.add([](const TensorSpecs& in) { return make_mlm_head("head", in, mlm_spec("")); }).finish();
  EXPECT_TRUE(check(mlm, {random_tensor({2, 5, 8}, 4), padding_mask()}, training(true)));
}

// Runs forward and backward with a fixed upstream gradient; returns the flat gradients.
std::vector<double> accumulate(Fixture& f, const TensorList& inputs, int times) {
  ExecContext ctx;
  f.store->zero_grads();
  for (int i = 0; i < times; ++i) {
    Tape tape;
    const TensorList y = f.model->forward(ctx, 0, f.model->size(), inputs, tape, training(true));
    TensorList dys(y.size());
    dys[0] = random_tensor(y[0].shape(), 31);
    f.model->backward(ctx, 0, f.model->size(), dys, tape);
  }
  return f.store->grads().to_vector<double>();
}

TEST(Transformer, ParameterGradientsAccumulate) {
  Fixture gpt = model_of({TensorSpec{{6}, DType::kI64}}, false);
  gpt.add([](const TensorSpecs& in) { return make_token_embedding("embed", in, token_spec(0.2)); })
      .add(block("blk", block_spec(true, true, 0.2, 0.2)))
      .add([](const TensorSpecs& in) {
        return make_lm_head("head", in, lm_spec("embed.wte.weight"));
      })
      .finish();
  Fixture bert = model_of({TensorSpec{{3, 5}, DType::kI32}}, false);
  bert.add([](const TensorSpecs& in) { return make_bert_embedding("emb", in, bert_spec(0.2)); })
      .add(block("blk", block_spec(false, false, 0.2, 0.2)))
      .add([](const TensorSpecs& in) {
        return make_mlm_head("mlm", in, mlm_spec("emb.word_embeddings.weight"));
      })
      .finish();
  std::vector<int32_t> ids{3, 7, 1, 10, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0};
  const std::vector<std::pair<Fixture*, Tensor>> cases{
      {&gpt, random_ids({2, 6}, 11, 1)}, {&bert, Tensor::from_vector(ids, {1, 3, 5})}};
  for (const auto& [f, x] : cases) {
    const std::vector<double> once = accumulate(*f, {x}, 1);
    const std::vector<double> twice = accumulate(*f, {x}, 2);
    double norm = 0;
    for (size_t i = 0; i < once.size(); ++i) {
      EXPECT_NEAR(twice[i], 2 * once[i], 1e-12 * (1 + std::fabs(once[i])));
      norm += once[i] * once[i];
    }
    EXPECT_GT(norm, 0.0);
  }
}

TEST(Transformer, TiedWeightAcrossStoresIsACopyAndTheGradientsAddUp) {
  Fixture f = model_of({TensorSpec{{6}, DType::kI64}}, false);
  f.add([](const TensorSpecs& in) {
     return make_token_embedding("embed", in, token_spec(0.0));
   }).add([](const TensorSpecs& in) {
    return make_lm_head("head", in, lm_spec("embed.wte.weight"));
  });
  const Tensor ids = random_ids({3, 6}, 11, 8);
  const Tensor dy = random_tensor({3, 6, 11}, 9);
  ExecContext ctx;
  // One store: the head's weight is the embedding's; one gradient collects both uses.
  ParamStore whole(*f.model, 0, 2, default_cpu_allocator(), DType::kF64);
  whole.initialize(11);
  Tape tape;
  f.model->forward(ctx, 0, 2, {ids}, tape, training(true));
  f.model->backward(ctx, 0, 2, {dy}, tape);
  const Tensor wte_grad = whole.grad(0).clone();
  // Two stores (two pipeline stages): the head holds a copy that starts equal to the owner.
  ParamStore first(*f.model, 0, 1, default_cpu_allocator(), DType::kF64);
  ParamStore second(*f.model, 1, 2, default_cpu_allocator(), DType::kF64);
  first.initialize(11);
  second.initialize(11);
  ASSERT_EQ(second.tied_copies(), std::vector<size_t>{2});
  EXPECT_FALSE(second.param(2).shares_storage(first.param(0)));
  EXPECT_TRUE(all_close(second.param(2), first.param(0), 0, 0));
  EXPECT_TRUE(all_close(first.param(0), whole.param(0), 0, 0));
  Tape t1, t2;
  const TensorList h = f.model->forward(ctx, 0, 1, {ids}, t1, training(true));
  f.model->forward(ctx, 1, 2, h, t2, training(true));
  f.model->backward(ctx, 0, 1, f.model->backward(ctx, 1, 2, {dy}, t2), t1);
  // The embedding's gradient in one store plus the head's in the other: the one-store gradient.
  std::vector<double> sum = first.grad(0).to_vector<double>();
  const std::vector<double> head = second.grad(2).to_vector<double>();
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += head[i];
  EXPECT_TRUE(all_close(Tensor::from_vector(sum, wte_grad.shape()), wte_grad, 1e-12, 1e-10));
  EXPECT_FALSE(all_close(second.grad(2), wte_grad, 1e-12, 1e-10));  // each part alone is not
}

TEST(Transformer, DropoutOnlyInTrainingWithDistinctMasksPerSite) {
  auto make = [](double p) {
    Fixture f = model_of(kHidden, true);
    f.add(block("blk", block_spec(true, true, p, p))).finish();
    return f;
  };
  Fixture with = make(0.3), without = make(0.0);
  const Tensor x = random_tensor({4, 5, 8}, 6);
  const Tensor eval = run_forward(with, {x}, training(false))[0];
  const Tensor plain = run_forward(without, {x}, training(true))[0];
  EXPECT_TRUE(all_close(eval, plain, 0, 0));  // evaluation: no dropout at all
  Tape tape;
  const Tensor train = run_forward(with, {x}, training(true), &tape)[0];
  EXPECT_FALSE(all_close(train, eval, 1e-3, 0));
  EXPECT_TRUE(all_close(run_forward(with, {x}, training(true))[0], train, 0, 0));  // repeatable
  ForwardOptions next = training(true);
  next.step += 1;
  EXPECT_FALSE(all_close(run_forward(with, {x}, next)[0], train, 1e-3, 0));
  // The three dropout sites of the block draw different masks.
  std::set<std::vector<double>> masks;
  for (const Tensor& t : tape.layers[1].saved) {
    if (t.defined() && t.dtype() == DType::kU8) masks.insert(t.to_vector<double>());
  }
  EXPECT_EQ(masks.size(), 3u);
  // Masks depend on the global sample index, not on how the batch is split.
  ForwardOptions first_half = training(true), second_half = training(true);
  second_half.sample_offset = first_half.sample_offset + 2;
  const Tensor a = run_forward(with, {x.narrow(0, 0, 2).contiguous()}, first_half)[0];
  const Tensor b = run_forward(with, {x.narrow(0, 2, 2).contiguous()}, second_half)[0];
  EXPECT_TRUE(all_close(a, train.narrow(0, 0, 2), 1e-12, 0));
  EXPECT_TRUE(all_close(b, train.narrow(0, 2, 2), 1e-12, 0));
}

// The block written out: layer norm, linear and GELU from the ops, attention as loops here.
Tensor reference_block(const Fixture& f, const Tensor& x, const Tensor& mask, bool pre_norm,
                       bool causal) {
  ExecContext ctx;
  auto p = [&](const std::string& n) { return f.param("blk." + n); };
  auto ln = [&](const Tensor& t, const std::string& n) {
    return ops::layer_norm_forward(ctx, t, p(n + ".weight"), p(n + ".bias"), 1e-5).y;
  };
  auto add = [](const Tensor& a, const Tensor& b) {
    std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
    for (size_t i = 0; i < va.size(); ++i) va[i] += vb[i];
    return Tensor::from_vector(va, a.shape());
  };
  const int64_t batch = x.size(0), t = x.size(1), c = x.size(2), heads = 2, d = c / heads;
  auto attn = [&](const Tensor& h) {
    const std::vector<double> qkv =
        ops::linear_forward(ctx, h, p("attn.c_attn.weight"), p("attn.c_attn.bias"))
            .to_vector<double>();
    std::vector<double> out(static_cast<size_t>(batch * t * c), 0.0);
    auto at = [&](int64_t b, int64_t i, int64_t part, int64_t hd, int64_t k) {
      return qkv[static_cast<size_t>(((b * t + i) * 3 + part) * c + hd * d + k)];
    };
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t hd = 0; hd < heads; ++hd) {
        for (int64_t i = 0; i < t; ++i) {
          std::vector<double> w(static_cast<size_t>(t), 0.0);
          double top = -1e300, total = 0;
          for (int64_t j = 0; j < t; ++j) {
            const bool visible =
                (!causal || j <= i) && (!mask.defined() || mask.data<int32_t>()[b * t + j] != 0);
            if (!visible) continue;
            double s = 0;
            for (int64_t k = 0; k < d; ++k) s += at(b, i, 0, hd, k) * at(b, j, 1, hd, k);
            w[j] = s / std::sqrt(static_cast<double>(d));
            top = std::max(top, w[j]);
          }
          for (int64_t j = 0; j < t; ++j) {
            const bool visible =
                (!causal || j <= i) && (!mask.defined() || mask.data<int32_t>()[b * t + j] != 0);
            w[j] = visible ? std::exp(w[j] - top) : 0.0;
            total += w[j];
          }
          for (int64_t j = 0; j < t; ++j) {
            for (int64_t k = 0; k < d; ++k) {
              out[static_cast<size_t>((b * t + i) * c + hd * d + k)] +=
                  w[j] / total * at(b, j, 2, hd, k);
            }
          }
        }
      }
    }
    return ops::linear_forward(ctx, Tensor::from_vector(out, x.shape()), p("attn.c_proj.weight"),
                               p("attn.c_proj.bias"));
  };
  auto mlp = [&](const Tensor& h) {
    const Tensor g = ops::gelu_forward(
        ctx, ops::linear_forward(ctx, h, p("mlp.c_fc.weight"), p("mlp.c_fc.bias")));
    return ops::linear_forward(ctx, g, p("mlp.c_proj.weight"), p("mlp.c_proj.bias"));
  };
  if (pre_norm) {
    const Tensor x2 = add(x, attn(ln(x, "ln_1")));
    return add(x2, mlp(ln(x2, "ln_2")));
  }
  const Tensor x2 = ln(add(x, attn(x)), "ln_1");
  return ln(add(x2, mlp(x2)), "ln_2");
}

TEST(Transformer, BlockMatchesADirectCompositionOfTheOps) {
  const Tensor x = random_tensor({2, 5, 8}, 12);
  Fixture pre = model_of(kHidden, true);
  pre.add(block("blk", block_spec(true, true, 0.0, 0.0))).finish();
  EXPECT_TRUE(all_close(run_forward(pre, {x}, training(true))[0],
                        reference_block(pre, x, Tensor(), true, true), 1e-12, 1e-10));
  Fixture post = model_of(kHiddenAndMask, true);
  post.add(block("blk", block_spec(false, false, 0.0, 0.0))).finish();
  const TensorList out = run_forward(post, {x, padding_mask()}, training(true));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(
      all_close(out[0], reference_block(post, x, padding_mask(), false, false), 1e-12, 1e-10));
  EXPECT_TRUE(all_close(out[1], padding_mask(), 0, 0));  // the mask passes through
}

TEST(Transformer, ParameterNamesAndShapes) {
  Fixture f = model_of(kHidden, true);
  f.add(block("blk", block_spec(true, true, 0, 0)));
  std::vector<std::string> names;
  for (const ParamSpec& p : f.model->layer(1).param_specs()) names.push_back(p.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"ln_1.weight", "ln_1.bias", "attn.c_attn.weight",
                                      "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
                                      "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
                                      "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"}));
  const std::vector<ParamSpec> specs = f.model->layer(1).param_specs();
  EXPECT_EQ(specs[2].shape, (Shape{24, 8}));  // (3C, C): the transpose of HF's Conv1D
  EXPECT_EQ(specs[8].shape, (Shape{12, 8}));
  for (const ParamSpec& p : specs) EXPECT_EQ(p.weight_decay, p.shape.size() == 2) << p.name;
  Fixture bert = model_of({TensorSpec{{3, 5}, DType::kI32}}, false);
  bert.add([](const TensorSpecs& in) { return make_bert_embedding("emb", in, bert_spec(0)); });
  EXPECT_EQ(bert.model->output_specs(), kHiddenAndMask);
  EXPECT_EQ(bert.model->layer(0).param_specs()[2].name, "token_type_embeddings.weight");
}

TEST(Transformer, BadShapesAndSpecsNameTheLayer) {
  auto expect_error = [](const std::function<void()>& f, const std::string& text) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one mentioning '" << text << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  proto::TransformerBlockSpec odd = block_spec(true, true, 0, 0);
  odd.set_heads(3);
  expect_error([&] { make_transformer_block("blocks.4", kHidden, odd); }, "blocks.4");
  proto::TokenEmbeddingSpec short_positions = token_spec(0);
  short_positions.set_max_positions(4);
  expect_error(
      [&] {
        Model m("m", Shape{6}, DType::kI32);
        m.add(make_token_embedding("embed", m.output_specs(), short_positions));
      },
      "embed");
  expect_error(
      [&] {
        Model m("m", Shape{5}, DType::kI32);
        m.add(make_bert_embedding("emb", m.output_specs(), bert_spec(0)));
      },
      "(3, T)");
  expect_error([] { make_lm_head("head", kHidden, lm_spec("embed.wte")); }, "in full");
  expect_error([] { make_mlm_head("mlm", kHidden, mlm_spec("emb.word_embeddings")); }, "in full");
  Fixture f = model_of(kHiddenAndMask, true);
  f.add(block("blk", block_spec(false, false, 0, 0))).finish();
  expect_error(
      [&] {
        run_forward(f, {random_tensor({2, 5, 8}, 1), padding_mask().view({5, 2})}, training(false));
      },
      "key padding mask");
}

}  // namespace
}  // namespace strata::graph
