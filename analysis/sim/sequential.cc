// Candidate: the step as measured, scaled to the bucket's batch.
#include "analysis/sim/candidates.h"

namespace dynaflow {

std::optional<Candidate> MakeSequential(const CandidateContext& ctx) {
  Candidate c;
  c.strategy = Strategy::kSequential;
  c.splits = 1;
  c.schedule = sim_internal::BuildSplit(ctx, 1, 0, [](const SimTask&) { return -1; }).schedule;
  c.partition.split = "none";
  return c;
}

}  // namespace dynaflow
