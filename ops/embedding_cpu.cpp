// Embedding lookup on the CPU.
//
// Every id is validated before anything is written, so a bad id fails with its value, its flat
// position in ids and V, and no partial output. Forward copies rows, split over ids. Backward
// scatters dy rows into dweight; repeated ids must add up, so threads split the C columns rather
// than the ids: each thread owns its columns of every row of dweight and walks the ids in order,
// which needs no atomics and gives the same sums for every thread count.
#include <algorithm>

#include "ops/cpu_util.h"
#include "ops/embedding.h"

namespace strata::ops::cpu {
namespace {

constexpr const char* kForward = "embedding_forward";
constexpr const char* kBackward = "embedding_backward";

void check_ids_in_range(const Tensor& ids, int64_t vocab, const char* op) {
  const int64_t n = ids.numel();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = detail::index_at(ids, i);
    STRATA_CHECK(id >= 0 && id < vocab)
        << op << ": id " << id << " at flat position " << i << " of ids " << ids.shape_str()
        << " is outside [0, V) with V = " << vocab;
  }
}

// weight (or dweight): (V, C), float.
void check_table(const Tensor& w, const char* op, const char* name) {
  detail::check_float(w, op, name);
  STRATA_CHECK(w.dim() == 2) << op << ": " << name << " must be (V, C), got " << w.shape_str();
}

}  // namespace

Tensor embedding_forward(ExecContext& ctx, const Tensor& ids, const Tensor& weight) {
  detail::check_index(ids, kForward, "ids");
  check_table(weight, kForward, "weight");
  const int64_t vocab = weight.size(0), c = weight.size(1);
  check_ids_in_range(ids, vocab, kForward);
  Shape out_shape = ids.shape();
  out_shape.push_back(c);
  Tensor y = Tensor::empty(out_shape, weight.dtype(), &ctx.allocator());
  const int64_t n = ids.numel();
  detail::dispatch_float(weight.dtype(), kForward, [&](auto tag) {
    using T = decltype(tag);
    const T* pw = weight.data<T>();
    T* py = y.data<T>();
    detail::parallel_for(n, std::max<int64_t>(1, 8192 / std::max<int64_t>(c, 1)),
                         [&](int64_t i0, int64_t i1) {
                           for (int64_t i = i0; i < i1; ++i) {
                             const T* row = pw + detail::index_at(ids, i) * c;  // (C,)
                             std::copy(row, row + c, py + i * c);
                           }
                         });
  });
  return y;
}

void embedding_backward(ExecContext& ctx, const Tensor& dy, const Tensor& ids,
                        const Tensor& dweight) {
  detail::check_index(ids, kBackward, "ids");
  check_table(dweight, kBackward, "dweight");
  detail::check_float(dy, kBackward, "dy");
  detail::check_same_dtype(dy, dweight, kBackward, "dy", "dweight");
  const int64_t vocab = dweight.size(0), c = dweight.size(1);
  Shape dy_shape = ids.shape();
  dy_shape.push_back(c);
  detail::check_shape(dy, dy_shape, kBackward, "dy");
  check_ids_in_range(ids, vocab, kBackward);
  const int64_t n = ids.numel();
  detail::dispatch_float(dy.dtype(), kBackward, [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = dy.data<T>();
    T* pdw = dweight.data<T>();
    detail::parallel_for(c, 64, [&](int64_t c0, int64_t c1) {
      for (int64_t i = 0; i < n; ++i) {
        const T* src = pdy + i * c;                   // (C,)
        T* dst = pdw + detail::index_at(ids, i) * c;  // (C,)
        for (int64_t j = c0; j < c1; ++j) dst[j] += src[j];
      }
    });
  });
}

}  // namespace strata::ops::cpu
