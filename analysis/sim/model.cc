#include "analysis/sim/model.h"

#include <algorithm>

namespace dynaflow {
namespace {

double GemmEfficiency(double rows, const SimParams& p) {
  if (rows <= 0) return p.gemm_efficiency_max;
  return p.gemm_efficiency_max * rows / (rows + p.gemm_half_rows);
}

// R(s) of model.h, in seconds.
double Roofline(const SimTask& t, double s, const PeakRates& peaks, const SimParams& p) {
  double compute = 0;
  if (t.flops > 0) {
    const double peak = peaks.flops_half > 0 ? peaks.flops_half : 1e15;
    compute = t.flops * s / (peak * GemmEfficiency(t.rows * s, p));
  }
  const double weight = std::min(t.weight_bytes, t.bytes);
  const double bw = (peaks.bytes_per_s > 0 ? peaks.bytes_per_s : 3e12) * p.hbm_efficiency;
  const double memory = (weight + (t.bytes - weight) * s) / bw;
  return std::max(compute, memory);
}

}  // namespace

double PartDuration(const SimTask& t, double s, const PeakRates& peaks, const SimParams& p) {
  if (!t.token_scaled || s == 1.0 || t.resource == Resource::kLatency) return t.dur_us;
  double fixed = p.kernel_fixed_us;
  if (t.resource == Resource::kCommunication) fixed = p.comm_fixed_us;
  if (t.resource == Resource::kCopy) fixed = p.copy_fixed_us;
  fixed = std::min(fixed, 0.5 * t.dur_us);
  double g = s;
  if ((t.resource == Resource::kCompute || t.resource == Resource::kMemory) &&
      (t.flops > 0 || t.bytes > 0)) {
    const double r1 = Roofline(t, 1.0, peaks, p);
    if (r1 > 0) g = Roofline(t, s, peaks, p) / r1;
  }
  return fixed + (t.dur_us - fixed) * g;
}

double SmNeed(const SimTask& t, double s) {
  if (t.grid_waves <= 0) return 0;
  if (!t.token_scaled || PersistentGrid(t)) return std::min(1.0, t.grid_waves);
  return std::min(1.0, t.grid_waves * s);
}

bool PersistentGrid(const SimTask& t) { return t.grid_waves == 1.0; }

double HbmDemand(const SimTask& t, const PeakRates& peaks, const SimParams& p) {
  double fallback = p.hbm_memory;
  switch (t.resource) {
    case Resource::kCompute: fallback = p.hbm_compute; break;
    case Resource::kMemory: fallback = p.hbm_memory; break;
    case Resource::kCommunication: return p.hbm_comm;
    case Resource::kCopy: return p.hbm_copy;
    case Resource::kLatency: return p.hbm_latency;
  }
  if (t.bytes > 0 && t.dur_us > 0 && peaks.bytes_per_s > 0) {
    const double achieved = t.bytes / (t.dur_us * 1e-6) / peaks.bytes_per_s;
    const double lo = t.resource == Resource::kMemory ? p.hbm_memory_min : p.hbm_min;
    return std::clamp(achieved, lo, p.hbm_max);
  }
  return fallback;
}

}  // namespace dynaflow
