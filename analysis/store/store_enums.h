// The TEXT spellings of the model's enums in trace.db (schemas/trace.sql),
// shared by the store's writers and reader, and the SQL both writers share.
#pragma once

#include <string_view>

#include "analysis/model/trace.h"

namespace dynaflow {

const char* ApiKindName(ApiKind kind);
ApiKind ApiKindFromName(std::string_view name);  // kRuntime when unknown

const char* DomainName(RangeDomain domain);
RangeDomain DomainFromName(std::string_view name);  // kUser when unknown

const char* PassName(Pass pass);
Pass PassFromName(std::string_view name);  // kUnknown when unknown

// Upserts a devices row (14 parameters in column order). A device that is
// already stored keeps every property the new row does not know (zero or
// empty); cc_minor follows cc_major, since 0 is a valid minor.
inline constexpr const char* kUpsertDevice =
    "INSERT INTO devices VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
    "ON CONFLICT (rank, device) DO UPDATE SET "
    "name = COALESCE(NULLIF(excluded.name, ''), name), "
    "sm_count = COALESCE(NULLIF(excluded.sm_count, 0), sm_count), "
    "cc_minor = CASE WHEN excluded.cc_major <> 0 THEN excluded.cc_minor ELSE cc_minor END, "
    "cc_major = COALESCE(NULLIF(excluded.cc_major, 0), cc_major), "
    "memory_bytes = COALESCE(NULLIF(excluded.memory_bytes, 0), memory_bytes), "
    "clock_khz = COALESCE(NULLIF(excluded.clock_khz, 0), clock_khz), "
    "memory_bandwidth_gbps = COALESCE(NULLIF(excluded.memory_bandwidth_gbps, 0), "
    "memory_bandwidth_gbps), "
    "peak_tflops_fp32 = COALESCE(NULLIF(excluded.peak_tflops_fp32, 0), peak_tflops_fp32), "
    "peak_tflops_bf16 = COALESCE(NULLIF(excluded.peak_tflops_bf16, 0), peak_tflops_bf16), "
    "peak_tflops_fp8 = COALESCE(NULLIF(excluded.peak_tflops_fp8, 0), peak_tflops_fp8), "
    "properties_json = COALESCE(NULLIF(excluded.properties_json, ''), properties_json)";

// Inserts a processes row (rank, pid, name, label); the first row of a process stays.
inline constexpr const char* kInsertProcess = "INSERT OR IGNORE INTO processes VALUES (?, ?, ?, ?)";
// Upserts one key of a process's metadata (rank, pid, key, value).
inline constexpr const char* kUpsertProcessMeta =
    "INSERT INTO process_meta VALUES (?, ?, ?, ?) "
    "ON CONFLICT (rank, pid, key) DO UPDATE SET value = excluded.value";
// Upserts a rank's distributedInfo (rank, json).
inline constexpr const char* kUpsertDistributedInfo =
    "INSERT INTO distributed_info VALUES (?, ?) "
    "ON CONFLICT (rank) DO UPDATE SET json = excluded.json";

}  // namespace dynaflow
