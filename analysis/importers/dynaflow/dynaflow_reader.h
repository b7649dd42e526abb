// Reads dynaflow's own trace.db (the store written by import and trace).
#pragma once

#include <memory>

#include "analysis/importers/reader.h"

namespace dynaflow {

std::unique_ptr<TraceReader> MakeDynaflowReader();

}  // namespace dynaflow
