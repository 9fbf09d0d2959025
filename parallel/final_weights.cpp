// Final weights: group 0's stages send their entries, in their stores' order, to rank 0.
#include "parallel/final_weights.h"

#include <algorithm>
#include <memory>
#include <sstream>
#include <vector>

#include "engine/allocator.h"
#include "engine/check.h"
#include "models/weight_files.h"
#include "parallel/checkpointing.h"

namespace strata::parallel {
namespace {

// What a stage's store sends: its parameters that are neither an alias of another of its entries
// nor a copy of a tied owner held by another stage, then its buffers, as (full name, tensor).
std::vector<std::pair<std::string, Tensor>> entries_of(const graph::ParamStore& store) {
  std::vector<std::pair<std::string, Tensor>> out;
  const std::vector<size_t> copies = store.tied_copies();
  const auto& params = store.param_entries();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].alias) continue;
    if (std::find(copies.begin(), copies.end(), i) != copies.end()) continue;
    out.emplace_back(params[i].full_name(), store.param(i));
  }
  const auto& buffers = store.buffer_entries();
  for (size_t i = 0; i < buffers.size(); ++i)
    out.emplace_back(buffers[i].full_name(), store.buffer(i));
  return out;
}

}  // namespace

void save_final_weights(Communicator* world, int stage, int group, const graph::Model& model,
                        const graph::ParamStore& store, graph::Model* full_model,
                        const std::string& path,
                        const std::map<std::string, std::string>& metadata) {
  (void)model;
  // Group 0's stages, rank = stage (every rank takes part in the split).
  std::unique_ptr<Communicator> stages;
  if (world != nullptr && world->size() > 1) stages = world->split(group == 0 ? 0 : -1, stage);
  if (group != 0) return;
  const std::vector<std::pair<std::string, Tensor>> mine = entries_of(store);
  // Every stage's entry names, so that rank 0 knows what comes, in which order.
  std::string names;
  for (const auto& [name, t] : mine) names += name + "\n";
  const std::vector<std::string> all = all_gather_strings(stages.get(), names);
  if (stage != 0) {
    for (size_t k = 0; k < mine.size(); ++k) {
      const Tensor t = mine[k].second.to(DType::kF32).contiguous();
      stages->isend(t, 0, static_cast<int>(k))
          ->wait(stages->timeout(), "the final weights of stage " + std::to_string(stage) + " (" +
                                        mine[k].first + ") to rank 0");
    }
    return;
  }
  // Rank 0: a store of the whole model, filled with every stage's entries.
  STRATA_CHECK(full_model != nullptr) << "--save-weights: rank 0 needs a model to write";
  CpuAllocator allocator;
  graph::ParamStore full(*full_model, 0, full_model->size(), allocator);
  std::map<std::string, Tensor> views;
  for (size_t i = 0; i < full.param_entries().size(); ++i) {
    if (!full.param_entries()[i].alias) views[full.param_entries()[i].full_name()] = full.param(i);
  }
  for (size_t i = 0; i < full.buffer_entries().size(); ++i) {
    views[full.buffer_entries()[i].full_name()] = full.buffer(i);
  }
  size_t filled = 0;
  auto view = [&](const std::string& name) -> const Tensor& {
    auto it = views.find(name);
    STRATA_CHECK(it != views.end())
        << "--save-weights: " << name << " is not in model " << full_model->name();
    ++filled;
    return it->second;
  };
  for (const auto& [name, t] : mine) view(name).copy_from(t.to(DType::kF32));
  for (size_t s = 1; s < all.size(); ++s) {
    std::stringstream in(all[s]);
    int tag = 0;
    for (std::string name; std::getline(in, name); ++tag) {
      const Tensor& target = view(name);
      Tensor received = Tensor::empty(target.shape(), DType::kF32);
      stages->irecv(received, static_cast<int>(s), tag)
          ->wait(stages->timeout(),
                 "the final weights of stage " + std::to_string(s) + " (" + name + ")");
      target.copy_from(received);
    }
  }
  STRATA_CHECK_EQ(filled, views.size()) << "--save-weights: not every parameter and buffer of "
                                        << full_model->name() << " came from a stage";
  models::save_weights(path, *full_model, full, models::WeightNaming::kStrata, metadata);
}

}  // namespace strata::parallel
