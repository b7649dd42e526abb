// Candidate: fusion of a collective with the elementwise and normalisation
// kernels that consume it (TokenWeave: all-reduce + residual add + RMSNorm in
// one kernel on few SMs). For each collective, the first task that waits on it
// and the tasks after it on the same stream, while they are memory- or
// latency-bound elementwise, normalisation or reduction work (at most six),
// merge into the collective's node:
//     work = d(collective) * (1 + fused_overhead) + hidden_share * sum d(fused)
// (the fused math runs on the collective's SMs while it waits on the link).
// Their launches disappear from the host; the host time between them stays.
#include <algorithm>

#include "analysis/sim/candidates.h"

namespace dynaflow {
namespace {

constexpr double kFusedOverhead = 0.05;  // the collective on fewer SMs with extra math
constexpr double kHiddenShare = 0.25;    // the fused kernels' work the link does not hide
constexpr size_t kMaxFused = 6;

bool Fusible(const SimTask& t) {
  return t.token_scaled &&
         (t.resource == Resource::kMemory || t.resource == Resource::kLatency) &&
         (t.kind == OpKind::kElementwise || t.kind == OpKind::kNormalization ||
          t.kind == OpKind::kReduction);
}

}  // namespace

std::optional<Candidate> MakeFusion(const CandidateContext& ctx) {
  const StepGraph& g = *ctx.graph;
  const size_t n = g.tasks.size();
  // Successors and the next task on each task's stream.
  std::vector<std::vector<int32_t>> succ(n);
  std::vector<int32_t> next_on_lane(n, -1), last_on_lane(g.lane_streams.size(), -1);
  for (size_t t = 0; t < n; ++t) {
    for (int32_t d = g.dep_begin[t]; d < g.dep_begin[t + 1]; ++d) {
      succ[static_cast<size_t>(g.deps[static_cast<size_t>(d)])].push_back(static_cast<int32_t>(t));
    }
    int32_t& last = last_on_lane[static_cast<size_t>(g.tasks[t].lane)];
    if (last >= 0) next_on_lane[static_cast<size_t>(last)] = static_cast<int32_t>(t);
    last = static_cast<int32_t>(t);
  }
  std::vector<int32_t> into(n, -1);  // fused task -> its collective
  bool any = false;
  for (size_t c = 0; c < n; ++c) {
    if (g.tasks[c].resource != Resource::kCommunication || into[c] >= 0) continue;
    int32_t u = -1;
    for (int32_t s : succ[c]) {
      if (g.tasks[static_cast<size_t>(s)].lane != g.tasks[c].lane || s != next_on_lane[c]) {
        if (u < 0 || s < u) u = s;
      }
    }
    if (u < 0) u = next_on_lane[c];
    size_t count = 0;
    while (u >= 0 && count < kMaxFused && into[static_cast<size_t>(u)] < 0 &&
           Fusible(g.tasks[static_cast<size_t>(u)])) {
      into[static_cast<size_t>(u)] = static_cast<int32_t>(c);
      ++count;
      u = next_on_lane[static_cast<size_t>(u)];
    }
    any = any || count > 0;
  }
  if (!any) return std::nullopt;

  sim_internal::SplitSchedule base =
      sim_internal::BuildSplit(ctx, 1, 0, [](const SimTask&) { return -1; });
  const Schedule& in = base.schedule;
  // Node ids: fused tasks share their collective's node.
  std::vector<int32_t> node_of(n, -1);
  int32_t next_id = 0;
  for (size_t t = 0; t < n; ++t) {
    if (into[t] < 0) node_of[t] = next_id++;
  }
  for (size_t t = 0; t < n; ++t) {
    if (into[t] >= 0) node_of[t] = node_of[static_cast<size_t>(into[t])];
  }
  std::vector<double> fused_work(n, 0);
  std::vector<std::vector<int32_t>> extra_deps(n);
  for (size_t t = 0; t < n; ++t) {
    if (into[t] < 0) continue;
    const size_t c = static_cast<size_t>(into[t]);
    fused_work[c] += in.nodes[t].work_us;
    for (int32_t d = in.dep_begin[t]; d < in.dep_begin[t + 1]; ++d) {
      extra_deps[c].push_back(in.deps[static_cast<size_t>(d)]);
    }
  }
  Candidate cand;
  cand.strategy = Strategy::kFusion;
  Schedule& out = cand.schedule;
  out.lanes = in.lanes;
  out.lane_names = in.lane_names;
  out.tail_us = in.tail_us;
  std::vector<int32_t> deps;
  for (size_t t = 0; t < n; ++t) {
    if (into[t] >= 0) continue;
    SimNode node = in.nodes[t];
    if (node.sync_node >= 0) node.sync_node = node_of[static_cast<size_t>(node.sync_node)];
    if (fused_work[t] > 0) node.work_us = node.work_us * (1 + kFusedOverhead) + kHiddenShare * fused_work[t];
    deps.clear();
    auto add = [&](int32_t d) {
      const int32_t id = node_of[static_cast<size_t>(d)];
      if (id != node_of[t] && std::find(deps.begin(), deps.end(), id) == deps.end()) deps.push_back(id);
    };
    for (int32_t d = in.dep_begin[t]; d < in.dep_begin[t + 1]; ++d) add(in.deps[static_cast<size_t>(d)]);
    for (int32_t d : extra_deps[t]) add(d);
    out.Add(node, deps);
  }
  // Host: the fused kernels' launch calls disappear; the host time between
  // them moves to the next launch.
  double carry = 0;
  for (int32_t t : in.host_order) {
    const size_t u = static_cast<size_t>(t);
    if (into[u] >= 0) {
      carry += std::max(0.0, in.nodes[u].host_delta_us - g.launch_cost_us);
      continue;
    }
    out.host_order.push_back(node_of[u]);
    out.nodes[static_cast<size_t>(node_of[u])].host_delta_us += carry;
    carry = 0;
  }
  if (in.end_issue) {
    out.end_issue = in.end_issue;
    out.end_issue->host_delta_us += carry;
    if (out.end_issue->sync_node >= 0) {
      out.end_issue->sync_node = node_of[static_cast<size_t>(out.end_issue->sync_node)];
    }
  }
  cand.extra_memory_bytes = sim_internal::LargestMessageBytes(g);
  std::vector<char> is_fused(n, 0), is_root(n, 0);
  for (size_t t = 0; t < n; ++t) {
    if (into[t] >= 0) {
      is_fused[t] = 1;
      is_root[static_cast<size_t>(into[t])] = 1;
    }
  }
  const SimTask* base_task = g.tasks.data();
  auto root = [&](const SimTask& t) { return is_root[static_cast<size_t>(&t - base_task)] != 0; };
  auto fused = [&](const SimTask& t) { return is_fused[static_cast<size_t>(&t - base_task)] != 0; };
  cand.partition.communication_ops = sim_internal::TopNames(ctx, root, false);
  cand.partition.fused = cand.partition.communication_ops;
  for (std::string& s : sim_internal::TopNames(ctx, fused, false)) cand.partition.fused.push_back(s);
  cand.partition.memory_ops = sim_internal::TopNames(ctx, fused, false);
  cand.partition.modules = sim_internal::TopNames(
      ctx, [&](const SimTask& t) { return root(t) || fused(t); }, true);
  return cand;
}

}  // namespace dynaflow
