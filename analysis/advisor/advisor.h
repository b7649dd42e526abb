// The advisor: from a trace to idle-resource windows, recommendations and a
// plan. Data flows one way:
//   trace -> operator links, resource classes (roofline) -> steps
//         -> idle windows (per device)
//         -> step graph of the critical device's representative step
//         -> candidate schedules per workload bucket -> simulator
//         -> per-bucket choice -> recommendations + Plan
//
// The critical device is the one with the longest mean step (in SPMD work the
// slowest rank sets the pace). Predictions are relative: a candidate's
// predicted step is the measured mean step divided by the simulated speedup
// (simulated sequential / simulated candidate, same scale), which cancels the
// simulator's error on the measured schedule; `replay_error_pct` reports that
// error.
//
// The physical bound (analysis/sim/physical_bound.h): every candidate's
// simulated step is held to at least its schedule's bound. One that finishes
// below it exposes a defect of the sharing model; it is clamped to the bound
// (never rejected, so the comparison between strategies stays complete) and
// marked `clamped` in AdviceResult::bound_checks, which tests read.
//
// Workload buckets: the step is simulated at tokens T0 * {1/16, ..., 4} (T0:
// tokens per step observed: the serving annotation's, attention's query rows,
// else the most common GEMM row count; StepGraph::tokens). At each point the
// best candidate wins if it beats sequential by `min_gain`; neighbouring
// points with the same choice merge into one bucket, bounded at the geometric
// mean of the points on either side. Without a token count there is one bucket;
// a step of more than 5,000 tasks gets the coarser grid {1/16, 1/4, 1, 4}.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "analysis/advisor/plan.h"
#include "analysis/model/trace.h"
#include "analysis/roofline/bound.h"
#include "analysis/sim/candidates.h"
#include "analysis/sim/physical_bound.h"
#include "analysis/sim/step_graph.h"
#include "analysis/steps/steps.h"
#include "analysis/windows/windows.h"

namespace dynaflow {

struct AdviseOptions {
  double min_gain = 0.03;                // a strategy must beat sequential by this much
  std::optional<Strategy> force;         // --force-strategy
  int splits = 0;                        // nano-batches; 0: try 2 and 4
  std::vector<double> scales = {1.0 / 16, 1.0 / 8, 1.0 / 4, 1.0 / 2, 1, 2, 4};
  BoundOptions bound;
  WindowOptions windows;
  GraphOptions graph;
  SimParams sim;
};

// Per device: what the report shows.
struct DeviceAdvice {
  uint32_t device_index = 0;
  int32_t rank = 0;
  int32_t device = 0;
  PeakRates peaks;
  ResourceTotals totals[kResourceCount];
  std::vector<OperatorRoofline> operators;
  int64_t linked_kernels = 0;
  int64_t costed_kernels = 0;
  StepSource step_source = StepSource::kWhole;
  std::vector<Step> steps;
  size_t representative = 0;
  double step_mean_us = 0, step_median_us = 0, step_min_us = 0, step_max_us = 0,
         step_stdev_us = 0, step_cv_pct = 0;
  int64_t step_layers = 0;  // DeviceSteps::layers: the layer stack's repeats inside the one step
  DeviceWindows windows;
};

struct WorkloadBucket {
  double min_tokens = 0;
  std::optional<double> max_tokens;
  double tokens = 0;  // the tokens the prediction is for (the observed ones in their bucket)
};

struct Recommendation {
  Strategy strategy = Strategy::kSequential;
  int splits = 1;
  double predicted_speedup = 1;
  double baseline_step_us = 0;
  double predicted_step_us = 0;
  double extra_memory_bytes = 0;
  WorkloadBucket bucket;
  Partition partition;
  std::string rationale;
  int32_t rank = 0;
  int32_t device = 0;
};

// One step drawn as lanes of bars, for the HTML timelines.
struct PictureBar {
  double start_us = 0;
  double end_us = 0;
  int32_t lane = 0;
  Resource resource = Resource::kMemory;
  StringId name = 0;
};
struct StepPicture {
  std::string title;
  std::vector<std::string> lanes;
  std::vector<PictureBar> bars;
  std::vector<KindInterval> windows;  // relative to the step start
  double span_us = 0;
};

// One candidate at one workload point against its physical bound, both in
// microseconds of the reported step (the measured mean step's scale).
struct BoundCheck {
  std::string phase;  // the phase whose step was simulated; empty: the observed step
  double tokens = 0;  // the workload point (0: no token count)
  Strategy strategy = Strategy::kSequential;
  int splits = 1;
  double predicted_step_us = 0;  // as reported: never below bound_step_us
  double simulated_step_us = 0;  // before holding to the bound
  double bound_step_us = 0;
  Resource binding = Resource::kCompute;  // the class that sets the bound
  bool clamped = false;  // simulated below the bound: a model defect, held to it
};

struct AdviceResult {
  std::vector<DeviceAdvice> devices;  // in Trace::devices order, devices with GPU activity
  std::vector<Recommendation> recommendations;  // observed bucket, best first
  Plan plan;
  bool has_graph = false;
  uint32_t critical_device = 0;  // Trace::devices index
  double replay_error_pct = 0;   // simulated sequential vs measured representative step
  // The same without the measured GPU-side gaps (step_graph.h `delay_us`):
  // what the dependency graph and the host explain alone. NaN: did not finish.
  double replay_error_without_gaps_pct = 0;
  // Why the replay of the representative step could not finish (the
  // simulator's SimResult::stall); empty when it finished. Then there are no
  // recommendations and replay_error_pct means nothing.
  std::string replay_unfinished;
  // The simulated step's phase and where plan.tokens_per_step came from.
  StepPhase phase = StepPhase::kUnknown;
  TokenSource tokens_source = TokenSource::kNone;
  std::vector<BoundCheck> bound_checks;  // every candidate at every workload point
  // Phases of the trace's steps that got no buckets of their own, each with
  // the reason ("decode: ..."); `dynaflow apply` gives their calls the
  // buckets without a phase.
  std::vector<std::string> unplanned_phases;
  StepPicture measured;
  StepPicture predicted;
};

AdviceResult Advise(const Trace& trace, const std::vector<std::string>& inputs,
                    const AdviseOptions& options);

}  // namespace dynaflow
