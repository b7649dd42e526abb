#include "analysis/advisor/advisor.h"

#include "analysis/sim/region_split.h"
#include "analysis/steps/workload.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace dynaflow {
namespace {

// FNV-1a, 64 bits.
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  }
  void Str(std::string_view s) {
    Bytes(s.data(), s.size());
    Bytes("\0", 1);
  }
  void Int(int64_t v) { Bytes(&v, sizeof v); }
  std::string Hex() const {
    char buf[20];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
  }
};

std::string Duration(double us) {
  char buf[32];
  if (us >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.3f s", us / 1e6);
  } else if (us >= 1000) {
    std::snprintf(buf, sizeof buf, "%.3f ms", us / 1000);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f us", us);
  }
  return buf;
}

std::string Pct(double part, double whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", whole > 0 ? 100.0 * part / whole : 0.0);
  return buf;
}

std::string Short(const std::string& s, size_t width = 60) {
  return s.size() <= width ? s : s.substr(0, width - 3) + "...";
}

std::string First(const std::vector<std::string>& v, const char* fallback) {
  return v.empty() ? std::string(fallback) : Short(v.front());
}

struct Eval {
  Candidate cand;
  SimResult result;
  PhysicalBound bound;
  double makespan_us = 0;  // simulated, clamped to bound.bound_us
  bool clamped = false;    // the simulation finished below the bound
  double speedup = 1;
};

// Relative slack before a simulated makespan counts as below its bound: the
// fluid simulation accumulates rounding over thousands of events.
constexpr double kBoundTolerance = 1e-9;

// A simulation below its physical bound is a defect of the sharing model
// (physical_bound.h): the candidate is held to the bound and marked.
void HoldToBound(Eval& e) {
  e.bound = BoundOf(e.cand.schedule);
  e.makespan_us = e.result.makespan_us;
  if (e.makespan_us < e.bound.bound_us * (1.0 - kBoundTolerance)) {
    e.clamped = true;
    e.makespan_us = e.bound.bound_us;
  }
}

// Every applicable candidate at `scale`; element 0 is sequential.
// Every candidate at one workload point, sequential first; empty when the
// sequential replay cannot finish, with the simulator's reason in `*stall`.
std::vector<Eval> EvaluateAt(CandidateContext ctx, double scale, const AdviseOptions& opt,
                             std::string* stall) {
  ctx.scale = scale;
  std::vector<Eval> out;
  auto run = [&](std::optional<Candidate> c) {
    if (!c) return;
    Eval e;
    e.result = Simulate(c->schedule, ctx.params);
    if (out.empty() && !e.result.ok) *stall = e.result.stall;
    if (!e.result.ok || e.result.makespan_us <= 0) return;
    e.cand = std::move(*c);
    HoldToBound(e);
    out.push_back(std::move(e));
  };
  run(MakeSequential(ctx));
  if (out.empty()) return out;
  run(MakeCommOverlap(ctx));
  run(MakeFusion(ctx));
  run(MakeDualBatchOverlap(ctx));
  std::vector<int> ks = opt.splits > 0 ? std::vector<int>{opt.splits} : std::vector<int>{2, 4};
  for (int k : ks) {
    ctx.splits = k;
    run(MakeNanobatchOverlap(ctx));
  }
  const double base = out.front().makespan_us;
  for (Eval& e : out) e.speedup = base / e.makespan_us;
  return out;
}

// The replay error when the graph keeps none of the measured GPU-side gaps
// (SimTask::delay_us): only durations, dependencies and the host remain, as
// Lumos replays. NaN when that replay cannot finish.
double ReplayErrorWithoutGaps(CandidateContext ctx, const StepGraph& graph) {
  StepGraph bare = graph;
  for (SimTask& t : bare.tasks) t.delay_us = 0;
  ctx.graph = &bare;
  ctx.scale = 1.0;
  const SimResult r = Simulate(MakeSequential(ctx)->schedule, ctx.params);
  if (!r.ok || graph.measured_us <= 0) return std::nan("");
  return 100.0 * (r.makespan_us - graph.measured_us) / graph.measured_us;
}

