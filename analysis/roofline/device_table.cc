#include "analysis/roofline/device_table.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace dynaflow {
namespace {

// Vendor datasheet figures, dense (the datasheets' sparse tensor figures
// halved). More specific names come first: "H100 PCIe" must match before
// "H100". Sources, per row:
//   B200       NVIDIA HGX B200 datasheet, per GPU (NVLink 5: 1.8 TB/s both ways)
//   H200       NVIDIA H200 Tensor Core GPU datasheet, SXM
//   H100       NVIDIA H100 Tensor Core GPU datasheet, SXM, PCIe and NVL columns
//   A100       NVIDIA A100 Tensor Core GPU datasheet (40 GB SXM, 80 GB PCIe/SXM)
//   L40S, L4   NVIDIA L40S and L4 datasheets
//   RTX 4090, RTX 3080, A10G   NVIDIA Ada / Ampere GA102 architecture whitepapers
//   V100, T4   NVIDIA Tesla V100 (SXM2) and T4 datasheets (no TF32 or FP8)
//   MI325X, MI300X   AMD Instinct MI325X / MI300X data sheets (FP32 vector = matrix)
//   MI250X, MI250    AMD Instinct MI250X / MI250 data sheets, halved: ROCm shows
//                    each of the two GCDs as a device. FP32 is the FP32 matrix
//                    (MFMA) peak, what rocBLAS FP32 GEMMs run at; no TF32.
// `interconnect_gbps` is one direction of the per-GPU NVLink / Infinity Fabric.
constexpr std::array<DevicePeaks, 19> kDevices = {{
    {"NVIDIA B200", "b200", 148, 10, 0, 8000, 126, 80, 1100, 2250, 4500, 900},
    {"NVIDIA H200", "h200", 132, 9, 0, 4800, 50, 67, 494.7, 989.4, 1978.9, 450},
    {"NVIDIA H100 PCIe", "h100 pcie", 114, 9, 0, 2000, 50, 51, 378, 756, 1513, 300},
    {"NVIDIA H100 NVL", "h100 nvl", 132, 9, 0, 3900, 50, 60, 417.5, 835.5, 1670.5, 300},
    {"NVIDIA H100 SXM", "h100", 132, 9, 0, 3350, 50, 67, 494.7, 989.4, 1978.9, 450},
    {"NVIDIA A100 40GB", "a100-sxm4-40gb", 108, 8, 0, 1555, 40, 19.5, 156, 312, 0, 300},
    {"NVIDIA A100 PCIe", "a100-pcie", 108, 8, 0, 1935, 40, 19.5, 156, 312, 0, 300},
    {"NVIDIA A100", "a100", 108, 8, 0, 2039, 40, 19.5, 156, 312, 0, 300},
    {"NVIDIA L40S", "l40s", 142, 8, 9, 864, 96, 91.6, 183, 362.05, 733, 0},
    {"NVIDIA L4", "nvidia l4", 58, 8, 9, 300, 48, 30.3, 60, 121, 242.5, 0},
    {"NVIDIA GeForce RTX 4090", "rtx 4090", 128, 8, 9, 1008, 72, 82.6, 82.6, 165.2, 330.3, 0},
    {"NVIDIA GeForce RTX 3080", "rtx 3080", 68, 8, 6, 760, 5, 29.8, 29.8, 59.5, 0, 0},
    {"NVIDIA A10G", "a10g", 80, 8, 6, 600, 6, 31.2, 62.5, 125, 0, 0},
    {"NVIDIA V100", "v100", 80, 7, 0, 900, 6, 15.7, 0, 125, 0, 150},
    {"NVIDIA T4", "tesla t4", 40, 7, 5, 320, 4, 8.1, 0, 65, 0, 0},
    {"AMD Instinct MI325X", "mi325x", 304, 9, 4, 6000, 256, 163.4, 653.7, 1307.4, 2614.9, 448},
    {"AMD Instinct MI300X", "mi300x", 304, 9, 4, 5300, 256, 163.4, 653.7, 1307.4, 2614.9, 448},
    {"AMD Instinct MI250X (one GCD)", "mi250x", 110, 9, 0, 1638.4, 8, 47.85, 0, 191.5, 0, 200},
    {"AMD Instinct MI250 (one GCD)", "mi250", 104, 9, 0, 1638.4, 8, 45.25, 0, 181.05, 0, 200},
}};

// ROCm reports parts missing from its marketing-name table as "AMD Radeon
// Graphics"; for those the compute-unit count names the part.
constexpr std::string_view kGenericAmdName = "amd radeon graphics";

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

const DevicePeaks* LookupDevice(std::string_view device_name, int sm_count) {
  const std::string name = Lower(device_name);
  if (name.empty()) return nullptr;
  for (const DevicePeaks& d : kDevices) {
    if (name.find(d.match) != std::string::npos) return &d;
  }
  // Only a count that names one part (304 CUs are an MI300X or an MI325X).
  const DevicePeaks* by_count = nullptr;
  if (name.find(kGenericAmdName) != std::string::npos && sm_count > 0) {
    for (const DevicePeaks& d : kDevices) {
      if (!d.name.starts_with("AMD") || d.sm_count != sm_count) continue;
      if (by_count != nullptr) return nullptr;
      by_count = &d;
    }
  }
  return by_count;
}

bool FillFromDeviceTable(DeviceInfo* d) {
  const DevicePeaks* p = LookupDevice(d->name, d->sm_count);
  if (p == nullptr) return false;
  if (d->sm_count == 0) d->sm_count = p->sm_count;
  if (d->cc_major == 0) {
    d->cc_major = p->cc_major;
    d->cc_minor = p->cc_minor;
  }
  if (d->memory_bandwidth_gbps == 0) d->memory_bandwidth_gbps = p->memory_bandwidth_gbps;
  if (d->peak_tflops_fp32 == 0) d->peak_tflops_fp32 = p->tflops_fp32;
  if (d->peak_tflops_bf16 == 0) d->peak_tflops_bf16 = p->tflops_bf16;
  if (d->peak_tflops_fp8 == 0) d->peak_tflops_fp8 = p->tflops_fp8;
  return true;
}

}  // namespace dynaflow
