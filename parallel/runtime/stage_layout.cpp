// StageLayout: per-micro-batch layer ranges across live migrations (see the header).
#include "parallel/runtime/stage_layout.h"

#include <algorithm>

#include "engine/check.h"

namespace strata::parallel {

StageLayout::StageLayout(Partition initial) : initial_(std::move(initial)) {
  STRATA_CHECK(!initial_.empty()) << "stage layout: no stages";
  size_t next = 0;
  for (const LayerRange& r : initial_) {
    STRATA_CHECK(r.begin == next && r.begin < r.end)
        << "stage layout: the partition must cover the layers in order";
    next = r.end;
  }
  partitions_.push_back(initial_);
}

void StageLayout::add_live_migration(const Partition& next, int64_t first_backward) {
  const Partition& now = partitions_.back();
  const int S = stages();
  STRATA_CHECK_EQ(next.size(), now.size()) << "live migration: stage count changes";
  STRATA_CHECK(next.front().begin == 0 && next.back().end == now.back().end)
      << "live migration: the new partition does not cover the layers";
  for (size_t s = 0; s + 1 < next.size(); ++s) {
    STRATA_CHECK(next[s].end == next[s + 1].begin && next[s].begin < next[s].end)
        << "live migration: the new partition is not contiguous";
  }
  STRATA_CHECK(first_backward >= 1) << "live migration: the first backward must be at least 1";
  if (!moves_.empty()) {
    int64_t last = 0;
    for (const BoundaryMove& m : moves_.back()) last = std::max(last, m.first_forward);
    STRATA_CHECK(first_backward > last)
        << "live migration at micro-batch " << first_backward << " starts before the previous "
        << "one has finished switching (micro-batch " << last << ")";
  }
  std::vector<BoundaryMove> moves;
  for (int b = 0; b + 1 < S; ++b) {
    const size_t old_boundary = now[b].end, new_boundary = next[b].end;
    if (old_boundary == new_boundary) continue;
    BoundaryMove m;
    if (new_boundary < old_boundary) {  // layers [new, old) move down from b to b + 1
      m.src = b;
      m.tgt = b + 1;
      m.begin = new_boundary;
      m.end = old_boundary;
    } else {  // layers [old, new) move up from b + 1 to b
      m.src = b + 1;
      m.tgt = b;
      m.begin = old_boundary;
      m.end = new_boundary;
    }
    // Every layer moves at most one stage: the moved layers stay inside src's old and tgt's new
    // ranges.
    STRATA_CHECK(m.begin >= now[m.src].begin && m.end <= now[m.src].end &&
                 m.begin >= next[m.tgt].begin && m.end <= next[m.tgt].end)
        << "live migration: layers " << m.begin << "-" << m.end - 1 << " would move more than "
        << "one stage (from stage " << m.src << "); move them a stage at a time, or use "
        << "--migration restart";
    m.first_backward = first_backward;
    m.first_forward = first_backward + S - m.src - 1;
    moves.push_back(m);
  }
  // A stage that both gives and takes layers at its two ends is fine; one that would lose all
  // its layers is not (the partitions forbid empty stages).
  moves_.push_back(std::move(moves));
  first_backward_.push_back(first_backward);
  partitions_.push_back(next);
}

size_t StageLayout::boundary(size_t b, int64_t j, bool forward) const {
  size_t position = initial_[b].end;
  for (size_t k = 0; k < moves_.size(); ++k) {
    for (const BoundaryMove& m : moves_[k]) {
      const size_t between = static_cast<size_t>(std::min(m.src, m.tgt));
      if (between != b) continue;
      const int64_t threshold = forward ? m.first_forward : m.first_backward;
      if (j >= threshold) position = partitions_[k + 1][b].end;
    }
  }
  return position;
}

LayerRange StageLayout::forward_range(int stage, int64_t j) const {
  STRATA_CHECK(stage >= 0 && stage < stages()) << "stage layout: stage " << stage;
  const size_t begin = stage == 0 ? 0 : boundary(static_cast<size_t>(stage - 1), j, true);
  const size_t end =
      stage == stages() - 1 ? initial_.back().end : boundary(static_cast<size_t>(stage), j, true);
  return {begin, end};
}

LayerRange StageLayout::backward_range(int stage, int64_t j) const {
  STRATA_CHECK(stage >= 0 && stage < stages()) << "stage layout: stage " << stage;
  const size_t begin = stage == 0 ? 0 : boundary(static_cast<size_t>(stage - 1), j, false);
  const size_t end =
      stage == stages() - 1 ? initial_.back().end : boundary(static_cast<size_t>(stage), j, false);
  return {begin, end};
}

std::vector<Partition> one_stage_steps(const Partition& from, const Partition& to) {
  STRATA_CHECK(from.size() == to.size() && !from.empty() && from.back().end == to.back().end)
      << "one_stage_steps: partitions of other stages or layers";
  const size_t layers = from.back().end;
  auto owners = [layers](const Partition& p) {
    std::vector<int> o(layers, 0);
    for (size_t s = 0; s < p.size(); ++s) {
      for (size_t l = p[s].begin; l < p[s].end; ++l) o[l] = static_cast<int>(s);
    }
    return o;
  };
  std::vector<int> now = owners(from);
  const std::vector<int> goal = owners(to);
  std::vector<Partition> out;
  while (now != goal) {
    // Clamped toward the goal, the owners stay non-decreasing in the layer: contiguous stages.
    // None empties: if stage s's layers all leave, a layer bound for s is in a neighbour (it
    // enters) or further away, and then the neighbour between, whose layers are bound past it,
    // moves into s.
    for (size_t l = 0; l < layers; ++l) now[l] = std::clamp(goal[l], now[l] - 1, now[l] + 1);
    Partition p(from.size(), LayerRange{0, 0});
    for (size_t s = 0; s < p.size(); ++s) {
      const auto first = std::find(now.begin(), now.end(), static_cast<int>(s));
      STRATA_CHECK(first != now.end()) << "one_stage_steps: stage " << s << " emptied";
      const size_t b = static_cast<size_t>(first - now.begin());
      size_t e = b;
      while (e < layers && now[e] == static_cast<int>(s)) ++e;
      p[s] = {b, e};
    }
    out.push_back(p);
  }
  return out;
}

}  // namespace strata::parallel