// Recoverable time of the simulated device's windows is what the simulator
// recovers, not the windows' upper bound (windows.h): the saving per step of
// the best candidate among the strategies that address a window's kind,
// shared over the windows of those kinds in proportion to their upper bounds,
// and never above a window's own bound.
//   communication exposed: comm_overlap, dual_batch_overlap, fusion;
//   copy exposed, memory bound, compute bound: nanobatch_overlap;
//   gpu idle, launch bound: none (no candidate removes host time; CUDA graphs
//     are not simulated), so 0.
void RecoverableFromSimulation(const std::vector<Eval>& evals, double baseline, DeviceWindows* dw) {
  auto saving = [&](std::initializer_list<Strategy> strategies) {
    double best = 0;
    for (const Eval& e : evals) {
      for (Strategy s : strategies) {
        if (e.cand.strategy == s && e.speedup > 0) best = std::max(best, baseline - baseline / e.speedup);
      }
    }
    return best;
  };
  auto group_of = [](WindowKind k) {
    switch (k) {
      case WindowKind::kCommExposed: return 0;
      case WindowKind::kCopyExposed:
      case WindowKind::kMemoryBound:
      case WindowKind::kComputeBound: return 1;
      case WindowKind::kLaunchBound:
      case WindowKind::kGpuIdle: return 2;
    }
    return 2;
  };
  const double group_saving[3] = {
      saving({Strategy::kCommOverlap, Strategy::kDualBatchOverlap, Strategy::kFusion}),
      saving({Strategy::kNanobatchOverlap}), 0.0};
  double group_bound[3] = {0, 0, 0};
  for (const IdleWindow& w : dw->windows) group_bound[group_of(w.kind)] += w.recoverable_us;
  for (IdleWindow& w : dw->windows) {
    const int g = group_of(w.kind);
    const double share = group_bound[g] > 0 ? group_saving[g] * w.recoverable_us / group_bound[g] : 0.0;
    w.recoverable_us = std::min(w.recoverable_us, share);
    w.recoverable_simulated = true;
  }
  std::stable_sort(dw->windows.begin(), dw->windows.end(), [](const IdleWindow& a, const IdleWindow& b) {
    return a.recoverable_us != b.recoverable_us ? a.recoverable_us > b.recoverable_us
                                                : a.per_step_us > b.per_step_us;
  });
}

// The best evaluation of one strategy (nano-batches: over the split counts).
const Eval* BestOf(const std::vector<Eval>& evals, Strategy s) {
  const Eval* best = nullptr;
  for (const Eval& e : evals) {
    if (e.cand.strategy == s && (best == nullptr || e.speedup > best->speedup)) best = &e;
  }
  return best;
}

const Eval* Choose(const std::vector<Eval>& evals, const AdviseOptions& opt) {
  if (opt.force) {
    const Eval* f = BestOf(evals, *opt.force);
    return f != nullptr ? f : &evals.front();
  }
  const Eval* best = &evals.front();
  for (const Eval& e : evals) {
    if (e.cand.strategy != Strategy::kSequential && e.speedup >= 1.0 + opt.min_gain &&
        e.speedup > best->speedup) {
      best = &e;
    }
  }
  return best;
}

std::string Rationale(const Eval& e, const DeviceAdvice& d, const std::vector<Eval>& evals,
                      const AdviseOptions& opt, double baseline_us) {
  const Partition& p = e.cand.partition;
  const double step = d.step_mean_us;
  const double exposed_comm = d.windows.per_step_us[static_cast<int>(WindowKind::kCommExposed)];
  const double memory = d.windows.per_step_us[static_cast<int>(WindowKind::kMemoryBound)];
  const std::string pred =
      "predicted " + Duration(baseline_us) + " -> " + Duration(baseline_us / e.speedup) + " per step";
  if (e.cand.strategy != Strategy::kSequential && e.speedup < 1.0) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "Would slow the step (%.2fx, ", e.speedup);
    std::string why;
    switch (e.cand.strategy) {
      case Strategy::kNanobatchOverlap:
      case Strategy::kDualBatchOverlap:
        why = "every extra micro-batch re-reads the weights and launches its kernels again, and "
              "too little differently-bound work overlaps";
        break;
      case Strategy::kCommOverlap:
        why = "the collectives slow the compute they would hide under more than they save";
        break;
      case Strategy::kFusion:
        why = "the fused kernel is slower than the kernels it replaces";
        break;
      case Strategy::kSequential: break;
    }
    return buf + pred + "): " + why + ".";
  }
  switch (e.cand.strategy) {
    case Strategy::kCommOverlap:
      return "Move " + First(p.side_stream, "the gradient collectives") +
             " (gradient synchronisation) to a side stream so compute no longer waits on it: " +
             Pct(exposed_comm, step) + " of the step is exposed communication; " + pred + ".";
    case Strategy::kFusion: {
      std::string consumers;
      for (size_t i = 0; i < p.memory_ops.size() && i < 3; ++i) {
        consumers += (i ? ", " : "") + Short(p.memory_ops[i], 40);
      }
      return "Fuse " + First(p.communication_ops, "the collective") +
             " with the elementwise/norm operators that consume it (" +
             (consumers.empty() ? std::string("its consumers") : consumers) +
             ") into one kernel on few SMs (TokenWeave); " + pred + ".";
    }
    case Strategy::kDualBatchOverlap:
      return "Split the batch in two micro-batches so one computes while the other runs " +
             First(p.communication_ops, "its collectives") + " (" + Pct(exposed_comm, step) +
             " of the step is exposed communication); " + pred + ".";
    case Strategy::kNanobatchOverlap: {
      // The overlap partner: the largest of the windows a split can fill.
      const double copy = d.windows.per_step_us[static_cast<int>(WindowKind::kCopyExposed)];
      std::string partner = "the other nano-batches' work";
      if (!p.memory_ops.empty() && memory >= exposed_comm && memory >= copy) {
        partner = "memory-bound work such as " + First(p.memory_ops, "") + " (tensor cores idle in " +
                  Pct(memory, step) + " of the step)";
      } else if (!p.communication_ops.empty() && exposed_comm >= copy) {
        partner = First(p.communication_ops, "") + " (" + Pct(exposed_comm, step) +
                  " of the step is exposed communication)";
      } else if (!p.copy_ops.empty()) {
        partner = "copies such as " + First(p.copy_ops, "") + " (SMs idle under copies in " +
                  Pct(copy, step) + " of the step)";
      }
      return "Split the batch in " + std::to_string(e.cand.splits) + " nano-batches so " + partner +
             " runs beside " + (p.compute_ops.empty() ? std::string("the rest of the step")
                                                      : "compute-bound " + First(p.compute_ops, "")) +
             "; each extra nano-batch re-reads the weights; " + pred + ".";
    }
    case Strategy::kSequential: {
      const Eval* best = nullptr;
      for (const Eval& x : evals) {
        if (x.cand.strategy != Strategy::kSequential && (best == nullptr || x.speedup > best->speedup)) best = &x;
      }
      if (best == nullptr) return "Keep the measured schedule: no overlap strategy applies to this step.";
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.2fx", best->speedup);
      if (best->speedup < 1.0 + opt.min_gain) {
        return std::string("Stay sequential: no strategy gains ") + Pct(opt.min_gain, 1.0) +
               " at this batch (best " + StrategyName(best->cand.strategy) + " at " + buf +
               "); splitting re-reads weights and adds launches.";
      }
      return "The measured schedule, the baseline of this bucket.";
    }
  }
  return "";
}

