// Peak numbers of common GPUs: what a trace rarely records but the roofline
// and the simulator need. Dense (no structured sparsity) tensor-core peaks.
#pragma once

#include <string_view>

#include "analysis/model/trace.h"

namespace dynaflow {

struct DevicePeaks {
  std::string_view name;   // canonical marketing name
  std::string_view match;  // case-insensitive substring of the reported device name
  int sm_count;            // SMs (CUs on AMD parts)
  int cc_major;
  int cc_minor;
  double memory_bandwidth_gbps;
  double l2_mb;
  double tflops_fp32;  // FP32 without TF32: CUDA cores (NVIDIA), FP32 matrix cores (AMD)
  double tflops_tf32;  // 0 when the part has no TF32 (then FP32 applies)
  double tflops_bf16;  // also FP16 on every part listed
  double tflops_fp8;   // 0 when the part has no FP8 tensor cores
  double interconnect_gbps;  // per-GPU NVLink/xGMI bandwidth, one direction
};

// The part whose name matches `device_name`, or nullptr. `sm_count` (the
// trace's SM/CU count, 0 when unknown) names AMD parts that ROCm reports as
// the generic "AMD Radeon Graphics".
const DevicePeaks* LookupDevice(std::string_view device_name, int sm_count = 0);

// Fills the fields of `d` that are zero from the table entry that matches its
// name; leaves `d` unchanged for unknown parts. Returns whether it matched.
bool FillFromDeviceTable(DeviceInfo* d);

}  // namespace dynaflow
