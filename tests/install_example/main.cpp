// Uses the installed static library the way a user's program would: build a model from a
// ModelSpec, lay out its parameters, and train it with the library's ops and optimizer on XOR.
// Exits non-zero unless the model learns the four points.
#include <strata/strata.h>

#include <cstdio>

int main() {
  using namespace strata;
  const char* spec_text = R"(
    name: "xor"
    input { shape: [2] }
    layer { name: "fc1" type: "linear" linear { out_features: 16 } }
    layer { name: "act" type: "gelu" }
    layer { name: "fc2" type: "linear" linear { out_features: 2 } }
  )";
  try {
    auto model = graph::build_model(graph::parse_model_spec(spec_text, "xor"));
    ExecContext ctx;
    graph::ParamStore store(*model, 0, model->size(), ctx.allocator());
    store.initialize(42);
    graph::OptimizerConfig config;
    config.schedule.base_lr = 0.05;
    graph::Optimizer optimizer(store, config);
    const Tensor x = Tensor::from_vector<float>({0, 0, 0, 1, 1, 0, 1, 1}, {4, 2});
    const Tensor y = Tensor::from_vector<int64_t>({0, 1, 1, 0}, {4});
    graph::BatchMetrics m;
    for (int step = 0; step < 300; ++step) {
      store.zero_grads();
      m = graph::train_forward_backward(ctx, *model, x, y, {}, {});
      optimizer.step(ctx, step);
    }
    m = graph::evaluate_batch(ctx, *model, x, y);
    std::printf("xor: loss %.4f, %lld/4 correct\n", m.loss, static_cast<long long>(m.top1));
    return m.top1 == 4 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
