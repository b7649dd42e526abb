// Candidate: communication overlap without splitting, the schedule of
// runtime::BuildCommOverlapRegion over the step. Deferrable collectives
// (gradient synchronisation, step_graph.h) leave the compute stream for one
// side stream, in their original order; nothing in the step reads them, so
// what waited on them now waits only on what they waited on. The step still
// ends when the last collective does.
#include <algorithm>

#include "analysis/sim/candidates.h"
#include "runtime/schedule.h"

namespace dynaflow {

namespace {

// A collective this candidate moves to the side stream.
bool Moved(const SimTask& t) { return t.resource == Resource::kCommunication && t.deferrable; }

}  // namespace

namespace sim_internal {

std::optional<Schedule> CommOverlapSchedule(const CandidateContext& ctx, bool read_at_end) {
  const StepGraph& g = *ctx.graph;
  const size_t n = g.tasks.size();
  // Collective j (launch order) and compute part p of every task: the part
  // of a compute task is the number of collectives launched before it.
  std::vector<int32_t> collective(n, -1), part(n, 0), collectives;
  for (int32_t t : g.host_order) {
    if (Moved(g.tasks[static_cast<size_t>(t)])) {
      collective[static_cast<size_t>(t)] = static_cast<int32_t>(collectives.size());
      collectives.push_back(t);
    } else {
      part[static_cast<size_t>(t)] = static_cast<int32_t>(collectives.size());
    }
  }
  const int m = static_cast<int>(collectives.size());
  if (m == 0) return std::nullopt;
  std::vector<int> consumers(static_cast<size_t>(m));
  for (int j = 0; j < m; ++j) consumers[static_cast<size_t>(j)] = read_at_end ? m + 1 : j + 1;
  auto rt = runtime::BuildCommOverlapRegion(consumers);
  if (!rt.ok()) return std::nullopt;
  std::vector<int32_t> first_of(static_cast<size_t>(m) + 1, -1);
  for (int32_t t : g.host_order) {
    int32_t& first = first_of[static_cast<size_t>(part[static_cast<size_t>(t)])];
    if (collective[static_cast<size_t>(t)] < 0 && first < 0) first = t;
  }

  const Schedule in = BuildSplit(ctx, 1, 0, [](const SimTask&) { return -1; }).schedule;
  Schedule out;
  out.lanes = in.lanes + 1;
  out.lane_names = in.lane_names;
  out.lane_names.push_back("side stream (communication)");
  out.tail_us = in.tail_us;
  out.end_issue = in.end_issue;  // node ids are kept
  out.host_order = in.host_order;
  auto in_deps = [&](int32_t t) {
    return std::vector<int32_t>(in.deps.begin() + in.dep_begin[static_cast<size_t>(t)],
                                in.deps.begin() + in.dep_begin[static_cast<size_t>(t) + 1]);
  };
  std::vector<int32_t> deps, stack;
  for (size_t t = 0; t < n; ++t) {
    SimNode node = in.nodes[t];
    const int32_t j = collective[t];
    if (j >= 0) {
      // The collective keeps what it waited for in the trace (the part of
      // C<j> it reads: its stream's order and its events) and runs on the
      // side lane in launch order.
      deps = in_deps(static_cast<int32_t>(t));
      if (j > 0) deps.push_back(collectives[static_cast<size_t>(j) - 1]);
      node.lane = in.lanes;
      out.Add(node, deps);
      continue;
    }
    // A compute task of part p keeps its wait for a collective that part p
    // reads (consumer <= p); a collective read later is replaced by what it
    // waited for.
    const int32_t p = part[t];
    deps.clear();
    stack = in_deps(static_cast<int32_t>(t));
    while (!stack.empty()) {
      const int32_t d = stack.back();
      stack.pop_back();
      const int32_t dj = collective[static_cast<size_t>(d)];
      if (dj >= 0 && consumers[static_cast<size_t>(dj)] > p) {
        const std::vector<int32_t> up = in_deps(d);
        stack.insert(stack.end(), up.begin(), up.end());
      } else if (std::find(deps.begin(), deps.end(), d) == deps.end()) {
        deps.push_back(d);
      }
    }
    // The first compute of a part waits for the collectives the runtime
    // schedule makes it wait for.
    if (first_of[static_cast<size_t>(p)] == static_cast<int32_t>(t)) {
      for (runtime::TaskId w : rt->cross_stream_waits(2 * p)) {
        const int32_t x = collectives[static_cast<size_t>(w / 2)];
        if (std::find(deps.begin(), deps.end(), x) == deps.end()) deps.push_back(x);
      }
    }
    out.Add(node, deps);
  }
  return out;
}

}  // namespace sim_internal

std::optional<Candidate> MakeCommOverlap(const CandidateContext& ctx) {
  // Deferrable collectives are read only at the step's end.
  std::optional<Schedule> schedule = sim_internal::CommOverlapSchedule(ctx, /*read_at_end=*/true);
  if (!schedule) return std::nullopt;
  Candidate c;
  c.strategy = Strategy::kCommOverlap;
  c.schedule = std::move(*schedule);
  c.extra_memory_bytes = sim_internal::LargestMessageBytes(*ctx.graph);
  c.partition.side_stream = sim_internal::TopNames(ctx, Moved, false);
  c.partition.communication_ops = c.partition.side_stream;
  c.partition.modules = sim_internal::TopNames(ctx, Moved, true);
  return c;
}

}  // namespace dynaflow
