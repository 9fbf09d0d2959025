// Saving and loading a ParamStore through safetensors under a WeightMap.
//
// A store on a GPU is staged through one host copy of its flat buffers (one transfer each way),
// so that transposes and row blocks are plain CPU views. Saving hands the writer views (a
// transpose is made contiguous one tensor at a time), so the extra memory is one tensor, not the
// model. Loading reads one file tensor at a time and copies it into its place, converting the
// dtype; values are exact for F32 (and F16/BF16) files, which is what makes a round trip bitwise.
#include "models/weight_files.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "engine/allocator.h"
#include "engine/check.h"
#include "io/safetensors.h"

namespace strata::models {
namespace {

std::string list_some(const std::vector<std::string>& names, size_t most = 5) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < most; ++i) out += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > most) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

// What a file's tensors are, under one map.
struct FileMatch {
  std::map<std::string, const io::SafetensorsInfo*> by_name;  // map name -> file entry
  std::vector<std::string> extra;                             // file names unknown to the map
  std::vector<std::string> ignored;                           // non-parameters and counters
  int64_t known = 0;
};

FileMatch match(const io::SafetensorsReader& file, const WeightMap& map) {
  auto known = [&](const std::string& n) {
    return map.find(n) != nullptr || map.find_tied(n) != nullptr || map.non_parameters.count(n);
  };
  FileMatch m;
  for (const io::SafetensorsInfo& info : file.tensors()) {
    std::string n = info.name;
    if (!known(n) && !map.optional_prefix.empty() && known(map.optional_prefix + n)) {
      n = map.optional_prefix + n;
    }
    if (!known(n)) {
      m.extra.push_back(info.name);
      continue;
    }
    ++m.known;
    const auto [it, fresh] = m.by_name.emplace(n, &info);
    STRATA_CHECK(fresh) << "safetensors file " << file.path() << ": tensors '" << it->second->name
                        << "' and '" << info.name << "' are both " << n;
    const WeightName* w = map.find(n);
    if (map.non_parameters.count(n) || (w != nullptr && w->transform == WeightTransform::kCounter))
      m.ignored.push_back(info.name);
  }
  return m;
}

void check_tensor(const io::SafetensorsReader& file, const WeightMap& map,
                  const io::SafetensorsInfo& info, const Shape& shape, const std::string& source) {
  const std::string where = "safetensors file " + file.path() + ": tensor '" + info.name + "'";
  const std::string strata = source.empty() ? "" : " (Strata's " + source + ")";
  if (info.shape != shape) {
    Shape reversed(shape.rbegin(), shape.rend());
    STRATA_THROW() << where << " has shape " << shape_str(info.shape) << ", but model " << map.model
                   << " expects " << shape_str(shape) << strata << " under "
                   << weight_naming_name(map.naming) << " names"
                   << (shape.size() == 2 && info.shape == reversed
                           ? " (transposed: a file of the other layout, (in, out) vs (out, in)?)"
                           : "");
  }
  const std::optional<DType> dtype = io::dtype_from_safetensors(info.dtype);
  STRATA_CHECK(dtype.has_value() && is_floating(*dtype))
      << where << " has dtype " << info.dtype << ", but model " << map.model
      << " expects floating-point weights" << strata << " (F32, or F16, BF16, F64 converted)";
}

