// Checks of parallel/runtime/live_transfer.h shared by the local-thread and the MPI tests: rank 0
// is the source of a migration, rank 1 its target; other ranks take no part.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "parallel/runtime/live_transfer.h"

namespace strata::parallel::live_checks {

// Item i: two tensors, (i + 1) x 1000 f32 values and 7 i64 values, filled from i.
inline std::vector<Tensor> item(int64_t i) {
  Tensor a = Tensor::empty({(i + 1) * 1000}, DType::kF32);
  float* pa = a.data<float>();
  for (int64_t k = 0; k < a.numel(); ++k) pa[k] = static_cast<float>(i * 100000 + k) * 0.5f;
  Tensor b = Tensor::empty({7}, DType::kI64);
  int64_t* pb = b.data<int64_t>();
  for (int64_t k = 0; k < 7; ++k) pb[k] = i * 1000 + k;
  return {a, b};
}

inline std::vector<std::pair<Shape, DType>> layout(int64_t i) {
  return {{Shape{(i + 1) * 1000}, DType::kF32}, {Shape{7}, DType::kI64}};
}

inline size_t item_bytes(int64_t i) { return static_cast<size_t>((i + 1) * 1000 * 4 + 7 * 8); }

// `items` items from rank 0 to rank 1 in chunks of `chunk` bytes with `window` bytes in flight at
// most; the target gates on each item in turn and finds it bit for bit.
inline void moves_items_in_chunks(Communicator& comm, int64_t items, size_t chunk, size_t window) {
  if (comm.rank() > 1) return;
  LiveTransferConfig config;
  config.chunk_bytes = chunk;
  config.window_bytes = window;
  config.tag_base = 100;
  const bool source = comm.rank() == 0;
  LiveTransfer t(comm, source ? 1 : 0,
                 source ? LiveTransfer::Role::kSource : LiveTransfer::Role::kTarget, items,
                 "migration test", config);
  size_t bytes = 0;
  int64_t chunks = 0;
  for (int64_t i = 0; i < items; ++i) {
    bytes += item_bytes(i);
    const size_t f32 = static_cast<size_t>((i + 1) * 1000 * 4);
    chunks +=
        chunk == 0 ? 2 : static_cast<int64_t>((f32 + chunk - 1) / chunk + (56 + chunk - 1) / chunk);
  }
  if (source) {
    for (int64_t i = 0; i < items; ++i) t.post(i, item(i));
    t.finish();
    EXPECT_EQ(t.held_bytes(), 0u) << "the source still holds posted copies";
  } else {
    for (int64_t i = 0; i < items; ++i) t.expect(i, layout(i));
    for (int64_t i = 0; i < items; ++i) {
      const std::vector<Tensor> got = t.wait(i, "Backward(" + std::to_string(i) + ")");
      const std::vector<Tensor> want = item(i);
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < got.size(); ++k) {
        ASSERT_EQ(got[k].nbytes(), want[k].nbytes());
        EXPECT_EQ(std::memcmp(got[k].raw_data(), want[k].raw_data(), got[k].nbytes()), 0)
            << "item " << i << " tensor " << k;
      }
      EXPECT_TRUE(t.arrived(i));
    }
    t.finish();
  }
  const LiveTransferStats s = t.stats();
  EXPECT_EQ(s.items, items);
  EXPECT_EQ(s.bytes, bytes);
  EXPECT_EQ(s.chunks, chunks);
  if (window > 0) {
    EXPECT_LE(s.peak_in_flight_bytes, std::max(window, chunk)) << "flow control let more through";
  }
  EXPECT_GT(s.peak_in_flight_bytes, 0u);
}

// The two ends disagree on the number of items: both fail, naming the migration.
inline void refuses_a_count_mismatch(Communicator& comm) {
  if (comm.rank() > 1) return;
  const bool source = comm.rank() == 0;
  LiveTransfer t(comm, source ? 1 : 0,
                 source ? LiveTransfer::Role::kSource : LiveTransfer::Role::kTarget, source ? 2 : 3,
                 "migration at step 7: fc1 0->1");
  try {
    t.finish();
    ADD_FAILURE() << "a count mismatch went through";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("migration at step 7: fc1 0->1"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("items"), std::string::npos) << e.what();
  }
}

}  // namespace strata::parallel::live_checks