// The unit `dynaflow apply` splits for a module path: the path cut after its
// last all-digit component, which becomes "*" ("M.layers.3.mlp.up_proj" ->
// "M.layers.*"): a block of a ModuleList, whichever layer the step's busiest
// work came from. Names without such a component (a top-level module, an
// operator of a trace without module paths) are kept as they are.
std::string SplitUnit(const std::string& path) {
  size_t begin = 0;
  size_t unit_end = std::string::npos;
  while (begin <= path.size()) {
    size_t end = path.find('.', begin);
    if (end == std::string::npos) end = path.size();
    const bool digits = end > begin && std::all_of(path.begin() + begin, path.begin() + end,
                                                   [](char ch) { return ch >= '0' && ch <= '9'; });
    if (digits) unit_end = begin;
    begin = end + 1;
  }
  return unit_end == std::string::npos ? path : path.substr(0, unit_end) + "*";
}

// The distinct split units of `modules`. Only nn.Module paths: where the trace
// has none, a partition names operators ("aten::conv2d", "autograd::...") in
// their place, which `apply` cannot split, so they are left out (the plan then
// splits nothing, and `advise` says so).
std::vector<std::string> SplitUnits(const std::vector<std::string>& modules) {
  std::vector<std::string> units;
  for (const std::string& m : modules) {
    if (m.find("::") != std::string::npos) continue;
    std::string u = SplitUnit(m);
    if (std::find(units.begin(), units.end(), u) == units.end()) units.push_back(std::move(u));
  }
  return units;
}

// The split region of the trace's operators (by start), for a trace without
// GPU work. Each operator weighs one: CPU times hold one-off warm-up (the
// first projection of a tiny model took 88 ms of a 100 ms run).
std::optional<SplitRegion> RegionOfOperators(const Trace& trace) {
  std::vector<ModuleTime> calls;
  for (const Operator& op : trace.ops) {
    if (op.module_path != 0) calls.push_back({trace.strings.Get(op.module_path), 1.0});
  }
  return FindSplitRegion(calls);
}

// Collective calls per call of the region's unit, from a trace's operators:
// the c10d operators in the unit over the unit's calls (each entry of a
// thread into the unit's first stage instance). 0 without either.
int CollectivesPerCall(const Trace& trace, const SplitRegion& region) {
  std::string first_instance;
  int64_t collectives = 0, calls = 0;
  std::map<std::pair<int32_t, int32_t>, std::string> current;  // (pid, tid) -> stage instance
  for (const Operator& op : trace.ops) {
    if (op.module_path == 0) continue;
    const std::string_view path = trace.strings.Get(op.module_path);
    if (!InUnit(region.unit, path)) continue;
    if (trace.strings.Get(op.name).starts_with("c10d::")) ++collectives;
    std::string inst = StageInstance(region, path);
    if (inst.empty()) continue;
    if (first_instance.empty()) first_instance = inst;
    std::string& cur = current[{op.pid, op.tid}];
    if (inst != cur && inst == first_instance) ++calls;
    cur = std::move(inst);
  }
  return calls > 0 ? static_cast<int>(collectives / calls) : 0;
}

bool SplitsBatch(Strategy s) {
  return s == Strategy::kNanobatchOverlap || s == Strategy::kDualBatchOverlap;
}

// --force-strategy on a trace without a step graph (no GPU activity: a run on
// the CPU): the split rule comes from the operators' module paths, busiest
// first, so that `apply` can be exercised on any machine. Replaced by the
// simulated plan when the trace has GPU work.
// --force-strategy comm_overlap on a trace without a step graph: the modules
// that make collectives (c10d operators), as patterns, run with their
// collectives launched asynchronously.
void ForceOverlapWithoutGraph(const Trace& trace, Plan& plan) {
  std::vector<std::string> modules;
  std::unordered_set<StringId> seen;
  for (const Operator& op : trace.ops) {
    if (op.module_path == 0 || !trace.strings.Get(op.name).starts_with("c10d::")) continue;
    if (seen.insert(op.module_path).second) modules.emplace_back(trace.strings.Get(op.module_path));
  }
  std::vector<std::string> units = SplitUnits(modules);
  if (units.empty()) return;
  const std::string rule = std::string(StrategyName(plan.strategy)) + ".side_stream";
  plan.partition_rules = {{rule, "side_stream", {"c10d::"}, std::move(units)}};
  plan.buckets.front().rules = {rule};
}

