// --sync: how the replicas of a stage across the G pipelines come to agree (papers/sdpipe.md).
//   allreduce  the gradient all-reduce of grouped data parallelism (parallel/grouped_dp.h): every
//              update waits for every pipeline (All-Reduce+Pipe, the default);
//   sdpipe     local update, then averaging within the group SDPipe's scheduler on rank 0 forms
//              from the replicas ready within the window T (sdpipe_sync.h);
//   adpsgd     local update, then averaging with one peer, pairs drawn from a shared seed per
//              update (AD-PSGD+Pipe);
//   ps-ssp     local update pushed to a parameter server on rank 0, weights pulled back under a
//              staleness bound s (PS+SSP, HetPipe-like; ps_ssp.h).
// Only allreduce keeps the replicas identical at every step; the others keep them close and
// average them all at the end of the run (UpdateSync::finish).
#pragma once

#include <string>

#include "parallel/runtime/update_sync.h"
#include "parallel/sdpipe/group_scheduler.h"

namespace strata::parallel::sdpipe {

enum class SyncKind { kAllReduce, kSdpipe, kAdpsgd, kPsSsp };
SyncKind parse_sync(const std::string& name);  // errors name --sync
const char* sync_name(SyncKind kind);

struct SyncConfig {
  SyncKind kind = SyncKind::kAllReduce;
  // --sync-window SECONDS|auto|inf (sdpipe).
  WindowKind window_kind = WindowKind::kAuto;
  double window = 0.0;
  int history = 10;         // --sync-history P (sdpipe; 0: no validation)
  bool token = true;        // --sync-token on|off (sdpipe: the cross-stage enforcement token)
  bool async_query = true;  // --sync-query async|blocking (sdpipe)
  int staleness = 3;        // --ssp-staleness s (ps-ssp)
  std::string trace;        // --sync-trace FILE: the (arrival, group) trace (sdpipe, rank 0)
  int comm_cache = 64;      // sdpipe: group communicators cached per stage
  // Tests: the scheduler stops answering after this many requests (-1: never).
  int64_t hang_after = -1;
};

// Sets the window from --sync-window's text (errors name the flag).
void parse_sync_window(const std::string& text, SyncConfig* config);
std::string window_text(const SyncConfig& config);  // "auto", "inf", "0.05 s"
// One line for the configuration table.
std::string describe_sync(const SyncConfig& config, int groups);

// The strategy of --sync for Trainer (PipelineConfig::update_sync); empty for allreduce.
UpdateSyncFactory make_update_sync_factory(const SyncConfig& config);

}  // namespace strata::parallel::sdpipe
