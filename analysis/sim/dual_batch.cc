// Candidate: dual-batch overlap. Two micro-batches of half the batch; one
// micro-batch computes at a time, so the only overlap is one micro-batch's
// collectives and copies under the other's compute, as vLLM's DBO and
// SGLang's TBO schedule them. With module paths, the split region's unit cut
// at its collectives (region_split.h: the object `apply` executes); without,
// the SM work of both shares one exclusive group.
#include <algorithm>

#include "analysis/sim/candidates.h"
#include "analysis/sim/region_split.h"

namespace dynaflow {

std::optional<Candidate> MakeDualBatchOverlap(const CandidateContext& ctx) {
  const StepGraph& g = *ctx.graph;
  bool comm = false, scaled = false;
  double activation = 0;
  for (const SimTask& t : g.tasks) {
    comm = comm || (t.resource == Resource::kCommunication && t.token_scaled);
    scaled = scaled || t.token_scaled;
    if (t.token_scaled && t.kind != OpKind::kAttention) {
      activation = std::max(activation, t.bytes - t.weight_bytes);
    }
  }
  if (!comm || !scaled) return std::nullopt;
  Candidate c;
  c.strategy = Strategy::kDualBatchOverlap;
  c.splits = 2;
  int collectives = 0;
  std::optional<RegionSchedule> region;
  if (ctx.region != nullptr) region = BuildDualBatchRegionSplit(ctx, *ctx.region, &collectives);
  if (region) {
    c.schedule = std::move(region->schedule);
    c.partition.modules = {ctx.region->unit};
    c.partition.segments = collectives;
  } else {
    c.schedule = sim_internal::BuildSplit(ctx, 2, 3, [](const SimTask& t) -> int32_t {
                   switch (t.resource) {
                     case Resource::kCommunication: return 1;
                     case Resource::kCopy: return 2;
                     default: return 0;
                   }
                 }).schedule;
  }
  // A second stream's GEMM workspace, a second collective buffer and half of
  // the largest activation held twice while the micro-batches interleave.
  c.extra_memory_bytes = sim_internal::kStreamWorkspaceBytes +
                         sim_internal::LargestMessageBytes(g) + activation * ctx.scale / 2;
  c.partition.split = "batch";
  c.partition.splits = 2;
  auto sm = [](const SimTask& t) {
    return t.token_scaled && t.resource != Resource::kCommunication && t.resource != Resource::kCopy;
  };
  auto link = [](const SimTask& t) { return t.token_scaled && t.resource == Resource::kCommunication; };
  c.partition.compute_ops = sim_internal::TopNames(ctx, sm, false);
  c.partition.communication_ops = sim_internal::TopNames(ctx, link, false);
  if (!region) {
    c.partition.modules = sim_internal::TopNames(ctx, [](const SimTask& t) { return t.token_scaled; }, true);
  }
  return c;
}

}  // namespace dynaflow