// Checks every name, shape and dtype (see weight_files.h); returns the match.
FileMatch check_file(const io::SafetensorsReader& file, const WeightMap& map,
                     const WeightsReadOptions& options) {
  FileMatch m = match(file, map);
  const std::string prefix = "safetensors file " + file.path() + ": ";
  std::vector<const WeightName*> missing;
  std::vector<std::string> missing_names;
  size_t needed = 0;
  for (const WeightName& w : map.tensors) {
    if (w.transform == WeightTransform::kCounter) continue;
    ++needed;
    const auto it = m.by_name.find(w.name);
    if (it == m.by_name.end()) {
      missing.push_back(&w);
      missing_names.push_back(w.name);
      continue;
    }
    check_tensor(file, map, *it->second, w.shape, w.source);
  }
  if (!missing.empty()) {
    STRATA_THROW() << prefix << "model " << map.model << " needs tensor '" << missing.front()->name
                   << "' (Strata's " << missing.front()->source << "), which the file lacks; "
                   << missing.size() << " of the model's " << needed
                   << " tensors are missing under " << weight_naming_name(map.naming)
                   << " names: " << list_some(missing_names) << " (the file holds "
                   << file.tensors().size() << " tensors)";
  }
  for (const TiedName& t : map.tied) {
    const auto it = m.by_name.find(t.name);
    if (it != m.by_name.end()) check_tensor(file, map, *it->second, map.find(t.owner)->shape, "");
  }
  if (!m.extra.empty() && !options.ignore_extra) {
    STRATA_THROW() << prefix << "tensor '" << m.extra.front() << "' has no place in model "
                   << map.model << " (" << weight_naming_name(map.naming) << " names; "
                   << m.extra.size() << " such tensor" << (m.extra.size() == 1 ? "" : "s") << ": "
                   << list_some(m.extra)
                   << "); ignore them only if the model is meant to lack them";
  }
  return m;
}

// The host copy of a flat buffer (the buffer itself on the CPU).
Tensor host_of(const Tensor& flat) {
  return flat.device().is_cpu() ? flat : to_allocator(flat, default_cpu_allocator());
}

Tensor entry_view(const Tensor& flat, const graph::ParamStore::Entry& e) {
  return flat.narrow(0, e.offset, e.numel).view(e.shape);
}

}  // namespace

WeightNaming detect_weight_naming(const std::string& path, const graph::Model& model,
                                  const WeightsReadOptions& options) {
  if (options.naming) return *options.naming;
  io::SafetensorsReader file(path);
  const auto it = file.metadata().find(kWeightsNamingKey);
  if (it != file.metadata().end()) {
    try {
      return parse_weight_naming(it->second);
    } catch (const Error& e) {
      STRATA_THROW() << "safetensors file " << path << ": metadata " << kWeightsNamingKey << ": "
                     << e.message();
    }
  }
  const int64_t hf = match(file, weight_map(model, WeightNaming::kHuggingFace)).known;
  const int64_t strata = match(file, weight_map(model, WeightNaming::kStrata)).known;
  return strata > hf ? WeightNaming::kStrata : WeightNaming::kHuggingFace;
}

WeightsReadReport load_weights(const std::string& path, const graph::Model& model,
                               graph::ParamStore& store, const WeightsReadOptions& options) {
  WeightsReadReport report;
  report.naming = detect_weight_naming(path, model, options);
  const io::SafetensorsReader file(path);
  const WeightMap map = weight_map(model, report.naming);
  const FileMatch m = check_file(file, map, options);
  report.ignored = m.ignored;
  report.extra = m.extra;
  report.ignored.insert(report.ignored.end(), m.extra.begin(), m.extra.end());

  const Tensor params = host_of(store.params());
  const Tensor buffers = host_of(store.buffers());
  // Reads file tensor `w` into `dest` (the whole Strata tensor it is taken from).
  auto load = [&](const WeightName& w, const Tensor& dest) {
    const io::SafetensorsInfo& info = *m.by_name.at(w.name);
    Tensor t = file.read(info.name);
    if (t.dtype() != dest.dtype()) {
      report.converted.push_back(info.name + " (" + info.dtype + ")");
      t = t.to(dest.dtype());
    }
    switch (w.transform) {
      case WeightTransform::kCopy:
        dest.copy_from(t);
        break;
      case WeightTransform::kTranspose:
        dest.copy_from(t.transpose(0, 1));
        break;
      case WeightTransform::kRows:
        dest.narrow(0, w.row_begin, w.shape[0]).copy_from(t);
        break;
      case WeightTransform::kCounter:
        STRATA_THROW() << "load_weights: a counter has no Strata tensor";
    }
    ++report.tensors_loaded;
  };
  auto load_entries = [&](const std::vector<graph::ParamStore::Entry>& entries,
                          const Tensor& flat) {
    for (const graph::ParamStore::Entry& e : entries) {
      if (e.alias) continue;  // its owner's storage
      const std::vector<const WeightName*> sources = map.from_source(e.init_key());
      STRATA_CHECK(!sources.empty()) << "load_weights: " << e.full_name() << " of model "
                                     << model.name() << " has no name in the weight map";
      for (const WeightName* w : sources) load(*w, entry_view(flat, e));
      // A padded vocabulary's padding rows are not in files: zero, as initialized.
      if (e.valid_numel() < e.numel) {
        entry_view(flat, e).narrow(0, e.valid_rows, e.shape[0] - e.valid_rows).zero_();
      }
    }
  };
  load_entries(store.param_entries(), params);
  load_entries(store.buffer_entries(), buffers);

  // A tied name the file also stores must hold the values its owner gave the tied parameter.
  for (const TiedName& t : map.tied) {
    const auto it = m.by_name.find(t.name);
    if (it == m.by_name.end()) continue;
    for (const graph::ParamStore::Entry& e : store.param_entries()) {
      if (e.full_name() != t.param) continue;
      // The owner's tensor as the file holds it (its valid rows, for a padded vocabulary).
      const WeightName* owner = map.find(t.owner);
      Tensor mine = entry_view(params, e);
      if (owner != nullptr && owner->transform == WeightTransform::kRows) {
        mine = mine.narrow(0, owner->row_begin, owner->shape[0]);
      }
      mine = mine.contiguous();
      const Tensor theirs = file.read(it->second->name).to(mine.dtype());
      STRATA_CHECK(std::memcmp(mine.raw_data(), theirs.raw_data(), mine.nbytes()) == 0)
          << "safetensors file " << path << ": tensor '" << it->second->name << "' differs from '"
          << t.owner << "', but model " << model.name() << " ties them (Strata's " << t.param
          << ")";
      report.ignored.push_back(it->second->name);
    }
  }
  if (!store.params().device().is_cpu()) copy_across_devices(store.params(), params);
  if (!store.buffers().device().is_cpu()) copy_across_devices(store.buffers(), buffers);
  return report;
}

