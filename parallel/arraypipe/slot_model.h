// How many block-state slots a job-array's stages need under a memory limit (issue 17 item 3,
// `strata train --array-slots auto`), from vPIPE's memory model of a stage
// (parallel/vpipe/memory_model.h) evaluated per job at its micro-batch size.
//
// Per stage, with K slots for J jobs:
//   peak(K) = (K + [K < J]) x state + sum_j held_j + max_j transient_j (+ J x grads with
//   `keep_grads`, the gradients that stay on the device for every job)
// where state is one job's parameters, gradients, optimizer state and statistics (the largest
// job's), held_j what job j's forward block leaves on the stage until its
// backward block (its M micro-batches' dependent memory and the stage's boundary tensors) and
// transient_j the worst moment of its running micro-batch above that. Every job's held memory is
// counted: a valid task graph may run every forward block of a stage before any backward block
// (gpipe's order on the first stage does), so the bound holds whatever the scheduler picks. The
// extra state is the eviction on its way to the host (parallel/arraypipe/state_slots.h).
#pragma once

#include <string>
#include <vector>

namespace strata::parallel::arraypipe {

struct SlotModelStage {
  double state_bytes = 0.0;             // one job's block state (the largest job's)
  double grads_bytes = 0.0;             // one job's gradients (counted per job under keep_grads)
  std::vector<double> held_bytes;       // per job
  std::vector<double> transient_bytes;  // per job
};

// The modelled peak of `stage` with `slots` slots.
double modelled_slot_peak(const SlotModelStage& stage, int slots, bool keep_grads);

struct SlotChoice {
  int slots = 0;                   // the largest K <= jobs whose peak fits every stage; 0: none
  std::vector<double> peak_bytes;  // per stage at `slots` (at 1 when none fits)
  int worst_stage = 0;             // the stage with the highest peak at `slots` (or at 1)
};

// `limit` > 0.
SlotChoice choose_slots(const std::vector<SlotModelStage>& stages, double limit, bool keep_grads);

// The most jobs like the average of `stage`'s that fit `limit` with `slots` slots (at least
// `slots` jobs; 0 when not even that many fit).
int largest_array(const SlotModelStage& stage, int slots, double limit, bool keep_grads);

}  // namespace strata::parallel::arraypipe
