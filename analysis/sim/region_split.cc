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
  const std::string block_dot = block + ".";
  // The block's children by first appearance, and their time.
  std::vector<std::string> children;
  std::unordered_map<std::string, double> child_time;
  double block_time = 0;
  for (const ModuleTime& c : calls) {
    if (!c.path.starts_with(block_dot)) continue;
    const std::vector<std::string_view> parts = Components(c.path);
    if (parts.size() <= d || !Digits(parts[d])) continue;
    block_time += c.time;
    if (parts.size() <= d + 1) continue;
    const std::string child(parts[d + 1]);
    if (!child_time.contains(child)) children.push_back(child);
    child_time[child] += c.time;
  }
  for (const std::string& child : children) {
    if (child_time[child] >= kStageShare * block_time) {
      region.stages.push_back(block + ".*." + child);
    }
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

std::optional<SplitRegion> FindSplitRegion(const Trace& trace, const StepGraph& g) {
  std::vector<ModuleTime> calls;
  calls.reserve(g.host_order.size());
  for (int32_t t : g.host_order) {
    const SimTask& task = g.tasks[static_cast<size_t>(t)];
    if (task.module != 0) calls.push_back({trace.strings.Get(task.module), task.dur_us});
  }
  return FindSplitRegion(calls);
}

bool InUnit(std::string_view unit, std::string_view path) {
  return path == unit ||
         (path.size() > unit.size() && path.starts_with(unit) && path[unit.size()] == '.');
}

std::string StageInstance(const SplitRegion& region, std::string_view path) {
  const std::vector<std::string_view> q = Components(path);
  for (const std::string& stage : region.stages) {
    const std::vector<std::string_view> p = Components(stage);
    if (q.size() < p.size()) continue;
    bool match = true;
    for (size_t i = 0; i < p.size() && match; ++i) {
      match = p[i] == q[i] || (p[i] == "*" && Digits(q[i]));
    }
    if (match) return Join(q, p.size());
  }
  return "";
}

namespace {

// The step's tasks in launch order (then measured order for tasks without a
// launch call), and the unit's call: its first to its last task in that
// order. Work launched in between without the unit's path (operators called
// outside any submodule) is still run by the unit's forward, once per
// micro-batch.
struct UnitCall {
  std::vector<int32_t> order;
  size_t first = 0;
  size_t end = 0;  // one past the last
};

std::string_view PathOf(const CandidateContext& ctx, int32_t t) {
  const StringId module = ctx.graph->tasks[static_cast<size_t>(t)].module;
  return module == 0 ? std::string_view() : ctx.trace->strings.Get(module);
}

UnitCall FindUnitCall(const CandidateContext& ctx, const std::string& unit) {
  const StepGraph& g = *ctx.graph;
  UnitCall call;
  std::vector<bool> listed(g.tasks.size(), false);
  call.order = g.host_order;
  for (int32_t t : g.host_order) listed[static_cast<size_t>(t)] = true;
  for (size_t t = 0; t < g.tasks.size(); ++t) {
    if (!listed[t]) call.order.push_back(static_cast<int32_t>(t));
  }
  call.first = call.order.size();
  for (size_t i = 0; i < call.order.size(); ++i) {
    if (!InUnit(unit, PathOf(ctx, call.order[i]))) continue;
    call.first = std::min(call.first, i);
    call.end = i + 1;
  }
  return call;
}

// The segment of each task of the unit (-1 outside it); false when a stage
// instance comes back after another (the unit ran twice) or the count
// differs from the region's.
bool AssignSegments(const CandidateContext& ctx, const SplitRegion& region, const UnitCall& call,
                    std::vector<int32_t>* seg) {
  seg->assign(ctx.graph->tasks.size(), -1);
  std::unordered_set<std::string> seen;
  std::string current;
  int32_t count = 0;
  for (size_t i = call.first; i < call.end; ++i) {
    const int32_t t = call.order[i];
    const std::string_view path = PathOf(ctx, t);
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

// The part of each task of the unit for dual-batch overlap (-1 outside it):
// compute before the j-th collective is part 2j, the collective 2j + 1.
// Returns the collectives.
int32_t AssignParts(const CandidateContext& ctx, const UnitCall& call, std::vector<int32_t>* part) {
  part->assign(ctx.graph->tasks.size(), -1);
  int32_t collectives = 0;
  for (size_t i = call.first; i < call.end; ++i) {
    const int32_t t = call.order[i];
    if (ctx.graph->tasks[static_cast<size_t>(t)].resource == Resource::kCommunication) {
      (*part)[static_cast<size_t>(t)] = 2 * collectives + 1;
      ++collectives;
    } else {
      (*part)[static_cast<size_t>(t)] = 2 * collectives;
    }
  }
  return collectives;
}

// The step graph with the unit's tasks (part[t] >= 0) run once per
// micro-batch as task part[t] * k + c of `rt`, the rest once.
// `shared_lanes`: every micro-batch's work on the measured lanes (streams
// shared between micro-batches, in the issue order's stream order); else
// micro-batch c on its own copy of the lanes.
class PartsBuilder {
 public:
  PartsBuilder(const CandidateContext& ctx, const std::vector<int32_t>& part,
               const runtime::Schedule& rt, int k, bool shared_lanes)
      : ctx_(ctx), g_(*ctx.graph), part_(part), rt_(rt), k_(k), shared_(shared_lanes) {}

  RegionSchedule Build() {
    AssignIds();
    IndexParts();
    HostOrder();
    Lanes();
    for (size_t t = 0; t < g_.tasks.size(); ++t) AddNodes(t);
    sim_internal::LinkSyncs(g_, [this](int32_t task, int32_t waiting) { return Awaited(task, waiting); },
                            &out_.schedule);
    return std::move(out_);
  }

 private:
  bool In(size_t t) const { return part_[t] >= 0; }
  int32_t Id(size_t t, int c) const { return first_id_[t] + (In(t) ? c : 0); }

  // A micro-batch's blocking call waits for its own micro-batch's part of
  // `task`, as `apply` runs each micro-batch's calls on its own thread and
  // stream: in the staggered issue order the last micro-batch's part comes
  // later, and waiting for it stalled the replay (a tiny Hugging Face Llama on
  // an H200, tests/data/hf_llama_h200.db). Outside the unit, or at the step's
  // end, the last part, which is issued by then.
  int32_t Awaited(int32_t task, int32_t waiting) const {
    int c = k_ - 1;
    if (waiting >= 0) {
      const size_t w = static_cast<size_t>(out_.schedule.nodes[static_cast<size_t>(waiting)].task);
      if (In(w)) c = waiting - first_id_[w];
    }
    return Id(static_cast<size_t>(task), c);
  }

  // Node ids first (a unit task has one node per micro-batch), so that
  // dependencies may point at nodes of later tasks.
  void AssignIds() {
    first_id_.resize(g_.tasks.size());
    int32_t next = 0;
    for (size_t t = 0; t < g_.tasks.size(); ++t) {
      first_id_[t] = next;
      next += In(t) ? k_ : 1;
    }
  }

  // Per part: its first launched task, its last task on each lane.
  void IndexParts() {
    const size_t parts = static_cast<size_t>(rt_.size() / k_);
    const size_t lanes = g_.lane_streams.size();
    first_of_.assign(parts, -1);
    last_of_.assign(parts, std::vector<int32_t>(lanes, -1));
    launches_.assign(parts, {});
    for (int32_t t : g_.host_order) {
      const int32_t p = part_[static_cast<size_t>(t)];
      if (p >= 0) launches_[static_cast<size_t>(p)].push_back(t);
    }
    for (size_t p = 0; p < parts; ++p) {
      if (!launches_[p].empty()) first_of_[p] = launches_[p].front();
    }
    for (size_t t = 0; t < g_.tasks.size(); ++t) {
      if (!In(t)) continue;
      std::vector<int32_t>& lasts = last_of_[static_cast<size_t>(part_[t])];
      int32_t& last = lasts[static_cast<size_t>(g_.tasks[t].lane)];
      last = std::max(last, static_cast<int32_t>(t));
    }
  }

  // Launches before the unit, then its parts in the runtime schedule's issue
  // order, then everything after. The first launch of every runtime task but
  // the first follows a sequencer turn; with shared lanes, each node also
  // follows the node issued before it on its lane.
  void HostOrder() {
    std::vector<int32_t> before, after;
    bool started = false;
    for (int32_t t : g_.host_order) {
      started = started || In(static_cast<size_t>(t));
      if (!In(static_cast<size_t>(t))) (started ? after : before).push_back(t);
    }
    const int32_t nodes = first_id_.empty() ? 0 : Id(g_.tasks.size() - 1, k_ - 1) + 1;
    lane_prev_.assign(static_cast<size_t>(nodes), -1);
    turn_.assign(static_cast<size_t>(nodes), false);
    std::vector<int32_t> last(g_.lane_streams.size(), -1);
    auto issue = [&](int32_t t, int c) {
      const int32_t node = Id(static_cast<size_t>(t), c);
      out_.schedule.host_order.push_back(node);
      if (!shared_) return;
      int32_t& prev = last[static_cast<size_t>(g_.tasks[static_cast<size_t>(t)].lane)];
      lane_prev_[static_cast<size_t>(node)] = prev;
      prev = node;
    };
    for (int32_t t : before) issue(t, 0);
    for (runtime::TaskId task : rt_.issue_order()) {
      const std::vector<int32_t>& launches = launches_[static_cast<size_t>(task / k_)];
      const int c = rt_.task(task).micro_batch;
      if (task > 0 && !launches.empty()) turn_[static_cast<size_t>(Id(launches.front(), c))] = true;
      for (int32_t t : launches) issue(t, c);
    }
    for (int32_t t : after) issue(t, 0);
  }

  void Lanes() {
    const int32_t lanes = static_cast<int32_t>(g_.lane_streams.size());
    Schedule& sc = out_.schedule;
    const int copies = shared_ ? 1 : k_;
    sc.lanes = lanes * copies;
    for (int c = 0; c < copies; ++c) {
      for (int32_t l = 0; l < lanes; ++l) {
        std::string name = "stream " + std::to_string(g_.lane_streams[static_cast<size_t>(l)]);
        sc.lane_names.push_back(shared_ ? name : "batch " + std::to_string(c) + " · " + name);
      }
    }
    sc.tail_us = g_.tail_us;
  }

  // The nodes of task `t`: one per micro-batch in the unit, else one.
  void AddNodes(size_t t) {
    const SimTask& task = g_.tasks[t];
    const double scale = In(t) && task.token_scaled ? ctx_.scale / k_ : ctx_.scale;
    const SimNode part = sim_internal::PartNode(ctx_, t, scale);
    for (int c = 0; c < (In(t) ? k_ : 1); ++c) AddNode(t, c, part);
  }

  void AddNode(size_t t, int c, SimNode node) {
    const SimTask& task = g_.tasks[t];
    node.chain = c;
    node.lane = task.lane + (shared_ ? 0 : c * static_cast<int32_t>(g_.lane_streams.size()));
    node.priority = Id(t, c);
    // Each micro-batch runs the unit's host code again: the same host time.
    node.host_delta_us = task.host_delta_us;
    if (turn_[static_cast<size_t>(Id(t, c))]) node.host_delta_us += ctx_.params.region_turn_us;
    if (c == 0) node.post_sync_us = task.post_sync_us;
    std::vector<int32_t> deps;
    for (int32_t d = g_.dep_begin[t]; d < g_.dep_begin[t + 1]; ++d) {
      const size_t dt = static_cast<size_t>(g_.deps[static_cast<size_t>(d)]);
      if (In(dt) && !In(t)) {
        for (int cc = 0; cc < k_; ++cc) deps.push_back(Id(dt, cc));  // after the unit: a join
      } else {
        deps.push_back(Id(dt, c));
      }
    }
    if (In(t) && first_of_[static_cast<size_t>(part_[t])] == static_cast<int32_t>(t)) {
      for (runtime::TaskId w : rt_.cross_stream_waits(part_[t] * k_ + c)) {
        for (int32_t last : last_of_[static_cast<size_t>(w / k_)]) {
          if (last >= 0) deps.push_back(Id(static_cast<size_t>(last), rt_.task(w).micro_batch));
        }
      }
    }
    const int32_t prev = lane_prev_[static_cast<size_t>(Id(t, c))];
    if (prev >= 0) deps.push_back(prev);
    out_.schedule.Add(node, deps);  // returns Id(t, c): nodes are added in id order
    out_.runtime_task.push_back(In(t) ? part_[t] * k_ + c : -1);
  }

  const CandidateContext& ctx_;
  const StepGraph& g_;
  const std::vector<int32_t>& part_;
  const runtime::Schedule& rt_;
  const int k_;
  const bool shared_;
  std::vector<int32_t> first_id_;
  std::vector<int32_t> first_of_;
  std::vector<std::vector<int32_t>> last_of_;
  std::vector<std::vector<int32_t>> launches_;
  std::vector<int32_t> lane_prev_;
  std::vector<bool> turn_;  // per node: the first launch after a sequencer turn
  RegionSchedule out_;
};

}  // namespace

std::optional<RegionSchedule> BuildRegionSplit(const CandidateContext& ctx,
                                               const SplitRegion& region, int k) {
  auto rt = runtime::BuildStaggeredRegion(region.segments, k);
  if (!rt.ok() || k < 2) return std::nullopt;
  const UnitCall call = FindUnitCall(ctx, region.unit);
  std::vector<int32_t> seg;
  if (!AssignSegments(ctx, region, call, &seg)) return std::nullopt;
  return PartsBuilder(ctx, seg, *rt, k, /*shared_lanes=*/false).Build();
}

std::optional<RegionSchedule> BuildDualBatchRegionSplit(const CandidateContext& ctx,
                                                        const SplitRegion& region,
                                                        int* collectives) {
  const UnitCall call = FindUnitCall(ctx, region.unit);
  std::vector<int32_t> part;
  *collectives = AssignParts(ctx, call, &part);
  auto rt = runtime::BuildDualBatchRegion(*collectives);
  if (!rt.ok()) return std::nullopt;
  return PartsBuilder(ctx, part, *rt, 2, /*shared_lanes=*/true).Build();
}

}  // namespace dynaflow
