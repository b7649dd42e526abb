// The Kineto / PyTorch-profiler JSON reader (.json and .json.gz).
#pragma once

#include <memory>

#include "analysis/importers/reader.h"

namespace dynaflow {

std::unique_ptr<TraceReader> MakeKinetoReader();

}  // namespace dynaflow
