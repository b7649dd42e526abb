// The Nsight Systems importer: reads the SQLite export of an nsys report
// (`nsys export --type sqlite`, or `nsys stats`' side product) into a Trace.
//
// It tolerates the schema drift between nsys versions: every table and every
// non-essential column may be missing, and names may be StringIds references
// or inline text. Malformed rows are counted in Trace::stats, never fatal.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "analysis/importers/reader.h"

namespace dynaflow {

// The reader for format "nsys".
std::unique_ptr<TraceReader> MakeNsysReader();

// A host thread as nsys serializes it in `globalTid` (and a process in
// `globalPid`, whose tid part is 0): bits 0..23 hold the tid, bits 24..47 the
// pid, the bits above identify the machine (VM / hardware id).
struct NsysThreadId {
  int32_t pid = 0;
  int32_t tid = 0;
};
NsysThreadId DecodeNsysGlobalTid(int64_t global_tid);

// The short name of a memcpy kind value ("HtoD", "DtoH", "PtoP", ...) as CUPTI
// and nsys number them; "Unknown" for values they do not name.
std::string NsysCopyKindName(int64_t copy_kind);

// The short name of an nsys enum label for a memcpy kind, e.g.
// "CUDA_MEMCPY_KIND_HTOD" -> "HtoD", "CUDA_MEMCPY_KIND_UVM_DTOH" -> "UVM DtoH".
std::string NsysCopyKindFromEnumName(std::string_view enum_name);

// A CUDA API name without the ABI version suffix nsys appends:
// "cudaLaunchKernel_v7000" -> "cudaLaunchKernel"; other names are unchanged.
std::string_view StripNsysApiVersion(std::string_view name);

}  // namespace dynaflow
