// Loss scaling (--loss-scale): the loss gradient is multiplied by a power of two S before the
// backward pass so that small gradients survive 16-bit arithmetic, and the gradients are divided
// by S inside the optimizer step (folded into the clipping factor). Multiplying by a power of two
// is exact in binary floating point, and every backward op is linear in its incoming gradient, so
// with fp32 arithmetic the unscaled gradients, and the weights, are bit for bit those of an
// unscaled run unless a value over- or underflows.
//
// Dynamic scaling: a step whose gradient is not finite while its loss is (an overflow of the
// scaled gradient) is skipped on every rank, counted with the skipped steps and logged, and S is
// halved; after `window` steps in a row without overflow S is doubled. At S = 1 there is nothing
// left to unscale: a non-finite gradient is then a real one and --nan-policy decides. A static
// scale never changes: its overflows go to --nan-policy too. The scale and the count of good
// steps are part of a checkpoint, so a resumed run scales as the uninterrupted one.
#pragma once

#include <cstdint>
#include <string>

namespace strata::parallel {

struct LossScaleConfig {
  enum class Mode { kOff, kStatic, kDynamic };
  Mode mode = Mode::kOff;
  double init = 65536.0;      // the first scale (a power of two)
  int64_t window = 2000;      // dynamic: good steps in a row before S doubles
  double max_scale = 0x1p64;  // dynamic: S never grows past this
};

// "off", "dynamic", or a power of two (a static scale, e.g. 1024 or 2^10). Throws strata::Error
// naming --loss-scale otherwise.
LossScaleConfig parse_loss_scale(const std::string& text);
std::string loss_scale_name(const LossScaleConfig& config);  // "off", "dynamic", "static 1024"
// Throws strata::Error naming the flag for a scale that is not a power of two >= 1 or a window < 1.
void check_loss_scale(const LossScaleConfig& config);

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& config);

  bool enabled() const { return config_.mode != LossScaleConfig::Mode::kOff; }
  bool dynamic() const { return config_.mode == LossScaleConfig::Mode::kDynamic; }
  // The factor of this step's loss gradient (1 when off).
  double scale() const { return scale_; }
  int64_t good_steps() const { return good_; }
  // Whether a non-finite gradient with a finite loss at the current scale is an overflow to skip
  // and recover from (dynamic, S > 1), rather than a case for --nan-policy.
  bool absorbs_overflow() const { return dynamic() && scale_ > 1.0; }
  // After a step: `overflow` when it was skipped as an overflow (S halves), otherwise a good
  // step (S doubles after `window` of them in a row). Returns whether S changed.
  bool update(bool overflow);
  // A checkpoint's state (dynamic only; ignored otherwise).
  void restore(double scale, int64_t good_steps);

 private:
  LossScaleConfig config_;
  double scale_ = 1.0;
  int64_t good_ = 0;
};

}  // namespace strata::parallel