// The region plans of ForceWithoutGraph: dual-batch overlap of the unit cut
// at its collectives, or nano-batch overlap of the unit cut at its stages.
// False when the trace gives no such region.
bool ForceRegionWithoutGraph(const Trace& trace, Plan& plan) {
  const std::optional<SplitRegion> region = RegionOfOperators(trace);
  if (!region) return false;
  PlanBucket& only = plan.buckets.front();
  const std::string s = StrategyName(plan.strategy);
  if (plan.strategy == Strategy::kDualBatchOverlap) {
    const int collectives = CollectivesPerCall(trace, *region);
    if (collectives == 0) return false;
    plan.splits = 2;
    only.splits = 2;
    plan.partition_rules = {{s + ".split", "split", {}, {region->unit}}};
    only.rules = {s + ".split"};
    only.segments = collectives;
    return true;
  }
  if (region->segments == 0) return false;
  plan.partition_rules = {{s + ".split", "split", {}, {region->unit}},
                          {s + ".stage", "stage", {}, region->stages}};
  only.rules = {s + ".split", s + ".stage"};
  only.segments = region->segments;
  return true;
}

void ForceWithoutGraph(const Trace& trace, const AdviseOptions& opt, Plan& plan) {
  if (plan.strategy == Strategy::kCommOverlap) ForceOverlapWithoutGraph(trace, plan);
  if (!SplitsBatch(plan.strategy)) return;
  plan.splits = opt.splits > 0 ? opt.splits : 2;
  PlanBucket& only = plan.buckets.front();
  only.splits = plan.splits;
  if (ForceRegionWithoutGraph(trace, plan)) return;
  // Without a region: the repeated blocks themselves, busiest first.
  std::unordered_map<StringId, double> time;
  for (const Operator& op : trace.ops) {
    if (op.module_path != 0) time[op.module_path] += static_cast<double>(op.end - op.start);
  }
  std::vector<std::pair<StringId, double>> by_time(time.begin(), time.end());
  std::sort(by_time.begin(), by_time.end(), [&trace](const auto& a, const auto& b) {
    if (a.second != b.second) return a.second > b.second;
    return trace.strings.Get(a.first) < trace.strings.Get(b.first);
  });
  std::vector<std::string> modules;
  for (const auto& [id, t] : by_time) modules.emplace_back(trace.strings.Get(id));
  // Only repeated blocks: a whole model split is what no unit at all means.
  std::vector<std::string> units;
  for (std::string& u : SplitUnits(modules)) {
    if (u.ends_with("*")) units.push_back(std::move(u));
  }
  if (units.empty()) return;
  PlanRule rule{std::string(StrategyName(plan.strategy)) + ".split", "split", {}, std::move(units)};
  only.rules = {rule.name};
  plan.partition_rules = {std::move(rule)};
}

std::vector<PlanRule> RulesFor(const Candidate& c) {
  const std::string s = StrategyName(c.strategy);
  const Partition& p = c.partition;
  std::vector<PlanRule> rules;
  auto add = [&](const char* role, const std::vector<std::string>& ops, const std::vector<std::string>& mods) {
    if (ops.empty() && mods.empty()) return;
    rules.push_back({s + "." + role, role, ops, mods});
  };
  switch (c.strategy) {
    case Strategy::kSequential: break;
    case Strategy::kCommOverlap: add("side_stream", p.side_stream, SplitUnits(p.modules)); break;
    case Strategy::kFusion: add("fused", p.fused, p.modules); break;
    case Strategy::kDualBatchOverlap:
      add("split", {}, SplitUnits(p.modules));
      add("compute", p.compute_ops, {});
      add("communication", p.communication_ops, {});
      break;
    case Strategy::kNanobatchOverlap:
      add("split", {}, SplitUnits(p.modules));
      add("stage", {}, p.stages);
      add("compute", p.compute_ops, {});
      add("memory", p.memory_ops, {});
      add("communication", p.communication_ops, {});
      add("copy", p.copy_ops, {});
      break;
  }
  return rules;
}

// Every candidate evaluated at every workload point, against its physical
// bound, in the report's terms: simulated microseconds times `to_step`
// (measured mean step / simulated sequential step at the observed point).
std::vector<BoundCheck> BoundChecks(const std::vector<std::vector<Eval>>& evals,
                                    const std::vector<double>& tokens, double to_step) {
  std::vector<BoundCheck> out;
  for (size_t i = 0; i < evals.size(); ++i) {
    for (const Eval& e : evals[i]) {
      out.push_back({"", tokens[i], e.cand.strategy, e.cand.splits, e.makespan_us * to_step,
                     e.result.makespan_us * to_step, e.bound.bound_us * to_step, e.bound.binding,
                     e.clamped});
    }
  }
  return out;
}

