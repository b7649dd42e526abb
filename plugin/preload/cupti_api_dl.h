// The real CuptiApi: libcupti loaded with dlopen at run time, so that the
// tracer links no CUPTI and still loads (and records operators) on machines
// without CUPTI or a CUDA driver.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "plugin/preload/cupti_api.h"

namespace dynaflow {

// Where to look for libcupti, in order: `env_path` (DYNAFLOW_CUPTI_PATH) when
// set, libcupti.so, libcupti.so.13, libcupti.so.12, then the toolkit's
// library found at build time.
std::vector<std::string> CuptiLibraryCandidates(const char* env_path);

// Takes the first candidate already loaded in the process (e.g. by torch:
// one process must never hold two CUPTIs, so an unusable one is an error),
// else loads the first that dlopen finds and that has every entry point the
// tracer needs. The library stays loaded for the life of the process, since
// CUPTI calls back into it. On failure returns nullptr and sets *error to one
// line saying why.
//
// Every call through the returned API that fails is reported once per entry
// point on stderr ("dynaflow: cuptiActivityEnable failed: CUPTI_ERROR_...").
std::unique_ptr<CuptiApi> LoadCuptiLibrary(const std::vector<std::string>& candidates,
                                           std::string* error);

}  // namespace dynaflow
