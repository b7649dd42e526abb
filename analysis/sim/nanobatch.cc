// Candidate: nano-batch overlap (NanoFlow). The batch is split in k
// nano-batches run as k chains. Exclusive groups keep two nano-batches off the
// same unit: one compute-bound task (GEMMs), one heavy memory-bound task
// (attention over the KV cache, weight-bound GEMVs), one collective, one copy
// at a time; light elementwise and normalisation kernels join whatever runs
// (sharing the memory class's bandwidth with it, model.h).
// So a GEMM of one nano-batch runs beside the decode attention of another and
// the collective of a third. Every extra nano-batch reads the weights again
// and launches its own kernels (model.h).
#include <algorithm>

#include "analysis/sim/candidates.h"
#include "analysis/sim/region_split.h"

namespace dynaflow {
namespace {

bool LightKind(OpKind k) {
  return k == OpKind::kElementwise || k == OpKind::kNormalization || k == OpKind::kSoftmax ||
         k == OpKind::kReduction || k == OpKind::kEmbedding;
}

}  // namespace

std::optional<Candidate> MakeNanobatchOverlap(const CandidateContext& ctx) {
  const StepGraph& g = *ctx.graph;
  const int k = std::max(2, ctx.splits);
  int sm_tasks = 0;
  double activation = 0;
  for (const SimTask& t : g.tasks) {
    if (!t.token_scaled) continue;
    if (t.resource != Resource::kCommunication && t.resource != Resource::kCopy) ++sm_tasks;
    // Activations, not the KV cache an attention kernel reads in place.
    if (t.kind != OpKind::kAttention) activation = std::max(activation, t.bytes - t.weight_bytes);
  }
  if (sm_tasks < 2) return std::nullopt;
  Candidate c;
  c.strategy = Strategy::kNanobatchOverlap;
  c.splits = k;
  std::optional<RegionSchedule> staggered;
  if (ctx.region != nullptr) staggered = BuildRegionSplit(ctx, *ctx.region, k);
  if (staggered) {
    c.schedule = std::move(staggered->schedule);
  } else {
    c.schedule = sim_internal::BuildSplit(ctx, k, 4, [](const SimTask& t) -> int32_t {
                   switch (t.resource) {
                     case Resource::kCompute: return 0;
                     case Resource::kMemory: return LightKind(t.kind) ? -1 : 1;
                     case Resource::kLatency: return -1;
                     case Resource::kCommunication: return 2;
                     case Resource::kCopy: return 3;
                   }
                   return 1;
                 }).schedule;
  }
  c.extra_memory_bytes = (k - 1) * sim_internal::kStreamWorkspaceBytes +
                         activation * ctx.scale * (k - 1) / k;
  c.partition.split = "batch";
  c.partition.splits = k;
  auto of = [](Resource r) {
    return [r](const SimTask& t) {
      return t.token_scaled && (t.resource == r || (r == Resource::kMemory && t.resource == Resource::kLatency));
    };
  };
  c.partition.compute_ops = sim_internal::TopNames(ctx, of(Resource::kCompute), false);
  c.partition.memory_ops = sim_internal::TopNames(ctx, of(Resource::kMemory), false);
  c.partition.communication_ops = sim_internal::TopNames(ctx, of(Resource::kCommunication), false);
  c.partition.copy_ops = sim_internal::TopNames(ctx, of(Resource::kCopy), false);
  if (staggered) {
    c.partition.modules = {ctx.region->unit};
    c.partition.stages = ctx.region->stages;
    c.partition.segments = ctx.region->segments;
  } else {
    c.partition.modules = sim_internal::TopNames(ctx, [](const SimTask& t) { return t.token_scaled; }, true);
  }
  return c;
}

}  // namespace dynaflow
