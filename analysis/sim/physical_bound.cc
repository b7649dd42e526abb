#include "analysis/sim/physical_bound.h"

namespace dynaflow {
namespace {

// How many nodes of class `r` run side by side at full speed (0: unbounded).
double Capacity(Resource r) {
  switch (r) {
    case Resource::kCompute:
    case Resource::kMemory:
    case Resource::kCommunication: return 1.0;
    case Resource::kCopy: return kCopyEngines;
    case Resource::kLatency: return 0.0;
  }
  return 0.0;
}

}  // namespace

PhysicalBound BoundOf(const Schedule& schedule) {
  PhysicalBound b;
  for (const SimNode& n : schedule.nodes) {
    const bool footprint = n.resource == Resource::kCompute && n.sm > 0;
    b.class_work_us[static_cast<int>(n.resource)] += footprint ? n.work_us * n.sm : n.work_us;
  }
  for (int c = 0; c < kResourceCount; ++c) {
    const double cap = Capacity(static_cast<Resource>(c));
    if (cap <= 0) continue;
    const double t = b.class_work_us[c] / cap;
    if (t > b.bound_us) {
      b.bound_us = t;
      b.binding = static_cast<Resource>(c);
    }
  }
  return b;
}

}  // namespace dynaflow