StepPicture Picture(const Trace& trace, const StepGraph& g, const Schedule& s, const SimResult& r,
                    std::string title, size_t max_bars) {
  StepPicture pic;
  pic.title = std::move(title);
  pic.lanes = s.lane_names;
  double origin = 0;
  for (double t : r.start_us) origin = std::min(origin, t);
  for (size_t i = 0; i < s.nodes.size() && pic.bars.size() < max_bars; ++i) {
    const SimNode& n = s.nodes[i];
    const SimTask& t = g.tasks[static_cast<size_t>(n.task)];
    pic.bars.push_back({r.start_us[i] - origin, r.end_us[i] - origin, n.lane, n.resource,
                        t.op != 0 ? t.op : t.kernel});
  }
  pic.span_us = r.makespan_us;
  (void)trace;
  return pic;
}

// The candidates' context for `graph`, whose split region (FindSplitRegion's)
// is `region`: both must outlive it.
CandidateContext ContextFor(const Trace& trace, const StepGraph& graph,
                            const std::optional<SplitRegion>& region, const DeviceResources& dr,
                            const AdviseOptions& opt) {
  CandidateContext ctx;
  ctx.trace = &trace;
  ctx.graph = &graph;
  ctx.region = region ? &*region : nullptr;
  ctx.peaks = dr.peaks;
  ctx.params = opt.sim;
  return ctx;
}

// The token grid one step graph is simulated at (token counts around the
// step's own), with every candidate's evaluation at each point.
struct Grid {
  std::vector<std::vector<Eval>> evals;
  std::vector<double> tokens;
  size_t observed = 0;  // the step's own token count
};

// Fills `grid` for `ctx`'s step; false, with `unfinished` saying why, when a
// replay could not finish.
bool EvaluateGrid(const CandidateContext& ctx, const AdviseOptions& opt, Grid* grid, std::string* unfinished) {
  const StepGraph& graph = *ctx.graph;
  // Big steps (no step structure found, a whole trace) get a coarser grid:
  // the simulations cost in proportion to tasks x points.
  std::vector<double> scales = graph.tokens > 0 ? opt.scales : std::vector<double>{1.0};
  if (graph.tokens > 0 && graph.tasks.size() > 5000 && scales.size() > 4) {
    scales = {1.0 / 16, 1.0 / 4, 1, 4};
  }
  if (std::find(scales.begin(), scales.end(), 1.0) == scales.end()) scales.push_back(1.0);
  std::sort(scales.begin(), scales.end());
  std::vector<std::vector<Eval>>& evals = grid->evals;
  std::vector<double>& tokens = grid->tokens;
  for (double s : scales) {
    const double t = graph.tokens > 0 ? std::max(1.0, std::round(graph.tokens * s)) : 0;
    if (s == 1.0) {
      // The observed point, replacing a neighbour that rounded to the same count.
      if (!tokens.empty() && t == tokens.back()) {
        tokens.pop_back();
        evals.pop_back();
      }
      grid->observed = tokens.size();
    } else if (!tokens.empty() && t == tokens.back()) {
      continue;
    }
    std::string stall;
    evals.push_back(EvaluateAt(ctx, s == 1.0 || graph.tokens <= 0 ? 1.0 : t / graph.tokens, opt, &stall));
    tokens.push_back(t);
    if (evals.back().empty()) {
      *unfinished = stall.empty() ? "the sequential replay took no time" : stall;
      return false;
    }
  }
  return true;
}

// A bucket's strategy and split count from its chosen candidate: a forced
// strategy holds in every bucket, predicted as sequential where it does not
// apply.
Strategy ChosenStrategy(const Eval& e, const AdviseOptions& opt) {
  return opt.force ? *opt.force : e.cand.strategy;
}

int ChosenSplits(const Eval& e, const AdviseOptions& opt) {
  if (!opt.force || e.cand.strategy == *opt.force) return e.cand.splits;
  const bool split = *opt.force == Strategy::kNanobatchOverlap || *opt.force == Strategy::kDualBatchOverlap;
  return split ? (*opt.force == Strategy::kNanobatchOverlap && opt.splits > 0 ? opt.splits : 2) : 1;
}

std::vector<const Eval*> Choices(const Grid& grid, const AdviseOptions& opt) {
  std::vector<const Eval*> choice;
  for (const auto& e : grid.evals) choice.push_back(Choose(e, opt));
  return choice;
}

