// What the dispatch table (ops/dispatch.cpp) holds for each device.
#pragma once

#include <string>
#include <vector>

#include "engine/device.h"

namespace strata::ops {

// True when every op of the table has a kernel for devices of this type in this build.
bool has_kernels_for(DeviceType type);
// The ops that have no kernel for this device type in this build.
std::vector<std::string> ops_without_kernels(DeviceType type);

}  // namespace strata::ops
