// The physical lower bound of a schedule: however its nodes overlap, each
// resource class must still do all of its work.
//
// A node's `work_us` is its duration alone on the device, the extra weight
// reads and fixed costs of a split included (model.h, PartDuration), and its
// class (bound.h) names the unit it saturates when it runs alone. So, with
// W(c) the summed work of class c,
//     makespan >= W(c) / capacity(c)   for every class c,
// where a compute node's work counts times its SM footprint when known
// (SimNode::sm: a kernel on a fraction of the SMs leaves the rest to others),
// capacity is 1 for compute (the SMs), memory (HBM bandwidth) and
// communication (the interconnect), and kCopyEngines for copies. Latency-bound
// kernels saturate no shared unit (they wait on launches), so they bound
// nothing. The sharing model of model.h holds every class to its capacity,
// hence Simulate() never finishes a schedule below BoundOf(); a prediction that
// does is a defect of the model, which the advisor clamps and records
// (advisor.h, BoundCheck).
#pragma once

#include "analysis/roofline/bound.h"
#include "analysis/sim/simulator.h"

namespace dynaflow {

// Copy engines that run copies side by side at full speed: one per direction
// (host-to-device, device-to-host) on every NVIDIA data-center part since
// Kepler; model.h shares more than this many concurrent copies.
inline constexpr double kCopyEngines = 2.0;

struct PhysicalBound {
  double class_work_us[kResourceCount] = {};  // W(c): summed work alone per class
  double bound_us = 0;                        // max over c of W(c) / capacity(c)
  Resource binding = Resource::kCompute;      // the class that sets bound_us
};

// The bound of `schedule` from its own nodes (not from the simulation).
PhysicalBound BoundOf(const Schedule& schedule);

}  // namespace dynaflow
