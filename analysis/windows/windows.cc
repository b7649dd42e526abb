#include "analysis/windows/windows.h"

#include <algorithm>
#include <limits>
#include <unordered_map>
#include <vector>

namespace dynaflow {
namespace {

constexpr int kNoKind = -1;

using NameTimes = std::vector<std::pair<StringId, TimeNs>>;

void AddTime(NameTimes* v, StringId name, TimeNs t) {
  for (auto& p : *v) {
    if (p.first == name) {
      p.second += t;
      return;
    }
  }
  v->emplace_back(name, t);
}

// The class of activity that a window of `kind` is about.
bool Relevant(int kind, Resource r) {
  switch (static_cast<WindowKind>(kind)) {
    case WindowKind::kCommExposed: return r == Resource::kCommunication;
    case WindowKind::kCopyExposed: return r == Resource::kCopy;
    case WindowKind::kMemoryBound: return r == Resource::kMemory || r == Resource::kLatency;
    case WindowKind::kComputeBound: return r == Resource::kCompute;
    case WindowKind::kLaunchBound: return r == Resource::kLatency;
    case WindowKind::kGpuIdle: return false;
  }
  return false;
}

int KindOf(const int (&n)[kResourceCount]) {
  const int c = n[static_cast<int>(Resource::kCompute)];
  const int m = n[static_cast<int>(Resource::kMemory)];
  const int x = n[static_cast<int>(Resource::kCommunication)];
  const int y = n[static_cast<int>(Resource::kCopy)];
  const int l = n[static_cast<int>(Resource::kLatency)];
  if (c + m + x + y + l == 0) return static_cast<int>(WindowKind::kGpuIdle);
  if (c == 0 && m == 0 && l == 0) {
    if (x > 0) return static_cast<int>(WindowKind::kCommExposed);
    return static_cast<int>(WindowKind::kCopyExposed);
  }
  if (c == 0 && m > 0) return static_cast<int>(WindowKind::kMemoryBound);
  if (c > 0 && m == 0 && x == 0) return static_cast<int>(WindowKind::kComputeBound);
  if (c == 0 && l > 0) return static_cast<int>(WindowKind::kLaunchBound);
  return kNoKind;  // compute with memory or communication: both sides busy
}

std::string Label(WindowKind k, std::string_view op, IdleCause cause) {
  std::string o(op.size() > 80 ? op.substr(0, 77) : op);
  if (op.size() > 80) o += "...";
  switch (k) {
    case WindowKind::kCommExposed:
      return cause == IdleCause::kPeer ? "SMs idle while " + o + " waits for another rank"
                                       : "SMs idle while " + o + " communicates";
    case WindowKind::kCopyExposed: return "SMs idle under the copy " + o;
    case WindowKind::kMemoryBound: return "tensor cores idle under memory-bound " + o;
    case WindowKind::kComputeBound: return "HBM bandwidth idle under compute-bound " + o;
    case WindowKind::kLaunchBound: return "SMs idle between short launches of " + o;
    case WindowKind::kGpuIdle:
      switch (cause) {
        case IdleCause::kHost: return "GPU idle waiting on the host to launch " + o;
        case IdleCause::kDependency:
          return "GPU idle: " + o + " was launched and waits on a dependency (an event, another stream)";
        case IdleCause::kPeer: return "GPU idle: " + o + " waits for another rank";
        case IdleCause::kUnknown:
        case IdleCause::kNone: break;
      }
      return "GPU idle before " + o + " (no launch call in the trace: host or dependency)";
  }
  return o;
}

// For each activity of the device (DeviceResources::order), the time until
// which it waits for another rank: a collective cannot progress before every
// rank has started it, so its first part, until the latest start of the same
// collective on the other ranks' devices in the trace, is waiting. The k-th
// communication kernel of a name on one rank is the k-th of that name on
// every other. 0 where no other rank is in the trace or nothing matches.
std::vector<TimeNs> PeerWaitEnds(const Trace& trace, const DeviceResources& dev) {
  std::vector<TimeNs> out(dev.order.size(), 0);
  const int32_t rank = trace.devices[dev.device_index].rank;
  // (name, ordinal) -> latest start on the other ranks.
  std::unordered_map<StringId, std::vector<TimeNs>> latest;
  std::unordered_map<uint64_t, std::unordered_map<StringId, size_t>> seen;  // per other device
  std::vector<uint32_t> others;
  for (uint32_t i = 0; i < trace.gpu.size(); ++i) {
    const GpuActivity& g = trace.gpu[i];
    if (g.device_index >= trace.devices.size() || trace.devices[g.device_index].rank == rank) continue;
    if (g.kind != GpuKind::kKernel || !ContainsAny(trace.strings.Get(g.name), {"nccl", "rccl"})) continue;
    others.push_back(i);
  }
  if (others.empty()) return out;
  std::sort(others.begin(), others.end(),
            [&trace](uint32_t a, uint32_t b) { return trace.gpu[a].start < trace.gpu[b].start; });
  for (uint32_t i : others) {
    const GpuActivity& g = trace.gpu[i];
    const size_t ordinal = seen[g.device_index][g.name]++;
    std::vector<TimeNs>& v = latest[g.name];
    if (v.size() <= ordinal) v.resize(ordinal + 1, 0);
    v[ordinal] = std::max(v[ordinal], g.start);
  }
  std::unordered_map<StringId, size_t> own;
  for (size_t k = 0; k < dev.order.size(); ++k) {
    if (dev.resource[k] != Resource::kCommunication) continue;
    const GpuActivity& g = trace.gpu[dev.order[k]];
    const size_t ordinal = own[g.name]++;
    auto it = latest.find(g.name);
    if (it == latest.end() || ordinal >= it->second.size()) continue;
    out[k] = std::min(it->second[ordinal], g.end);
  }
  return out;
}

}  // namespace

const char* IdleCauseName(IdleCause c) {
  switch (c) {
    case IdleCause::kNone: return "";
    case IdleCause::kHost: return "host";
    case IdleCause::kDependency: return "dependency";
    case IdleCause::kPeer: return "peer";
    case IdleCause::kUnknown: return "unknown";
  }
  return "";
}

const char* WindowKindName(WindowKind k) {
  switch (k) {
    case WindowKind::kCommExposed: return "communication_exposed";
    case WindowKind::kCopyExposed: return "copy_exposed";
    case WindowKind::kMemoryBound: return "memory_bound";
    case WindowKind::kComputeBound: return "compute_bound";
    case WindowKind::kLaunchBound: return "launch_bound";
    case WindowKind::kGpuIdle: return "gpu_idle";
  }
  return "gpu_idle";
}

const char* WindowSaturated(WindowKind k) {
  switch (k) {
    case WindowKind::kCommExposed: return "communication";
    case WindowKind::kCopyExposed: return "copy";
    case WindowKind::kMemoryBound: return "memory";
    case WindowKind::kComputeBound: return "compute";
    case WindowKind::kLaunchBound: return "launch";
    case WindowKind::kGpuIdle: return "host";
  }
  return "host";
}

const char* WindowIdle(WindowKind k) {
  switch (k) {
    case WindowKind::kCommExposed:
    case WindowKind::kCopyExposed:
    case WindowKind::kLaunchBound: return "sm";
    case WindowKind::kMemoryBound: return "tensor_cores";
    case WindowKind::kComputeBound: return "memory_bandwidth";
    case WindowKind::kGpuIdle: return "gpu";
  }
  return "gpu";
}

DeviceWindows FindIdleWindows(const Trace& trace, const OperatorLinks& links,
                              const DeviceResources& dev, const DeviceSteps& steps,
                              const WindowOptions& options) {
  DeviceWindows out;
  if (steps.steps.empty() || dev.order.empty()) return out;
  const size_t n = dev.order.size();

  auto name_of = [&](size_t k) -> StringId {
    const uint32_t i = dev.order[k];
    const StringId op = DisplayOperator(trace, links, i);
    return op != 0 ? op : trace.gpu[i].name;
  };
  auto module_of = [&](size_t k) -> StringId {
    const int32_t op = links.activity_op[dev.order[k]];
    if (op < 0) return 0;
    const Operator& o = trace.ops[static_cast<size_t>(op)];
    if (o.module_path != 0) return o.module_path;
    const int32_t top = links.op_top[static_cast<size_t>(op)];
    return top != op ? trace.ops[static_cast<size_t>(top)].name : 0;
  };

  struct Group {
    WindowKind kind = WindowKind::kGpuIdle;
    IdleCause cause = IdleCause::kNone;
    StringId primary = 0;
    int64_t occurrences = 0;
    TimeNs total = 0;
    NameTimes operators;
    NameTimes modules;
    std::vector<KindInterval> examples;
  };
  std::vector<Group> groups;
  std::unordered_map<uint64_t, size_t> group_index;
  TimeNs kind_total[kWindowKindCount] = {};

  // The interval being built.
  int cur_kind = kNoKind;
  int32_t cur_step = -1;
  TimeNs cur_start = 0, cur_end = 0;
  NameTimes cur_names, cur_modules;
  IdleCause cur_cause = IdleCause::kNone;

  // Launch calls of the device's activities (rank's calls by correlation), to
  // tell why the GPU idled before one.
  const int32_t rank = trace.devices[dev.device_index].rank;
  std::unordered_map<int64_t, std::vector<TimeNs>> launches;
  for (uint32_t i : dev.order) {
    if (trace.gpu[i].correlation >= 0) launches.try_emplace(trace.gpu[i].correlation);
  }
  for (const ApiCall& c : trace.api) {
    if (c.rank != rank || c.correlation < 0 || c.kind == ApiKind::kSync) continue;
    auto it = launches.find(c.correlation);
    if (it != launches.end()) it->second.push_back(c.start);
  }
  // Why the GPU idles from `from` until activity k starts: the host had not
  // launched it yet (its launch call started after the GPU went idle, less
  // the launch latency), or it was launched and waited on something on the
  // GPU side. Correlation ids repeat across processes: the launch is the
  // latest call with the id before the activity starts.
  auto cause_of = [&](size_t k, TimeNs from) {
    const GpuActivity& a = trace.gpu[dev.order[k]];
    auto it = launches.find(a.correlation);
    TimeNs launch = -1;
    if (it != launches.end()) {
      for (TimeNs s : it->second) {
        if (s <= a.start && s > launch) launch = s;
      }
    }
    if (launch < 0) return IdleCause::kUnknown;
    return launch + options.launch_latency_ns >= from ? IdleCause::kHost : IdleCause::kDependency;
  };

  auto close = [&]() {
    if (cur_kind == kNoKind || cur_end <= cur_start) {
      cur_kind = kNoKind;
      return;
    }
    StringId primary = 0;
    TimeNs best = -1;
    for (const auto& [name, t] : cur_names) {
      if (t > best) {
        best = t;
        primary = name;
      }
    }
    const uint64_t key = (static_cast<uint64_t>(cur_kind) << 32) |
                         (static_cast<uint64_t>(cur_cause) << 28) | primary;
    auto [it, fresh] = group_index.try_emplace(key, groups.size());
    if (fresh) {
      groups.emplace_back();
      groups.back().kind = static_cast<WindowKind>(cur_kind);
      groups.back().cause = cur_cause;
      groups.back().primary = primary;
    }
    Group& g = groups[it->second];
    const TimeNs len = cur_end - cur_start;
    ++g.occurrences;
    g.total += len;
    kind_total[cur_kind] += len;
    for (const auto& [name, t] : cur_names) AddTime(&g.operators, name, t);
    for (const auto& [name, t] : cur_modules) AddTime(&g.modules, name, t);
    if (cur_step == static_cast<int32_t>(steps.representative)) {
      const KindInterval iv{static_cast<WindowKind>(cur_kind), cur_start, cur_end};
      if (g.examples.size() < 3) g.examples.push_back(iv);
      if (out.representative.size() < options.max_representative_intervals) {
        out.representative.push_back(iv);
      }
    }
    cur_kind = kNoKind;
    cur_cause = IdleCause::kNone;
    cur_names.clear();
    cur_modules.clear();
  };

  struct Active {
    TimeNs end;
    uint32_t k;
    Resource r;
    TimeNs peer_until;  // a collective waits for another rank until then
  };
  const std::vector<TimeNs> peer_until = PeerWaitEnds(trace, dev);
  std::vector<Active> active;
  int counts[kResourceCount] = {};
  size_t idx = 0;
  auto skip_outside = [&]() {
    while (idx < n && steps.step_of[idx] < 0) ++idx;
  };
  skip_outside();
  if (idx >= n) return out;
  TimeNs t = trace.gpu[dev.order[idx]].start;
  size_t sp = 0;
  const TimeNs last_end = steps.steps.back().end;
  constexpr TimeNs kInf = std::numeric_limits<TimeNs>::max();

  while (true) {
    // Start everything that starts at t.
    while (idx < n && trace.gpu[dev.order[idx]].start <= t) {
      const GpuActivity& g = trace.gpu[dev.order[idx]];
      if (g.end > t) {
        active.push_back({g.end, static_cast<uint32_t>(idx), dev.resource[idx], peer_until[idx]});
        ++counts[static_cast<int>(dev.resource[idx])];
      }
      ++idx;
      skip_outside();
    }
    TimeNs next = idx < n ? trace.gpu[dev.order[idx]].start : kInf;
    for (const Active& a : active) {
      next = std::min(next, a.end);
      if (a.peer_until > t) next = std::min(next, a.peer_until);
    }
    if (next == kInf || t >= last_end) break;
    next = std::min(next, last_end);

    // The segment [t, next).
    while (sp + 1 < steps.steps.size() && steps.steps[sp].end <= t) ++sp;
    const int kind = KindOf(counts);
    const int32_t step = t >= steps.steps[sp].start ? static_cast<int32_t>(sp) : -1;
    if (kind == kNoKind || step < 0) {
      close();
    } else {
      IdleCause cause = IdleCause::kNone;
      if (kind == static_cast<int>(WindowKind::kGpuIdle)) {
        cause = idx < n ? cause_of(idx, t) : IdleCause::kUnknown;
      } else if (kind == static_cast<int>(WindowKind::kCommExposed)) {
        // Every running collective still waits for another rank to arrive.
        bool all_wait = false;
        for (const Active& a : active) {
          if (a.r != Resource::kCommunication) continue;
          all_wait = a.peer_until > t;
          if (!all_wait) break;
        }
        if (all_wait) cause = IdleCause::kPeer;
      }
      if (kind != cur_kind || step != cur_step || cur_end != t || cause != cur_cause) {
        close();
        cur_kind = kind;
        cur_cause = cause;
        cur_step = step;
        cur_start = t;
      }
      cur_end = next;
      const TimeNs len = next - t;
      if (kind == static_cast<int>(WindowKind::kGpuIdle)) {
        if (idx < n) {
          AddTime(&cur_names, name_of(idx), len);
          const StringId m = module_of(idx);
          if (m != 0) AddTime(&cur_modules, m, len);
        }
      } else {
        for (const Active& a : active) {
          if (!Relevant(kind, a.r)) continue;
          AddTime(&cur_names, name_of(a.k), len);
          const StringId m = module_of(a.k);
          if (m != 0) AddTime(&cur_modules, m, len);
        }
      }
    }
    // Advance and retire what ended.
    t = next;
    for (size_t j = 0; j < active.size();) {
      if (active[j].end <= t) {
        --counts[static_cast<int>(active[j].r)];
        active[j] = active.back();
        active.pop_back();
      } else {
        ++j;
      }
    }
  }
  close();

  const double n_steps = static_cast<double>(steps.steps.size());
  for (int k = 0; k < kWindowKindCount; ++k) {
    out.per_step_us[k] = static_cast<double>(kind_total[k]) / 1000.0 / n_steps;
  }
  const double mem = out.per_step_us[static_cast<int>(WindowKind::kMemoryBound)];
  const double comp = out.per_step_us[static_cast<int>(WindowKind::kComputeBound)];
  for (Group& g : groups) {
    IdleWindow w;
    w.kind = g.kind;
    w.cause = g.cause;
    w.label = Label(g.kind, trace.strings.Get(g.primary), g.cause);
    w.occurrences = g.occurrences;
    w.total_us = static_cast<double>(g.total) / 1000.0;
    w.per_step_us = w.total_us / n_steps;
    w.share_of_step_pct = steps.mean_us > 0 ? 100.0 * w.per_step_us / steps.mean_us : 0;
    switch (g.kind) {
      case WindowKind::kCommExposed:
      case WindowKind::kCopyExposed:
      case WindowKind::kGpuIdle: w.recoverable_us = w.per_step_us; break;
      case WindowKind::kLaunchBound: w.recoverable_us = 0.5 * w.per_step_us; break;
      case WindowKind::kMemoryBound:
        w.recoverable_us = mem > 0 ? 0.5 * w.per_step_us * std::min(1.0, comp / mem) : 0;
        break;
      case WindowKind::kComputeBound:
        w.recoverable_us = comp > 0 ? 0.5 * w.per_step_us * std::min(1.0, mem / comp) : 0;
        break;
    }
    auto top = [&](NameTimes& v, std::vector<std::pair<std::string, double>>* dst) {
      std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
      for (size_t i = 0; i < v.size() && i < 3; ++i) {
        dst->emplace_back(std::string(trace.strings.Get(v[i].first)),
                          static_cast<double>(v[i].second) / 1000.0 / n_steps);
      }
    };
    top(g.operators, &w.operators);
    top(g.modules, &w.modules);
    w.examples = std::move(g.examples);
    out.windows.push_back(std::move(w));
  }
  std::sort(out.windows.begin(), out.windows.end(), [](const IdleWindow& a, const IdleWindow& b) {
    return a.recoverable_us != b.recoverable_us ? a.recoverable_us > b.recoverable_us
                                                : a.per_step_us > b.per_step_us;
  });
  if (out.windows.size() > options.max_windows) out.windows.resize(options.max_windows);
  return out;
}

}  // namespace dynaflow
