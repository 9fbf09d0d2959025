// The slowdown model's random forest on XGBoost's C API (slowdown_model.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/check.h"
#include "parallel/dynpipe/slowdown_features.h"
#include "parallel/dynpipe/slowdown_model.h"

#if STRATA_HAVE_XGBOOST
#include <xgboost/c_api.h>
#endif

namespace strata::parallel::dynpipe {

#if STRATA_HAVE_XGBOOST

namespace {

// Throws strata::Error with XGBoost's last error when `status` is not 0.
void xgb_check(int status, const std::string& what) {
  STRATA_CHECK(status == 0) << "XGBoost failed to " << what << ": " << XGBGetLastError();
}

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// A DMatrix owned for one call.
struct Matrix {
  DMatrixHandle h = nullptr;
  Matrix(const float* rows, size_t count, size_t features) {
    xgb_check(XGDMatrixCreateFromMat(rows, count, features, NAN, &h), "build a DMatrix");
  }
  ~Matrix() {
    if (h != nullptr) XGDMatrixFree(h);
  }
  Matrix(const Matrix&) = delete;
  Matrix& operator=(const Matrix&) = delete;
};

}  // namespace

bool forest_available() { return true; }

struct ForestModel::Impl {
  BoosterHandle booster = nullptr;
  ~Impl() {
    if (booster != nullptr) XGBoosterFree(booster);
  }
};

ForestModel::ForestModel() = default;
ForestModel::~ForestModel() = default;
ForestModel::ForestModel(ForestModel&&) noexcept = default;
ForestModel& ForestModel::operator=(ForestModel&&) noexcept = default;

ForestModel ForestModel::fit(const SlowdownData& data, const ForestOptions& o) {
  STRATA_CHECK(data.rows() >= 2 && !data.features.empty())
      << "the forest needs at least 2 rows and a feature, got " << data.rows() << " rows";
  STRATA_CHECK(o.trees >= 1) << "--trees must be positive, got " << o.trees;
  STRATA_CHECK(o.subsample > 0 && o.subsample <= 1)
      << "--subsample must be in (0, 1], got " << o.subsample;
  STRATA_CHECK(o.colsample_bynode > 0 && o.colsample_bynode <= 1)
      << "--colsample must be in (0, 1], got " << o.colsample_bynode;
  STRATA_CHECK(o.max_depth >= 1) << "--max-depth must be positive, got " << o.max_depth;
  Matrix train(data.x.data(), data.rows(), data.features.size());
  xgb_check(XGDMatrixSetFloatInfo(train.h, "label", data.y.data(), data.rows()), "set labels");
  ForestModel m;
  m.impl_ = std::make_unique<Impl>();
  m.features_ = data.features;
  xgb_check(XGBoosterCreate(&train.h, 1, &m.impl_->booster), "create a booster");
  const std::pair<const char*, std::string> params[] = {
      {"booster", "gbtree"},
      {"objective", "reg:squarederror"},
      {"tree_method", "hist"},
      {"num_parallel_tree", std::to_string(o.trees)},
      {"learning_rate", "1"},
      {"subsample", number(o.subsample)},
      {"colsample_bynode", number(o.colsample_bynode)},
      {"max_depth", std::to_string(o.max_depth)},
      {"reg_lambda", "0"},
      {"min_child_weight", "1"},
      {"seed", std::to_string(o.seed)},
      {"nthread", std::to_string(o.threads)},
      {"verbosity", "0"}};
  for (const auto& [key, value] : params) {
    xgb_check(XGBoosterSetParam(m.impl_->booster, key, value.c_str()),
              std::string("set ") + key + " = " + value);
  }
  // One boosting round: 128 trees fitted in parallel, averaged (a random forest).
  xgb_check(XGBoosterUpdateOneIter(m.impl_->booster, 0, train.h), "train the forest");
  xgb_check(XGBoosterSetAttr(m.impl_->booster, "strata_model", kModelFormat), "set attributes");
  xgb_check(XGBoosterSetAttr(m.impl_->booster, "strata_features", join_names(m.features_).c_str()),
            "set attributes");
  const std::string set = m.features_ == slowdown_features() ? kFeatureSet : "custom";
  xgb_check(XGBoosterSetAttr(m.impl_->booster, "strata_feature_set", set.c_str()),
            "set attributes");
  return m;
}

void ForestModel::save(const std::string& path) const {
  STRATA_CHECK(impl_ != nullptr) << "no forest to save to '" << path << "'";
  bst_ulong len = 0;
  const char* bytes = nullptr;
  xgb_check(XGBoosterSaveModelToBuffer(impl_->booster, R"({"format": "json"})", &len, &bytes),
            "serialize the forest");
  std::ofstream out(path, std::ios::binary);
  out.write(bytes, static_cast<std::streamsize>(len));
  out.close();
  STRATA_CHECK(out.good()) << "cannot write the slowdown model '" << path << "'";
}

ForestModel ForestModel::load(const std::string& path, const std::vector<std::string>& expected) {
  std::ifstream in(path, std::ios::binary);
  STRATA_CHECK(in.good()) << "slowdown model '" << path << "' is missing (cannot open it)";
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  STRATA_CHECK(!bytes.empty()) << "slowdown model '" << path << "' is empty";
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(bytes);
  } catch (const nlohmann::json::parse_error& e) {
    STRATA_THROW() << "slowdown model '" << path << "' is truncated or not JSON (" << bytes.size()
                   << " bytes; " << e.what() << ")";
  }
  const nlohmann::json* attrs = nullptr;
  if (doc.is_object() && doc.contains("learner") && doc["learner"].contains("attributes")) {
    attrs = &doc["learner"]["attributes"];
  }
  STRATA_CHECK(attrs != nullptr && attrs->contains("strata_model") &&
               (*attrs)["strata_model"].is_string())
      << "slowdown model '" << path << "' is not a Strata slowdown model (no strata_model "
      << "attribute; write one with strata fit-slowdown)";
  const std::string format = (*attrs)["strata_model"].get<std::string>();
  STRATA_CHECK(format == kModelFormat) << "slowdown model '" << path << "' has format '" << format
                                       << "', this strata reads '" << kModelFormat << "'";
  STRATA_CHECK(attrs->contains("strata_features") && (*attrs)["strata_features"].is_string())
      << "slowdown model '" << path << "' does not record its feature set";
  const std::vector<std::string> features =
      split_names((*attrs)["strata_features"].get<std::string>());
  // Files before the set had a name (and custom --features): "custom" unless recorded.
  const std::string set =
      attrs->contains("strata_feature_set") && (*attrs)["strata_feature_set"].is_string()
          ? (*attrs)["strata_feature_set"].get<std::string>()
          : std::string(features == slowdown_features() ? kFeatureSet : "custom");
  if (!expected.empty() && features != expected) {
    std::string missing, extra;
    for (const std::string& f : expected) {
      if (std::find(features.begin(), features.end(), f) == features.end()) {
        missing += (missing.empty() ? "" : ",") + f;
      }
    }
    for (const std::string& f : features) {
      if (std::find(expected.begin(), expected.end(), f) == expected.end()) {
        extra += (extra.empty() ? "" : ",") + f;
      }
    }
    STRATA_THROW() << "slowdown model '" << path << "' was trained on another feature set: '" << set
                   << "', " << features.size() << " features (" << join_names(features)
                   << "), expected "
                   << (expected == slowdown_features() ? "'" + std::string(kFeatureSet) + "', "
                                                       : std::string())
                   << expected.size() << " (" << join_names(expected) << ")"
                   << (missing.empty() ? "" : "; the file lacks " + missing)
                   << (extra.empty() ? "" : "; the file has extra " + extra)
                   << (missing.empty() && extra.empty() ? "; same names in another order" : "");
  }
  ForestModel m;
  m.impl_ = std::make_unique<Impl>();
  m.features_ = features;
  xgb_check(XGBoosterCreate(nullptr, 0, &m.impl_->booster), "create a booster");
  const int status = XGBoosterLoadModelFromBuffer(m.impl_->booster, bytes.data(), bytes.size());
  STRATA_CHECK(status == 0) << "slowdown model '" << path
                            << "' is not a valid XGBoost model: " << XGBGetLastError();
  bst_ulong count = 0;
  xgb_check(XGBoosterGetNumFeature(m.impl_->booster, &count), "read the feature count");
  STRATA_CHECK(static_cast<size_t>(count) == features.size())
      << "slowdown model '" << path << "' has " << count << " input columns but records "
      << features.size() << " feature names";
  return m;
}

