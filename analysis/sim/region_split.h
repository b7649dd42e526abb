// The split region of a model and the simulated schedule of running it
// staggered: the prediction of what `dynaflow apply` executes.
//
// A decoder's repeated blocks ("LlamaForCausalLM.model.layers.<i>") sit in a
// list whose parent module ("LlamaForCausalLM.model") runs them all: that
// parent is the split unit, and its micro-batches flow through every block
// without a join. The blocks' busiest children ("...layers.*.self_attn",
// "...layers.*.mlp") are the stages: each of their calls after the first cuts
// the unit's run into a new segment, and runtime::BuildStaggeredRegion
// staggers the micro-batches by one segment. `apply` runs that schedule
// object (plugin/apply), and BuildRegionSplit below simulates it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/sim/candidates.h"

namespace dynaflow {

struct SplitRegion {
  std::string unit;                 // the module whose forward is split
  std::vector<std::string> stages;  // module patterns ("*" for the block index)
  int segments = 0;                 // stage calls in one call of the unit
};

// One module call seen in a step: its module path and time.
struct ModuleTime {
  std::string_view path;
  double time = 0;
};

// The region of one call of the model, from its operators' module paths in
// launch order. Stages are the block's children that take at least
// `kStageShare` of the block's time (at least two, else the block itself):
// a decoder layer's attention and MLP (each a third or more of a layer's
// GPU time), not its normalisations (a few percent), whose segments would be
// too short to hide anything beside.
// nullopt without a repeated block (no path with an all-digit component).
inline constexpr double kStageShare = 0.15;
std::optional<SplitRegion> FindSplitRegion(const std::vector<ModuleTime>& calls);
// The same over a step graph's tasks (their module paths in launch order,
// weighed by their measured time).
std::optional<SplitRegion> FindSplitRegion(const Trace& trace, const StepGraph& graph);

// Whether module `path` lies in `unit`, and the stage instance it lies in
// ("...layers.3.mlp" for "...layers.3.mlp.down_proj"), empty for none.
bool InUnit(std::string_view unit, std::string_view path);
std::string StageInstance(const SplitRegion& region, std::string_view path);

// The step graph under the region's staggered schedule with `k` micro-batches
// (runtime::BuildStaggeredRegion(region.segments, k)): each task of the unit
// runs once per micro-batch, on that micro-batch's own lanes (token-scaled
// work at 1/k of the batch, per-call work whole); tasks outside the unit run
// once. A segment's first task waits for the segments its runtime task waits
// for (the last task of each, on every lane), and the host issues the
// segments in the runtime schedule's issue order. nullopt when the step's
// tasks do not follow the region (no module paths, or the unit called more
// than once in the step, or a segment count other than `region.segments`).
struct RegionSchedule {
  Schedule schedule;
  std::vector<int32_t> runtime_task;  // per node: the runtime task it is part of, -1 outside the unit
};
std::optional<RegionSchedule> BuildRegionSplit(const CandidateContext& ctx,
                                               const SplitRegion& region, int k);

// The step graph under dual-batch overlap of the region's unit
// (runtime::BuildDualBatchRegion(collectives)): the unit runs once per
// micro-batch (2), cut at its collectives (communication tasks) into compute
// parts and collective parts; the host issues the parts in the runtime
// schedule's issue order, and each lane keeps CUDA's stream order in that
// issue order, so the two micro-batches' compute shares the compute lanes
// and one micro-batch's collective runs beside the other's compute.
// `*collectives` receives the collectives per unit call. nullopt when the
// unit launches no collective, or its tasks do not follow one unit call.
std::optional<RegionSchedule> BuildDualBatchRegionSplit(const CandidateContext& ctx,
                                                        const SplitRegion& region,
                                                        int* collectives);

}  // namespace dynaflow
