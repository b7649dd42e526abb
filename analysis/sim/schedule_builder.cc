#include <algorithm>
#include <unordered_map>

#include "analysis/sim/candidates.h"

namespace dynaflow {

const char* StrategyName(Strategy s) {
  switch (s) {
    case Strategy::kSequential: return "sequential";
    case Strategy::kNanobatchOverlap: return "nanobatch_overlap";
    case Strategy::kDualBatchOverlap: return "dual_batch_overlap";
    case Strategy::kCommOverlap: return "comm_overlap";
    case Strategy::kFusion: return "fusion";
  }
  return "sequential";
}

bool ParseStrategy(std::string_view name, Strategy* out) {
  for (int i = 0; i < kStrategyCount; ++i) {
    if (name == StrategyName(static_cast<Strategy>(i))) {
      *out = static_cast<Strategy>(i);
      return true;
    }
  }
  return false;
}

namespace sim_internal {

SplitSchedule BuildSplit(const CandidateContext& ctx, int k, int groups,
                         const std::function<int32_t(const SimTask&)>& group_of) {
  const StepGraph& g = *ctx.graph;
  const size_t n = g.tasks.size();
  const int32_t lanes = static_cast<int32_t>(g.lane_streams.size());
  SplitSchedule out;
  Schedule& sc = out.schedule;
  sc.groups = k > 1 ? groups : 0;
  sc.lanes = k > 1 ? lanes * k : lanes;
  for (int c = 0; c < (k > 1 ? k : 1); ++c) {
    for (int32_t l = 0; l < lanes; ++l) {
      std::string name = "stream " + std::to_string(g.lane_streams[static_cast<size_t>(l)]);
      if (k > 1) name = "batch " + std::to_string(c) + " · " + name;
      sc.lane_names.push_back(std::move(name));
    }
  }
  sc.tail_us = g.tail_us;
  out.parts.assign(n * static_cast<size_t>(k), -1);
  std::vector<int32_t> deps;
  for (size_t t = 0; t < n; ++t) {
    const SimTask& task = g.tasks[t];
    const bool split = k > 1 && task.token_scaled;
    const int parts = split ? k : 1;
    const SimNode part = PartNode(ctx, t, ctx.scale / parts);
    for (int c = 0; c < parts; ++c) {
      SimNode node = part;
      node.chain = c;
      node.lane = task.lane + (split ? c * lanes : 0);
      node.group = k > 1 ? group_of(task) : -1;
      node.priority = static_cast<int64_t>(t) * k + c;
      if (c == 0) {
        node.host_delta_us = task.host_delta_us;
        node.post_sync_us = task.post_sync_us;
      } else {
        node.host_delta_us = g.launch_cost_us;  // one more launch call
      }
      deps.clear();
      for (int32_t d = g.dep_begin[t]; d < g.dep_begin[t + 1]; ++d) {
        const size_t dt = static_cast<size_t>(g.deps[static_cast<size_t>(d)]);
        const bool dep_split = k > 1 && g.tasks[dt].token_scaled;
        if (dep_split && split) {
          deps.push_back(out.parts[dt * k + c]);
        } else if (dep_split) {  // a per-step task joins every chain
          for (int cc = 0; cc < k; ++cc) deps.push_back(out.parts[dt * k + cc]);
        } else {
          deps.push_back(out.parts[dt * static_cast<size_t>(k)]);
        }
      }
      const int32_t id = sc.Add(node, deps);
      if (split) {
        out.parts[t * k + c] = id;
      } else {
        for (int cc = 0; cc < k; ++cc) out.parts[t * k + cc] = id;
      }
    }
  }
  LinkSyncs(g,
            [&out, k](int32_t task, int32_t) {
              return out.parts[static_cast<size_t>(task) * k + (k - 1)];
            },
            &sc);
  for (int32_t t : g.host_order) {
    const size_t u = static_cast<size_t>(t);
    int32_t last = -1;
    for (int c = 0; c < k; ++c) {
      const int32_t id = out.parts[u * k + c];
      if (id != last) sc.host_order.push_back(id);
      last = id;
    }
  }
  return out;
}

SimNode PartNode(const CandidateContext& ctx, size_t t, double scale) {
  const SimTask& task = ctx.graph->tasks[t];
  SimNode node;
  node.task = static_cast<int32_t>(t);
  node.resource = task.resource;
  node.work_us = PartDuration(task, scale, ctx.peaks, ctx.params);
  node.hbm = HbmDemand(task, ctx.peaks, ctx.params);
  node.sm = SmNeed(task, scale);
  node.delay_us = task.delay_us;
  node.launch_latency_us = task.launch_latency_us;
  return node;
}

void LinkSyncs(const StepGraph& g,
               const std::function<int32_t(int32_t task, int32_t waiting)>& awaited,
               Schedule* schedule) {
  for (size_t i = 0; i < schedule->nodes.size(); ++i) {
    SimNode& node = schedule->nodes[i];
    const SimTask& task = g.tasks[static_cast<size_t>(node.task)];
    if (node.post_sync_us >= 0 && task.sync_task >= 0) {
      node.sync_node = awaited(task.sync_task, static_cast<int32_t>(i));
    }
  }
  if (!g.end_known) return;
  SimNode e;
  e.host_delta_us = g.end.host_delta_us;
  e.post_sync_us = g.end.post_sync_us;
  if (g.end.sync_task >= 0) e.sync_node = awaited(g.end.sync_task, -1);
  e.launch_latency_us = g.end.latency_us;
  schedule->end_issue = e;
}

std::vector<std::string> TopNames(const CandidateContext& ctx,
                                  const std::function<bool(const SimTask&)>& pick, bool modules,
                                  size_t limit) {
  std::unordered_map<StringId, double> time;
  for (const SimTask& t : ctx.graph->tasks) {
    if (!pick(t)) continue;
    const StringId id = modules ? t.module : (t.op != 0 ? t.op : t.kernel);
    if (id != 0) time[id] += t.dur_us;
  }
  std::vector<std::pair<StringId, double>> v(time.begin(), time.end());
  std::sort(v.begin(), v.end(), [&ctx](const auto& a, const auto& b) {
    if (a.second != b.second) return a.second > b.second;
    return ctx.trace->strings.Get(a.first) < ctx.trace->strings.Get(b.first);
  });
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size() && i < limit; ++i) {
    out.emplace_back(ctx.trace->strings.Get(v[i].first));
  }
  return out;
}

double LargestMessageBytes(const StepGraph& graph) {
  double b = 0;
  for (const SimTask& t : graph.tasks) {
    if (t.resource == Resource::kCommunication) b = std::max(b, t.bytes);
  }
  return b;
}

}  // namespace sim_internal
}  // namespace dynaflow
