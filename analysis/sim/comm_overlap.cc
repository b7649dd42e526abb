// Candidate: communication overlap without splitting. Deferrable collectives
// (gradient synchronisation, step_graph.h) leave the compute stream for one
// side stream, in their original order; what waited on them now waits only on
// what they waited on. The step still ends when the last collective does.
#include <algorithm>

#include "analysis/sim/candidates.h"

namespace dynaflow {

std::optional<Candidate> MakeCommOverlap(const CandidateContext& ctx) {
  const StepGraph& g = *ctx.graph;
  const size_t n = g.tasks.size();
  std::vector<char> moved(n, 0);
  bool any = false;
  for (size_t t = 0; t < n; ++t) {
    if (g.tasks[t].resource == Resource::kCommunication && g.tasks[t].deferrable) {
      moved[t] = 1;
      any = true;
    }
  }
  if (!any) return std::nullopt;
  sim_internal::SplitSchedule base =
      sim_internal::BuildSplit(ctx, 1, 0, [](const SimTask&) { return -1; });
  const Schedule& in = base.schedule;
  Candidate c;
  c.strategy = Strategy::kCommOverlap;
  Schedule& out = c.schedule;
  out.groups = 0;
  out.lanes = in.lanes + 1;
  out.lane_names = in.lane_names;
  out.lane_names.push_back("side stream (communication)");
  out.tail_us = in.tail_us;
  out.end_issue = in.end_issue;  // node ids are kept
  out.host_order = in.host_order;

  // Dependencies with moved collectives replaced by what they depended on.
  std::vector<int32_t> deps, stack;
  int32_t previous_moved = -1;
  for (size_t t = 0; t < n; ++t) {
    SimNode node = in.nodes[t];
    deps.clear();
    stack.assign(in.deps.begin() + in.dep_begin[t], in.deps.begin() + in.dep_begin[t + 1]);
    if (moved[t]) {
      // Keep its producers, except a moved predecessor (the side stream's order below).
      deps = stack;
      node.lane = in.lanes;
      if (previous_moved >= 0) deps.push_back(previous_moved);
      previous_moved = static_cast<int32_t>(t);
    } else {
      while (!stack.empty()) {
        const int32_t d = stack.back();
        stack.pop_back();
        if (moved[static_cast<size_t>(d)]) {
          for (int32_t e = in.dep_begin[static_cast<size_t>(d)]; e < in.dep_begin[static_cast<size_t>(d) + 1]; ++e) {
            stack.push_back(in.deps[static_cast<size_t>(e)]);
          }
        } else if (std::find(deps.begin(), deps.end(), d) == deps.end()) {
          deps.push_back(d);
        }
      }
    }
    out.Add(node, deps);
  }
  c.extra_memory_bytes = sim_internal::LargestMessageBytes(g);
  auto is_moved = [](const SimTask& t) {
    return t.resource == Resource::kCommunication && t.deferrable;
  };
  c.partition.side_stream = sim_internal::TopNames(ctx, is_moved, false);
  c.partition.communication_ops = c.partition.side_stream;
  c.partition.modules = sim_internal::TopNames(ctx, is_moved, true);
  return c;
}

}  // namespace dynaflow