// The per-point choices of `grid` merged into buckets of `phase` (empty: for
// every call), appended to plan->buckets and their rules to
// plan->partition_rules. `baseline_us` is the measured step the observed
// point's sequential replay stands for. Returns the index of the bucket that
// holds the observed point.
size_t AppendTiling(const Grid& grid, const std::vector<const Eval*>& choice, double baseline_us,
                    const std::string& phase, const AdviseOptions& opt, Plan* plan) {
  const std::vector<double>& tokens = grid.tokens;
  const double seq_observed = grid.evals[grid.observed].front().makespan_us;
  size_t observed_bucket = 0;
  for (size_t i = 0; i < choice.size();) {
    size_t j = i;
    while (j + 1 < choice.size() && ChosenStrategy(*choice[j + 1], opt) == ChosenStrategy(*choice[i], opt) &&
           ChosenSplits(*choice[j + 1], opt) == ChosenSplits(*choice[i], opt)) {
      ++j;
    }
    const size_t rep = grid.observed >= i && grid.observed <= j ? grid.observed : i;
    if (rep == grid.observed) observed_bucket = plan->buckets.size();
    const Eval& e = *choice[rep];
    PlanBucket b;
    b.phase = phase;
    b.min_tokens = i == 0 ? 0 : std::round(std::sqrt(tokens[i - 1] * tokens[i]));
    if (j + 1 < choice.size()) b.max_tokens = std::round(std::sqrt(tokens[j] * tokens[j + 1]));
    if (b.max_tokens && *b.max_tokens <= b.min_tokens) b.max_tokens = b.min_tokens + 1;
    b.strategy = ChosenStrategy(e, opt);
    b.splits = ChosenSplits(e, opt);
    b.streams = StreamsFor(b.strategy);
    if (e.cand.strategy == b.strategy) b.segments = e.cand.partition.segments;
    b.predicted_speedup = e.speedup;
    b.baseline_step_us = baseline_us * grid.evals[rep].front().makespan_us / seq_observed;
    b.predicted_step_us = b.baseline_step_us / e.speedup;
    b.extra_memory_bytes = e.cand.extra_memory_bytes;
    for (PlanRule& r : RulesFor(e.cand)) {
      b.rules.push_back(r.name);
      if (std::none_of(plan->partition_rules.begin(), plan->partition_rules.end(),
                       [&r](const PlanRule& x) { return x.name == r.name; })) {
        plan->partition_rules.push_back(std::move(r));
      }
    }
    plan->buckets.push_back(std::move(b));
    i = j + 1;
  }
  return observed_bucket;
}

// The known phases of `steps` other than `observed`, in order of first
// appearance; none when the observed step's phase is unknown.
std::vector<StepPhase> OtherPhases(const DeviceSteps& steps, StepPhase observed) {
  std::vector<StepPhase> out;
  if (observed == StepPhase::kUnknown) return out;
  for (const Step& s : steps.steps) {
    if (s.phase != StepPhase::kUnknown && s.phase != observed &&
        std::find(out.begin(), out.end(), s.phase) == out.end()) {
      out.push_back(s.phase);
    }
  }
  return out;
}

// The mean duration of the steps of `phase`; 0 when there are none.
double PhaseMeanUs(const DeviceSteps& steps, StepPhase phase) {
  double sum = 0;
  size_t n = 0;
  for (const Step& s : steps.steps) {
    if (s.phase != phase) continue;
    sum += s.duration_us();
    ++n;
  }
  return n == 0 ? 0 : sum / static_cast<double>(n);
}

// Appends the buckets of `phase`, simulated on a step of that phase, with
// their bound checks. A phase whose step has no graph or whose replay does
// not finish gets no buckets (its calls take the buckets without a phase),
// and out->unplanned_phases says why.
void AppendPhaseTiling(const Trace& trace, const OperatorLinks& links, const DeviceResources& dr,
                       const DeviceSteps& steps, StepPhase phase, const AdviseOptions& opt,
                       CostCache* costs, AdviceResult* out, Plan* plan) {
  const StepGraph graph =
      BuildStepGraph(trace, links, dr, steps, RepresentativeStep(steps.steps, phase), costs, opt.graph);
  const std::string name = PhaseName(phase);
  if (graph.tasks.empty()) {
    out->unplanned_phases.push_back(name + ": its step has no GPU work to simulate");
    return;
  }
  const std::optional<SplitRegion> region = FindSplitRegion(trace, graph);
  const CandidateContext ctx = ContextFor(trace, graph, region, dr, opt);
  Grid grid;
  std::string unfinished;
  if (!EvaluateGrid(ctx, opt, &grid, &unfinished)) {
    out->unplanned_phases.push_back(name + ": " + unfinished);
    return;
  }
  const double baseline = PhaseMeanUs(steps, phase);
  const double seq_observed = grid.evals[grid.observed].front().makespan_us;
  for (BoundCheck c : BoundChecks(grid.evals, grid.tokens, baseline / seq_observed)) {
    c.phase = name;
    out->bound_checks.push_back(c);
  }
  AppendTiling(grid, Choices(grid, opt), baseline, name, opt, plan);
}

// The structure fingerprint `dynaflow trace` recorded for the root module
// that the plan's units (split or side-stream) start with ("LlamaForCausalLM" of
// "LlamaForCausalLM.model.layers.*"); empty when the trace has none, or when
// its processes recorded different ones (merged metadata joins them by ';').
std::string ModuleFingerprintOf(const Trace& trace, const Plan& plan) {
  for (const PlanRule& rule : plan.partition_rules) {
    if ((rule.role != "split" && rule.role != "side_stream") || rule.modules.empty()) continue;
    const std::string& unit = rule.modules.front();
    const auto it = trace.metadata.find("module_fingerprint." + unit.substr(0, unit.find('.')));
    if (it == trace.metadata.end()) return "";
    const std::string_view all = it->second;
    const std::string_view first = all.substr(0, all.find(';'));
    for (size_t at = 0; at <= all.size();) {
      const size_t end = std::min(all.find(';', at), all.size());
      if (all.substr(at, end - at) != first) return "";
      at = end + 1;
    }
    return std::string(first);
  }
  return "";
}