std::vector<float> ForestModel::predict(const float* rows, size_t count) const {
  STRATA_CHECK(impl_ != nullptr) << "predict with no forest";
  Matrix m(rows, count, features_.size());
  const char* config = R"({"type": 0, "training": false, "iteration_begin": 0, "iteration_end": 0,)"
                       R"( "strict_shape": false})";
  const bst_ulong* shape = nullptr;
  bst_ulong dim = 0;
  const float* out = nullptr;
  xgb_check(XGBoosterPredictFromDMatrix(impl_->booster, m.h, config, &shape, &dim, &out),
            "predict");
  return std::vector<float>(out, out + count);
}

#else  // !STRATA_HAVE_XGBOOST

namespace {
[[noreturn]] void no_forest() {
  STRATA_THROW() << "this strata was built with -DSTRATA_WITH_XGBOOST=OFF: DynPipe's slowdown "
                    "forest needs XGBoost (install libxgboost-dev and configure again)";
}
}  // namespace

bool forest_available() { return false; }
struct ForestModel::Impl {};
ForestModel::ForestModel() = default;
ForestModel::~ForestModel() = default;
ForestModel::ForestModel(ForestModel&&) noexcept = default;
ForestModel& ForestModel::operator=(ForestModel&&) noexcept = default;
ForestModel ForestModel::fit(const SlowdownData&, const ForestOptions&) { no_forest(); }
ForestModel ForestModel::load(const std::string&, const std::vector<std::string>&) { no_forest(); }
void ForestModel::save(const std::string&) const { no_forest(); }
std::vector<float> ForestModel::predict(const float*, size_t) const { no_forest(); }

#endif  // STRATA_HAVE_XGBOOST

float ForestModel::predict(const float* row) const { return predict(row, 1)[0]; }

std::vector<float> ForestModel::predict(const SlowdownData& data) const {
  STRATA_CHECK(data.features == features_)
      << "the data's features (" << join_names(data.features) << ") are not the forest's ("
      << join_names(features_) << ")";
  return predict(data.x.data(), data.rows());
}

}  // namespace strata::parallel::dynpipe
