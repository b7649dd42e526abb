#include "analysis/roofline/device_table.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace dynaflow {
namespace {

// Vendor datasheet figures. More specific names come first: "H100 PCIe" must
// match before "H100".
constexpr std::array<DevicePeaks, 16> kDevices = {{
    {"NVIDIA B200", "b200", 148, 10, 0, 8000, 126, 80, 1100, 2250, 4500, 900},
    {"NVIDIA H200", "h200", 132, 9, 0, 4800, 50, 67, 494.7, 989.4, 1978.9, 450},
    {"NVIDIA H100 PCIe", "h100 pcie", 114, 9, 0, 2000, 50, 51, 378, 756, 1513, 300},
    {"NVIDIA H100 SXM", "h100", 132, 9, 0, 3350, 50, 67, 494.7, 989.4, 1978.9, 450},
    {"NVIDIA A100 40GB", "a100-sxm4-40gb", 108, 8, 0, 1555, 40, 19.5, 156, 312, 0, 300},
    {"NVIDIA A100 PCIe", "a100-pcie", 108, 8, 0, 1935, 40, 19.5, 156, 312, 0, 300},
    {"NVIDIA A100", "a100", 108, 8, 0, 2039, 40, 19.5, 156, 312, 0, 300},
    {"NVIDIA L40S", "l40s", 142, 8, 9, 864, 96, 91.6, 183, 362, 733, 0},
    {"NVIDIA L4", "nvidia l4", 58, 8, 9, 300, 48, 30.3, 60, 121, 242.5, 0},
    {"NVIDIA GeForce RTX 4090", "rtx 4090", 128, 8, 9, 1008, 72, 82.6, 82.6, 165.2, 330.3, 0},
    {"NVIDIA GeForce RTX 3080", "rtx 3080", 68, 8, 6, 760, 5, 29.8, 29.8, 59.5, 0, 0},
    {"NVIDIA A10G", "a10g", 80, 8, 6, 600, 6, 31.2, 62.5, 125, 0, 0},
    {"NVIDIA V100", "v100", 80, 7, 0, 900, 6, 15.7, 0, 125, 0, 150},
    {"NVIDIA T4", "tesla t4", 40, 7, 5, 320, 4, 8.1, 0, 65, 0, 0},
    {"AMD Instinct MI300X", "mi300x", 304, 9, 4, 5300, 256, 163.4, 653.7, 1307.4, 2614.9, 448},
    {"AMD Instinct MI250X", "mi250", 220, 9, 0, 3277, 16, 47.9, 95.7, 383, 0, 400},
}};

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

const DevicePeaks* LookupDevice(std::string_view device_name) {
  const std::string name = Lower(device_name);
  if (name.empty()) return nullptr;
  for (const DevicePeaks& d : kDevices) {
    if (name.find(d.match) != std::string::npos) return &d;
  }
  return nullptr;
}

bool FillFromDeviceTable(DeviceInfo* d) {
  const DevicePeaks* p = LookupDevice(d->name);
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