AdviceResult AdviseSteps(const Trace& trace, const std::vector<std::string>& inputs,
                         const AdviseOptions& opt) {
  AdviceResult out;
  const OperatorLinks links = LinkOperators(trace);
  std::vector<DeviceResources> resources = ClassifyResources(trace, links, opt.bound);
  std::vector<DeviceSteps> steps;
  CostCache step_costs(trace, &links);  // for each step's phase and tokens
  for (const DeviceResources& dr : resources) {
    steps.push_back(FindSteps(trace, dr));
    InferWorkloads(trace, links, dr, &step_costs, &steps.back());
    DeviceAdvice d;
    d.device_index = dr.device_index;
    d.rank = trace.devices[dr.device_index].rank;
    d.device = trace.devices[dr.device_index].device;
    d.peaks = dr.peaks;
    std::copy(std::begin(dr.totals), std::end(dr.totals), std::begin(d.totals));
    d.operators = dr.operators;
    d.linked_kernels = dr.linked_kernels;
    d.costed_kernels = dr.costed_kernels;
    const DeviceSteps& s = steps.back();
    d.step_source = s.source;
    d.steps = s.steps;
    d.representative = s.representative;
    d.step_mean_us = s.mean_us;
    d.step_median_us = s.median_us;
    d.step_min_us = s.min_us;
    d.step_max_us = s.max_us;
    d.step_stdev_us = s.stdev_us;
    d.step_cv_pct = s.cv_pct;
    d.step_layers = s.layers;
    d.windows = FindIdleWindows(trace, links, dr, s, opt.windows);
    out.devices.push_back(std::move(d));
  }

  // The plan's source.
  Plan& plan = out.plan;
  plan.traces = inputs;
  {
    Fnv f;
    f.Int(static_cast<int64_t>(trace.gpu.size()));
    f.Int(static_cast<int64_t>(trace.ops.size()));
    f.Int(trace.gpu.empty() ? 0 : trace.gpu.front().start);
    f.Int(trace.gpu.empty() ? 0 : trace.gpu.back().end);
    for (const DeviceInfo& d : trace.devices) f.Str(d.name);
    plan.trace_fingerprint = f.Hex();
  }
  plan.forced = opt.force.has_value();
  plan.strategy = opt.force.value_or(Strategy::kSequential);
  plan.splits = 1;
  PlanBucket only;
  only.strategy = plan.strategy;
  only.streams = StreamsFor(plan.strategy);
  plan.buckets = {only};
  plan.model_fingerprint = Fnv().Hex();
  if (opt.force) ForceWithoutGraph(trace, opt, plan);

  // The critical device: the longest mean step.
  size_t crit = resources.size();
  for (size_t i = 0; i < resources.size(); ++i) {
    if (out.devices[i].steps.empty()) continue;
    if (crit == resources.size() || out.devices[i].step_mean_us > out.devices[crit].step_mean_us) crit = i;
  }
  if (crit == resources.size()) return out;
  const DeviceResources& dr = resources[crit];
  const DeviceAdvice& dev = out.devices[crit];
  out.critical_device = dr.device_index;
  plan.device_name = trace.devices[dr.device_index].name;
  plan.rank = std::max(0, dev.rank);
  plan.device = std::max(0, dev.device);
  plan.sm_count = dr.peaks.sm_count;
  plan.memory_bandwidth_gbps = dr.peaks.bytes_per_s / 1e9;
  plan.peak_tflops_bf16 = dr.peaks.flops_half / 1e12;
  plan.peaks_known = dr.peaks.known;

  // With steps of several phases, each phase is simulated on its own median
  // step and measured against its own steps' mean; the observed phase is the
  // representative step's.
  const StepPhase observed_phase =
      steps[crit].steps.empty() ? StepPhase::kUnknown : steps[crit].steps[steps[crit].representative].phase;
  const std::vector<StepPhase> other_phases = OtherPhases(steps[crit], observed_phase);
  const size_t representative = other_phases.empty() ? steps[crit].representative
                                                      : RepresentativeStep(steps[crit].steps, observed_phase);
  CostCache costs(trace, &links);
  const StepGraph graph = BuildStepGraph(trace, links, dr, steps[crit], representative, &costs, opt.graph);
  if (graph.tasks.empty()) return out;
  out.has_graph = true;
  plan.tokens_per_step = graph.tokens;
  out.phase = graph.phase;
  out.tokens_source = graph.tokens_source;
  if (graph.phase != StepPhase::kUnknown) plan.phase = PhaseName(graph.phase);
  plan.kernels_per_step = static_cast<int64_t>(graph.tasks.size());
  {
    Fnv f;
    StringId last = 0;
    for (const SimTask& t : graph.tasks) {
      const StringId id = t.op != 0 ? t.op : t.kernel;
      if (id != last) f.Str(trace.strings.Get(id));
      last = id;
      if (t.weight_bytes > 0) f.Int(static_cast<int64_t>(t.weight_bytes));
    }
    plan.model_fingerprint = f.Hex();
  }

  const std::optional<SplitRegion> region = FindSplitRegion(trace, graph);
  const CandidateContext ctx = ContextFor(trace, graph, region, dr, opt);

  Grid grid;
  if (!EvaluateGrid(ctx, opt, &grid, &out.replay_unfinished)) return out;
  const double seq_observed = grid.evals[grid.observed].front().makespan_us;
  out.replay_error_pct = graph.measured_us > 0 ? 100.0 * (seq_observed - graph.measured_us) / graph.measured_us : 0;
  out.replay_error_without_gaps_pct = ReplayErrorWithoutGaps(ctx, graph);
  const double baseline = other_phases.empty() ? dev.step_mean_us : PhaseMeanUs(steps[crit], observed_phase);
  out.bound_checks = BoundChecks(grid.evals, grid.tokens, baseline / seq_observed);

  plan.buckets.clear();
  plan.partition_rules.clear();
  const std::vector<const Eval*> choice = Choices(grid, opt);
  // The observed phase's buckets carry no phase: they are for every call no
  // other phase's buckets are for (model.phase names what they simulated),
  // so a call whose phase `apply` cannot tell still has a tiling.
  const size_t observed_bucket = AppendTiling(grid, choice, baseline, "", opt, &plan);
  for (StepPhase phase : other_phases) {
    AppendPhaseTiling(trace, links, dr, steps[crit], phase, opt, &costs, &out, &plan);
  }
  const std::vector<std::vector<Eval>>& evals = grid.evals;
  const size_t observed = grid.observed;
  const Eval& chosen = *choice[observed];
  plan.strategy = ChosenStrategy(chosen, opt);
  plan.splits = ChosenSplits(chosen, opt);
  plan.baseline_step_us = baseline;
  plan.predicted_speedup = chosen.speedup;
  plan.predicted_step_us = baseline / chosen.speedup;
  plan.extra_memory_bytes = chosen.cand.extra_memory_bytes;

  RecoverableFromSimulation(evals[observed], baseline, &out.devices[crit].windows);

  // Recommendations at the observed workload: one per strategy, best first.
  WorkloadBucket wb;
  wb.min_tokens = plan.buckets[observed_bucket].min_tokens;
  wb.max_tokens = plan.buckets[observed_bucket].max_tokens;
  wb.tokens = graph.tokens;
  std::vector<const Eval*> recs;
  for (int s = 0; s < kStrategyCount; ++s) {
    const Eval* e = BestOf(evals[observed], static_cast<Strategy>(s));
    if (e != nullptr) recs.push_back(e);
  }
  // Best first: the strategies that gain at least min_gain, then sequential,
  // then those that gain too little or slow the step.
  auto tier = [&opt](const Eval* e) {
    if (e->cand.strategy == Strategy::kSequential) return 1;
    return e->speedup >= 1.0 + opt.min_gain ? 0 : 2;
  };
  std::stable_sort(recs.begin(), recs.end(), [&tier](const Eval* a, const Eval* b) {
    if (tier(a) != tier(b)) return tier(a) < tier(b);
    return a->speedup > b->speedup;
  });
  for (const Eval* e : recs) {
    Recommendation r;
    r.strategy = e->cand.strategy;
    r.splits = e->cand.splits;
    r.predicted_speedup = e->speedup;
    r.baseline_step_us = baseline;
    r.predicted_step_us = baseline / e->speedup;
    r.extra_memory_bytes = e->cand.extra_memory_bytes;
    r.bucket = wb;
    r.partition = e->cand.partition;
    r.rationale = Rationale(*e, dev, evals[observed], opt, baseline);
    r.rank = dev.rank;
    r.device = dev.device;
    out.recommendations.push_back(std::move(r));
  }

  // Pictures of the representative step: measured, and under the plan.
  constexpr size_t kMaxBars = 8000;
  {
    StepPicture& m = out.measured;
    m.title = "measured step (rank " + std::to_string(dev.rank) + ", device " +
              std::to_string(dev.device) + ")";
    for (int32_t s : graph.lane_streams) m.lanes.push_back("stream " + std::to_string(s));
    for (const SimTask& t : graph.tasks) {
      if (m.bars.size() >= kMaxBars) break;
      m.bars.push_back({t.start_us, t.start_us + t.dur_us, t.lane, t.resource, t.op != 0 ? t.op : t.kernel});
    }
    for (const KindInterval& k : dev.windows.representative) {
      m.windows.push_back({k.kind, k.start - graph.start, k.end - graph.start});
    }
    m.span_us = graph.measured_us;
  }
  out.predicted = Picture(trace, graph, chosen.cand.schedule, chosen.result,
                          std::string("predicted under ") + StrategyName(chosen.cand.strategy) +
                              (chosen.cand.splits > 1 ? " x" + std::to_string(chosen.cand.splits) : ""),
                          kMaxBars);
  // The simulated span of the measured schedule maps to the measured step.
  const double scale_to_measured = seq_observed > 0 ? graph.measured_us / seq_observed : 1.0;
  for (PictureBar& b : out.predicted.bars) {
    b.start_us *= scale_to_measured;
    b.end_us *= scale_to_measured;
  }
  out.predicted.span_us *= scale_to_measured;
  return out;
}

}  // namespace

AdviceResult Advise(const Trace& trace, const std::vector<std::string>& inputs,
                    const AdviseOptions& opt) {
  AdviceResult out = AdviseSteps(trace, inputs, opt);
  out.plan.module_fingerprint = ModuleFingerprintOf(trace, out.plan);
  return out;
}

}  // namespace dynaflow
