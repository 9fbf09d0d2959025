// --sync and its flags; the factory of the strategies.
#include "parallel/sdpipe/sync_config.h"

#include <cmath>
#include <sstream>

#include "engine/check.h"
#include "parallel/sdpipe/adpsgd_sync.h"
#include "parallel/sdpipe/ps_ssp.h"
#include "parallel/sdpipe/sdpipe_sync.h"

namespace strata::parallel::sdpipe {

SyncKind parse_sync(const std::string& name) {
  if (name == "allreduce") return SyncKind::kAllReduce;
  if (name == "sdpipe") return SyncKind::kSdpipe;
  if (name == "adpsgd") return SyncKind::kAdpsgd;
  if (name == "ps-ssp") return SyncKind::kPsSsp;
  STRATA_THROW() << "--sync " << name << ": unknown (valid: allreduce, sdpipe, adpsgd, ps-ssp)";
}

const char* sync_name(SyncKind kind) {
  switch (kind) {
    case SyncKind::kAllReduce:
      return "allreduce";
    case SyncKind::kSdpipe:
      return "sdpipe";
    case SyncKind::kAdpsgd:
      return "adpsgd";
    case SyncKind::kPsSsp:
      return "ps-ssp";
  }
  return "?";
}

void parse_sync_window(const std::string& text, SyncConfig* config) {
  if (text == "auto") {
    config->window_kind = WindowKind::kAuto;
    return;
  }
  if (text == "inf") {
    config->window_kind = WindowKind::kInfinite;
    return;
  }
  size_t used = 0;
  double seconds = -1;
  try {
    seconds = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  STRATA_CHECK(used == text.size() && !text.empty() && std::isfinite(seconds) && seconds >= 0)
      << "--sync-window " << text << ": expected seconds >= 0, auto or inf";
  config->window_kind = WindowKind::kFixed;
  config->window = seconds;
}

std::string window_text(const SyncConfig& config) {
  switch (config.window_kind) {
    case WindowKind::kAuto:
      return "auto (iteration time / N, widened while groups are too small)";
    case WindowKind::kInfinite:
      return "inf (every replica)";
    case WindowKind::kFixed: {
      std::ostringstream s;
      s << config.window << " s";
      return s.str();
    }
  }
  return "?";
}

std::string describe_sync(const SyncConfig& config, int groups) {
  std::ostringstream s;
  switch (config.kind) {
    case SyncKind::kAllReduce:
      s << "all-reduce of gradients over " << groups << " groups";
      break;
    case SyncKind::kSdpipe:
      s << "sdpipe over " << groups << " groups: local update, then group averaging; window "
        << window_text(config) << ", history P "
        << (config.history > 0 ? std::to_string(config.history) : std::string("off")) << ", token "
        << (config.token ? "on" : "off") << ", query "
        << (config.async_query ? "async" : "blocking");
      if (!config.trace.empty()) s << ", trace " << config.trace;
      break;
    case SyncKind::kAdpsgd:
      s << "adpsgd over " << groups << " groups: local update, then averaging with a random peer";
      break;
    case SyncKind::kPsSsp:
      s << "ps-ssp over " << groups << " groups: local update pushed to a parameter server on "
        << "rank 0, staleness " << config.staleness;
      break;
  }
  return s.str();
}

UpdateSyncFactory make_update_sync_factory(const SyncConfig& config) {
  switch (config.kind) {
    case SyncKind::kAllReduce:
      return nullptr;
    case SyncKind::kSdpipe:
      return [config](const UpdateSyncContext& c) -> std::unique_ptr<UpdateSync> {
        return std::make_unique<SdpipeSync>(c, config);
      };
    case SyncKind::kAdpsgd:
      return [](const UpdateSyncContext& c) -> std::unique_ptr<UpdateSync> {
        return std::make_unique<AdpsgdSync>(c);
      };
    case SyncKind::kPsSsp:
      return [config](const UpdateSyncContext& c) -> std::unique_ptr<UpdateSync> {
        return std::make_unique<PsSspSync>(c, config.staleness);
      };
  }
  return nullptr;
}

}  // namespace strata::parallel::sdpipe
