#include "parallel/loss_scale.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "engine/check.h"

namespace strata::parallel {
namespace {

bool power_of_two(double v) {
  if (!(v >= 1.0) || !std::isfinite(v)) return false;
  int exponent = 0;
  return std::frexp(v, &exponent) == 0.5;
}

}  // namespace

LossScaleConfig parse_loss_scale(const std::string& text) {
  LossScaleConfig c;
  if (text == "off") return c;
  if (text == "dynamic") {
    c.mode = LossScaleConfig::Mode::kDynamic;
    return c;
  }
  double value = 0.0;
  bool parsed = false;
  if (text.rfind("2^", 0) == 0 && text.size() > 2) {
    char* end = nullptr;
    const long e = std::strtol(text.c_str() + 2, &end, 10);
    parsed = *end == '\0' && e >= 0 && e <= 127;
    if (parsed) value = std::ldexp(1.0, static_cast<int>(e));
  } else if (!text.empty()) {
    char* end = nullptr;
    value = std::strtod(text.c_str(), &end);
    parsed = *end == '\0';
  }
  STRATA_CHECK(parsed && power_of_two(value))
      << "--loss-scale must be off, dynamic, or a power of two >= 1 (e.g. 1024 or 2^10), got '"
      << text << "'";
  c.mode = LossScaleConfig::Mode::kStatic;
  c.init = value;
  return c;
}

std::string loss_scale_name(const LossScaleConfig& config) {
  switch (config.mode) {
    case LossScaleConfig::Mode::kOff:
      return "off";
    case LossScaleConfig::Mode::kDynamic:
      return "dynamic";
    case LossScaleConfig::Mode::kStatic:
      break;
  }
  std::ostringstream s;
  s << "static " << config.init;
  return s.str();
}

void check_loss_scale(const LossScaleConfig& config) {
  if (config.mode == LossScaleConfig::Mode::kOff) return;
  STRATA_CHECK(power_of_two(config.init))
      << "--loss-scale: the scale must be a power of two >= 1, got " << config.init;
  STRATA_CHECK(config.window >= 1)
      << "--loss-scale-window must be at least 1 step, got " << config.window;
  STRATA_CHECK(power_of_two(config.max_scale) && config.max_scale >= config.init)
      << "loss scale: the largest scale " << config.max_scale
      << " must be a power of two no smaller than the first, " << config.init;
}

LossScaler::LossScaler(const LossScaleConfig& config) : config_(config) {
  check_loss_scale(config);
  scale_ = enabled() ? config.init : 1.0;
}

bool LossScaler::update(bool overflow) {
  if (!dynamic()) return false;
  if (overflow) {
    STRATA_CHECK(scale_ > 1.0) << "loss scale: an overflow at scale 1";
    scale_ /= 2;
    good_ = 0;
    return true;
  }
  if (++good_ < config_.window) return false;
  good_ = 0;
  if (scale_ * 2 > config_.max_scale) return false;
  scale_ *= 2;
  return true;
}

void LossScaler::restore(double scale, int64_t good_steps) {
  if (!dynamic()) return;
  STRATA_CHECK(power_of_two(scale) && good_steps >= 0 && good_steps < config_.window)
      << "loss scale: a checkpoint's scale " << scale << " (" << good_steps
      << " good steps) is not a state of --loss-scale dynamic with --loss-scale-window "
      << config_.window;
  scale_ = scale;
  good_ = good_steps;
}

}  // namespace strata::parallel