void save_weights(const std::string& path, const graph::Model& model,
                  const graph::ParamStore& store, WeightNaming naming,
                  const std::map<std::string, std::string>& metadata) {
  STRATA_CHECK(store.begin() == 0 && store.end() == model.size())
      << "save_weights " << path << ": the store holds layers [" << store.begin() << ", "
      << store.end() << ") of the " << model.size() << " of model " << model.name()
      << "; a file holds a whole model";
  const WeightMap map = weight_map(model, naming);
  const Tensor params = host_of(store.params());
  const Tensor buffers = host_of(store.buffers());
  std::map<std::string, Tensor> views;  // Strata full name -> host view
  for (const graph::ParamStore::Entry& e : store.param_entries()) {
    if (!e.alias) views[e.full_name()] = entry_view(params, e);
  }
  for (const graph::ParamStore::Entry& e : store.buffer_entries()) {
    views[e.full_name()] = entry_view(buffers, e);
  }
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const WeightName& w : map.tensors) {
    if (w.transform == WeightTransform::kCounter) {
      tensors.emplace_back(w.name, Tensor::zeros({}, DType::kI64));
      continue;
    }
    const auto it = views.find(w.source);
    STRATA_CHECK(it != views.end())
        << "save_weights " << path << ": model " << model.name() << " has no parameter or buffer "
        << w.source << " in the store";
    const Tensor& src = it->second;
    switch (w.transform) {
      case WeightTransform::kCopy:
        tensors.emplace_back(w.name, src);
        break;
      case WeightTransform::kTranspose:
        tensors.emplace_back(w.name, src.transpose(0, 1));
        break;
      case WeightTransform::kRows:
        tensors.emplace_back(w.name, src.narrow(0, w.row_begin, w.shape[0]));
        break;
      case WeightTransform::kCounter:
        break;
    }
    STRATA_CHECK(tensors.back().second.shape() == w.shape)
        << "save_weights: " << w.name << " " << tensors.back().second.shape_str() << " vs map "
        << shape_str(w.shape);
  }
  std::map<std::string, std::string> meta = metadata;
  meta["format"] = "pt";
  meta[kWeightsNamingKey] = weight_naming_name(naming);
  meta[kWeightsModelKey] = model.name();
  io::write_safetensors(path, tensors, meta);
}

}  // namespace strata::models
