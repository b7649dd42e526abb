#include "analysis/sim/region_split.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "runtime/schedule.h"

namespace dynaflow {
namespace {

std::vector<std::string_view> Components(std::string_view path) {
  std::vector<std::string_view> out;
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find('.', begin);
    if (end == std::string_view::npos) end = path.size();
    out.push_back(path.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

bool Digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string Join(const std::vector<std::string_view>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out += '.';
    out += parts[i];
  }
  return out;
}

// "a.b.layers" of the first path with an all-digit component after the root.
std::optional<std::vector<std::string_view>> BlockList(const std::vector<ModuleTime>& calls) {
  for (const ModuleTime& c : calls) {
    if (c.path.find("::") != std::string_view::npos) continue;  // an operator, not a module
    std::vector<std::string_view> parts = Components(c.path);
    for (size_t d = 2; d < parts.size(); ++d) {
      if (Digits(parts[d])) return std::vector<std::string_view>(parts.begin(), parts.begin() + d);
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<SplitRegion> FindSplitRegion(const std::vector<ModuleTime>& calls) {
  const auto list = BlockList(calls);
  if (!list) return std::nullopt;
  const size_t d = list->size();
  SplitRegion region;
  region.unit = Join(*list, d - 1);
  const std::string block = Join(*list, d);
  // The block's children by first appearance, and their time.
  std::vector<std::string> children;
  std::unordered_map<std::string, double> child_time;
  double block_time = 0;
  for (const ModuleTime& c : calls) {
    if (!c.path.starts_with(block + ".")) continue;
    const std::vector<std::string_view> parts = Components(c.path);
    if (parts.size() <= d || !Digits(parts[d])) continue;
    block_time += c.time;
    if (parts.size() <= d + 1) continue;
    const std::string child(parts[d + 1]);
    if (!child_time.contains(child)) children.push_back(child);
    child_time[child] += c.time;
  }
  for (const std::string& child : children) {
    if (child_time[child] >= kStageShare * block_time) region.stages.push_back(block + ".*." + child);
  }
  if (region.stages.size() < 2) region.stages = {block + ".*"};
  std::unordered_set<std::string> instances;
  for (const ModuleTime& c : calls) {
    std::string inst = StageInstance(region, c.path);
    if (!inst.empty()) instances.insert(std::move(inst));
  }
  region.segments = static_cast<int>(instances.size());
  return region;
}

bool InUnit(std::string_view unit, std::string_view path) {
  return path == unit || (path.size() > unit.size() && path.starts_with(unit) && path[unit.size()] == '.');
}

std::string StageInstance(const SplitRegion& region, std::string_view path) {
  const std::vector<std::string_view> q = Components(path);
  for (const std::string& stage : region.stages) {
    const std::vector<std::string_view> p = Components(stage);
    if (q.size() < p.size()) continue;
    bool match = true;
    for (size_t i = 0; i < p.size() && match; ++i) match = p[i] == q[i] || (p[i] == "*" && Digits(q[i]));
    if (match) return Join(q, p.size());
  }
  return "";
}

namespace {

// The segment of each task of the unit (-1 outside it), following the host's
// launch order (then measured order for tasks without a launch call); false
// when a stage instance comes back after another (the unit ran twice) or the
// count differs from the region's.
bool AssignSegments(const CandidateContext& ctx, const SplitRegion& region,
                    std::vector<int32_t>* seg, std::vector<int32_t>* order) {
  const StepGraph& g = *ctx.graph;
  seg->assign(g.tasks.size(), -1);
  std::vector<bool> listed(g.tasks.size(), false);
  *order = g.host_order;
  for (int32_t t : g.host_order) listed[static_cast<size_t>(t)] = true;
  for (size_t t = 0; t < g.tasks.size(); ++t) {
    if (!listed[t]) order->push_back(static_cast<int32_t>(t));
  }
  // The unit's call spans its first to its last task: work launched in
  // between without the unit's path (operators called outside any submodule)
  // is still run by the unit's forward, once per micro-batch.
  auto path_of = [&](int32_t t) -> std::string_view {
    const StringId module = g.tasks[static_cast<size_t>(t)].module;
    return module == 0 ? std::string_view() : ctx.trace->strings.Get(module);
  };
  size_t first = order->size(), last = 0;
  for (size_t i = 0; i < order->size(); ++i) {
    if (InUnit(region.unit, path_of((*order)[i]))) {
      first = std::min(first, i);
      last = i;
    }
  }
  std::unordered_set<std::string> seen;
  std::string current;
  int32_t count = 0;
  for (size_t i = first; i <= last && i < order->size(); ++i) {
    const int32_t t = (*order)[i];
    const std::string_view path = path_of(t);
    std::string inst = InUnit(region.unit, path) ? StageInstance(region, path) : std::string();
    if (!inst.empty() && inst != current) {
      if (!seen.insert(inst).second) return false;
      current = std::move(inst);
      ++count;
    }
    (*seg)[static_cast<size_t>(t)] = std::max(0, count - 1);
  }
  return count == region.segments;
}

}  // namespace

std::optional<RegionSchedule> BuildRegionSplit(const CandidateContext& ctx,
                                               const SplitRegion& region, int k) {
  const StepGraph& g = *ctx.graph;
  auto staggered = runtime::BuildStaggeredRegion(region.segments, k);
  if (!staggered.ok() || k < 2) return std::nullopt;
  std::vector<int32_t> seg, order;
  if (!AssignSegments(ctx, region, &seg, &order)) return std::nullopt;
  const size_t n = g.tasks.size();
  const int32_t lanes = static_cast<int32_t>(g.lane_streams.size());

  // Node ids first (a unit task has one node per micro-batch), so that the
  // stagger may point at nodes of later tasks.
  std::vector<int32_t> first_id(n);
  int32_t next = 0;
  for (size_t t = 0; t < n; ++t) {
    first_id[t] = next;
    next += seg[t] >= 0 ? k : 1;
  }
  auto id = [&](size_t t, int c) { return first_id[t] + (seg[t] >= 0 ? c : 0); };
  // Per segment: its first task in launch order, its last task on each lane.
  std::vector<int32_t> first_of(static_cast<size_t>(region.segments), -1);
  std::vector<std::vector<int32_t>> last_of(static_cast<size_t>(region.segments),
                                            std::vector<int32_t>(static_cast<size_t>(lanes), -1));
  for (int32_t t : order) {
    const int32_t j = seg[static_cast<size_t>(t)];
    if (j < 0) continue;
    if (first_of[static_cast<size_t>(j)] < 0) first_of[static_cast<size_t>(j)] = t;
    int32_t& last = last_of[static_cast<size_t>(j)][static_cast<size_t>(g.tasks[static_cast<size_t>(t)].lane)];
    last = std::max(last, t);
  }

  RegionSchedule out;
  Schedule& sc = out.schedule;
  sc.lanes = lanes * k;
  for (int c = 0; c < k; ++c) {
    for (int32_t l = 0; l < lanes; ++l) {
      sc.lane_names.push_back("batch " + std::to_string(c) + " · stream " +
                              std::to_string(g.lane_streams[static_cast<size_t>(l)]));
    }
  }
  sc.tail_us = g.tail_us;
  std::vector<int32_t> deps;
  for (size_t t = 0; t < n; ++t) {
    const SimTask& task = g.tasks[t];
    const bool in = seg[t] >= 0;
    const double scale = in && task.token_scaled ? ctx.scale / k : ctx.scale;
    const double work = PartDuration(task, scale, ctx.peaks, ctx.params);
    const double hbm = HbmDemand(task, ctx.peaks, ctx.params);
    for (int c = 0; c < (in ? k : 1); ++c) {
      SimNode node;
      node.task = static_cast<int32_t>(t);
      node.chain = c;
      node.lane = task.lane + c * lanes;
      node.resource = task.resource;
      node.work_us = work;
      node.hbm = hbm;
      node.delay_us = task.delay_us;
      node.priority = id(t, c);
      node.launch_latency_us = task.launch_latency_us;
      // Each micro-batch runs the unit's host code again: the same host time.
      node.host_delta_us = task.host_delta_us;
      if (c == 0) node.post_sync_us = task.post_sync_us;
      deps.clear();
      for (int32_t d = g.dep_begin[t]; d < g.dep_begin[t + 1]; ++d) {
        const size_t dt = static_cast<size_t>(g.deps[static_cast<size_t>(d)]);
        if (seg[dt] >= 0 && !in) {
          for (int cc = 0; cc < k; ++cc) deps.push_back(id(dt, cc));  // after the region: a join
        } else {
          deps.push_back(id(dt, c));
        }
      }
      if (in && first_of[static_cast<size_t>(seg[t])] == static_cast<int32_t>(t)) {
        const runtime::TaskId rt = seg[t] * k + c;
        for (runtime::TaskId w : staggered->cross_stream_waits(rt)) {
          const runtime::Task& wt = staggered->task(w);
          for (int32_t last : last_of[static_cast<size_t>(w / k)]) {
            if (last >= 0) deps.push_back(id(static_cast<size_t>(last), wt.micro_batch));
          }
        }
      }
      sc.Add(node, deps);  // returns id(t, c): nodes are added in id order
      out.runtime_task.push_back(in ? seg[t] * k + c : -1);
    }
  }
  for (SimNode& node : sc.nodes) {
    const SimTask& task = g.tasks[static_cast<size_t>(node.task)];
    if (node.post_sync_us >= 0 && task.sync_task >= 0) {
      node.sync_node = id(static_cast<size_t>(task.sync_task), k - 1);
    }
  }
  if (g.end_known) {
    SimNode e;
    e.host_delta_us = g.end.host_delta_us;
    e.post_sync_us = g.end.post_sync_us;
    if (g.end.sync_task >= 0) e.sync_node = id(static_cast<size_t>(g.end.sync_task), k - 1);
    e.launch_latency_us = g.end.latency_us;
    sc.end_issue = e;
  }
  // The host: launches before the unit, then the unit's segments in the
  // runtime schedule's issue order, then everything after.
  std::vector<std::vector<int32_t>> launches(static_cast<size_t>(region.segments));
  std::vector<int32_t> before, after;
  bool started = false;
  for (int32_t t : g.host_order) {
    const int32_t j = seg[static_cast<size_t>(t)];
    started = started || j >= 0;
    if (j >= 0) {
      launches[static_cast<size_t>(j)].push_back(t);
    } else {
      (started ? after : before).push_back(t);
    }
  }
  for (int32_t t : before) sc.host_order.push_back(id(static_cast<size_t>(t), 0));
  for (runtime::TaskId rt : staggered->issue_order()) {
    const runtime::Task& task = staggered->task(rt);
    for (int32_t t : launches[static_cast<size_t>(rt / k)]) {
      sc.host_order.push_back(id(static_cast<size_t>(t), task.micro_batch));
    }
  }
  for (int32_t t : after) sc.host_order.push_back(id(static_cast<size_t>(t), 0));
  return out;
}

}  // namespace dynaflow
