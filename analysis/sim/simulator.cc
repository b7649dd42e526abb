#include "analysis/sim/simulator.h"

#include <algorithm>
#include <limits>
#include <string>

#include "analysis/sim/physical_bound.h"

namespace dynaflow {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// How many running nodes of each class.
struct ClassCounts {
  int n[kResourceCount] = {};
  int operator[](Resource r) const { return n[static_cast<int>(r)]; }
};

ClassCounts CountClasses(const std::vector<int32_t>& running, const std::vector<SimNode>& nodes) {
  ClassCounts c;
  for (int32_t i : running) ++c.n[static_cast<int>(nodes[static_cast<size_t>(i)].resource)];
  return c;
}

// The SM fraction node `x` needs at full speed: its footprint, else its
// class's default (model.h, a).
double SmNeedOf(const SimNode& x, const SimParams& p) {
  if (x.sm > 0) return x.sm;
  switch (x.resource) {
    case Resource::kCompute: return 1.0;
    case Resource::kLatency: return p.sm_latency;
    case Resource::kCommunication: return p.sm_comm;
    case Resource::kMemory: return p.sm_memory;
    case Resource::kCopy: return 0.0;
  }
  return 1.0;
}

// a. SMs, every running SM user's footprint known: each claims what its
// grid occupies, in the order they started, as the block scheduler dispatches
// an earlier kernel's blocks first. A grid of a wave or more holds the device
// until its tail, and a kernel started beside it waits (their tails, where
// they overlap, are not modelled). A compute or latency node runs at
// granted / footprint, a memory node at granted / min(footprint, sm_memory),
// and the memory nodes' speeds sum to at most 1 (one HBM).
// Measured on an H200 (scripts/device/overlap_micro.py, docs/performance.md):
// an 8192^3 GEMM beside a 2 GiB streaming add, each one grid of many waves,
// gained 1.1% over back to back; two such adds lost 0.8%.
void ClaimSmsInStartOrder(const std::vector<int32_t>& running, const std::vector<SimNode>& nodes,
                          const SimParams& p, std::vector<double>* speed) {
  double free = 1.0, memory_speed = 0;
  for (size_t k = 0; k < running.size(); ++k) {
    const SimNode& x = nodes[static_cast<size_t>(running[k])];
    if (x.resource == Resource::kCopy) continue;
    const double granted = std::min(x.sm, free);
    free -= granted;
    const double need = x.resource == Resource::kMemory ? std::min(x.sm, p.sm_memory) : x.sm;
    (*speed)[k] = std::min(1.0, granted / need);
    if (x.resource == Resource::kMemory) memory_speed += (*speed)[k];
  }
  if (memory_speed <= 1.0) return;
  for (size_t k = 0; k < running.size(); ++k) {
    if (nodes[static_cast<size_t>(running[k])].resource == Resource::kMemory) (*speed)[k] /= memory_speed;
  }
}

bool FootprintsKnown(const std::vector<int32_t>& running, const std::vector<SimNode>& nodes) {
  return std::all_of(running.begin(), running.end(), [&nodes](int32_t i) {
    const SimNode& x = nodes[static_cast<size_t>(i)];
    return x.resource == Resource::kCopy || x.sm > 0;
  });
}

// a. SMs, some footprint unknown: when the running nodes need no more than
// the device, no SM slowdown; otherwise the non-compute classes' needs first (scaled down
// together if they ask for more than is left beside compute), compute nodes
// split the rest equally, each at min(1, share / need). Memory nodes are one
// class on one HBM: together they need at most sm_memory and share it, so
// their speeds sum to at most 1.
void ShareSms(const std::vector<int32_t>& running, const std::vector<SimNode>& nodes,
              const ClassCounts& n, const SimParams& p, std::vector<double>* speed) {
  double memory_need = 0, other_need = 0, compute_need = 0;
  for (int32_t i : running) {
    const SimNode& x = nodes[static_cast<size_t>(i)];
    const double need = SmNeedOf(x, p);
    switch (x.resource) {
      case Resource::kCompute: compute_need += need; break;
      case Resource::kMemory: memory_need += need; break;
      case Resource::kLatency:
      case Resource::kCommunication: other_need += need; break;
      case Resource::kCopy: break;
    }
  }
  other_need += std::min(memory_need, p.sm_memory);
  const bool fits = compute_need + other_need <= 1.0;
  const double cap = n[Resource::kCompute] > 0 ? 1.0 - p.sm_compute_min : 1.0;
  const double other_scale = fits || other_need <= cap ? 1.0 : cap / other_need;
  const double compute_share =
      n[Resource::kCompute] > 0 ? (1.0 - other_need * other_scale) / n[Resource::kCompute] : 0.0;
  for (size_t k = 0; k < running.size(); ++k) {
    const SimNode& x = nodes[static_cast<size_t>(running[k])];
    switch (x.resource) {
      case Resource::kCompute:
        (*speed)[k] = fits ? 1.0 : std::min(1.0, compute_share / SmNeedOf(x, p));
        break;
      case Resource::kMemory: (*speed)[k] = other_scale / n[Resource::kMemory]; break;
      case Resource::kLatency:
      case Resource::kCommunication: (*speed)[k] = other_scale; break;
      case Resource::kCopy: break;
    }
  }
}

// b. HBM: if the bandwidth users ask for more than the whole, all slow by the
// excess.
void ShareHbm(const std::vector<int32_t>& running, const std::vector<SimNode>& nodes,
              std::vector<double>* speed) {
  double hbm = 0;
  for (size_t k = 0; k < running.size(); ++k) hbm += (*speed)[k] * nodes[static_cast<size_t>(running[k])].hbm;
  if (hbm <= 1.0) return;
  for (size_t k = 0; k < running.size(); ++k) {
    if (nodes[static_cast<size_t>(running[k])].hbm > 0) (*speed)[k] /= hbm;
  }
}

// Speeds of the running nodes (model.h, "Sharing"): every class's speeds sum
// to at most its capacity (physical_bound.h).
void Speeds(const std::vector<int32_t>& running, const std::vector<SimNode>& nodes,
            const SimParams& p, std::vector<double>* speed) {
  speed->assign(running.size(), 1.0);
  if (running.size() <= 1) return;
  const ClassCounts n = CountClasses(running, nodes);
  if (FootprintsKnown(running, nodes)) {
    ClaimSmsInStartOrder(running, nodes, p, speed);
  } else {
    ShareSms(running, nodes, n, p, speed);
  }
  ShareHbm(running, nodes, speed);
  // c. Link and copy engines; d. interference.
  const double interference = 1.0 / (1.0 + p.interference * static_cast<double>(running.size() - 1));
  for (size_t k = 0; k < running.size(); ++k) {
    const Resource r = nodes[static_cast<size_t>(running[k])].resource;
    if (r == Resource::kCommunication && n[r] > 1) (*speed)[k] /= n[r];
    if (r == Resource::kCopy && n[r] > kCopyEngines) (*speed)[k] *= kCopyEngines / n[r];
    (*speed)[k] *= interference;
  }
}

std::string NodeName(const Schedule& s, size_t i) {
  return "node " + std::to_string(i) + " (task " + std::to_string(s.nodes[i].task) + ")";
}

// Why the replay stopped with nodes left: the host blocked on a node that
// cannot finish (not issued, or waiting on unissued work), or, with the host
// done, nodes whose dependencies never finish (a cycle).
std::string DescribeStall(const Schedule& s, size_t host_pos, const std::vector<char>& issued,
                          const std::vector<char>& finished, size_t done) {
  const size_t n = s.nodes.size();
  std::string why = std::to_string(n - done) + " of " + std::to_string(n) + " nodes never ran: ";
  if (host_pos < s.host_order.size()) {
    const size_t h = static_cast<size_t>(s.host_order[host_pos]);
    const int32_t w = s.nodes[h].sync_node;
    why += "the host stopped before issuing " + NodeName(s, h) + " (launch " +
           std::to_string(host_pos + 1) + " of " + std::to_string(s.host_order.size()) + ")";
    if (w >= 0) {
      const size_t u = static_cast<size_t>(w);
      why += ", blocked in a synchronizing call until " + NodeName(s, u) + " finishes, which " +
             (!issued[u] ? std::string("the host issues only later")
                         : std::string("waits on work the host has not issued"));
    } else {
      why += ", blocked in a synchronizing call until all issued work finishes";
    }
    return why;
  }
  for (size_t i = 0; i < n; ++i) {
    if (!finished[i]) {
      return why + NodeName(s, i) + " waits on dependencies that never finish (a cycle)";
    }
  }
  return why + "no node can start";
}

}  // namespace

int32_t Schedule::Add(const SimNode& node, const std::vector<int32_t>& node_deps) {
  if (dep_begin.empty()) dep_begin.push_back(0);
  nodes.push_back(node);
  deps.insert(deps.end(), node_deps.begin(), node_deps.end());
  dep_begin.push_back(static_cast<int32_t>(deps.size()));
  return static_cast<int32_t>(nodes.size() - 1);
}

SimResult Simulate(const Schedule& s, const SimParams& params) {
  SimResult out;
  const size_t n = s.nodes.size();
  out.start_us.assign(n, 0);
  out.end_us.assign(n, 0);
  if (n == 0) {
    out.ok = true;
    out.makespan_us = s.tail_us;
    return out;
  }
  // Successors (CSR) and in-degrees.
  std::vector<int32_t> indeg(n, 0), succ_begin(n + 1, 0), succ;
  for (size_t i = 0; i < n; ++i) {
    for (int32_t d = s.dep_begin[i]; d < s.dep_begin[i + 1]; ++d) {
      ++succ_begin[static_cast<size_t>(s.deps[static_cast<size_t>(d)]) + 1];
      ++indeg[i];
    }
  }
  for (size_t i = 0; i < n; ++i) succ_begin[i + 1] += succ_begin[i];
  succ.resize(s.deps.size());
  {
    std::vector<int32_t> fill(succ_begin.begin(), succ_begin.end() - 1);
    for (size_t i = 0; i < n; ++i) {
      for (int32_t d = s.dep_begin[i]; d < s.dep_begin[i + 1]; ++d) {
        succ[static_cast<size_t>(fill[static_cast<size_t>(s.deps[static_cast<size_t>(d)])]++)] =
            static_cast<int32_t>(i);
      }
    }
  }

  std::vector<char> in_host(n, 0), issued(n, 1), finished_flag(n, 0);
  for (int32_t i : s.host_order) {
    in_host[static_cast<size_t>(i)] = 1;
    issued[static_cast<size_t>(i)] = 0;
  }
  std::vector<double> dep_ready(n, -kInf), host_ready(n, -kInf), earliest(n, 0), rem(n, 0);
  std::vector<int32_t> pending, running;
  std::vector<char> group_busy(static_cast<size_t>(std::max(0, s.groups)), 0);
  bool pending_dirty = false;

  auto make_pending = [&](size_t i) {
    const double deps_done = dep_ready[i] == -kInf ? 0.0 : dep_ready[i];
    earliest[i] = std::max(deps_done + s.nodes[i].delay_us, host_ready[i]);
    pending.push_back(static_cast<int32_t>(i));
    pending_dirty = true;
  };

  // The host.
  size_t host_pos = 0;
  size_t host_done = 0;  // issued nodes that finished
  double host_time = 0;
  double host_last_done = -kInf;
  auto advance_host = [&]() {
    while (host_pos < s.host_order.size()) {
      const size_t i = static_cast<size_t>(s.host_order[host_pos]);
      const SimNode& node = s.nodes[i];
      if (node.post_sync_us >= 0 && host_pos > 0) {
        double waited_until;
        if (node.sync_node >= 0) {  // blocked until that node finishes
          const size_t w = static_cast<size_t>(node.sync_node);
          if (!finished_flag[w]) return;
          waited_until = out.end_us[w];
        } else {  // blocked until everything issued before finishes
          if (host_done < host_pos) return;
          waited_until = host_last_done;
        }
        host_time = std::max(host_time + node.host_delta_us, waited_until) + node.post_sync_us;
      } else {
        host_time = host_pos == 0 ? node.host_delta_us : host_time + node.host_delta_us;
      }
      host_ready[i] = host_time + node.launch_latency_us;
      issued[i] = 1;
      ++host_pos;
      if (indeg[i] == 0) make_pending(i);
    }
  };

  for (size_t i = 0; i < n; ++i) {
    rem[i] = s.nodes[i].work_us;
    if (indeg[i] == 0 && !in_host[i]) make_pending(i);
  }
  advance_host();

  double now = kInf;
  for (int32_t i : pending) now = std::min(now, earliest[static_cast<size_t>(i)]);
  if (now == kInf) now = 0;
  double last_end = -kInf;
  double first_start = kInf;
  size_t done = 0;
  std::vector<double> speed;
  std::vector<int32_t> finished;
  auto by_priority = [&s](int32_t a, int32_t b) {
    const SimNode& x = s.nodes[static_cast<size_t>(a)];
    const SimNode& y = s.nodes[static_cast<size_t>(b)];
    return x.priority != y.priority ? x.priority < y.priority : a < b;
  };

  while (done < n) {
    if (pending_dirty) {
      std::sort(pending.begin(), pending.end(), by_priority);
      pending_dirty = false;
    }
    // Start what may start now.
    for (size_t k = 0; k < pending.size();) {
      const size_t i = static_cast<size_t>(pending[k]);
      const int32_t g = s.nodes[i].group;
      if (earliest[i] <= now + 1e-9 && (g < 0 || !group_busy[static_cast<size_t>(g)])) {
        if (g >= 0) group_busy[static_cast<size_t>(g)] = 1;
        out.start_us[i] = now;
        first_start = std::min(first_start, now);
        running.push_back(static_cast<int32_t>(i));
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(k));
      } else {
        ++k;
      }
    }
    double next = kInf;
    for (int32_t i : pending) {
      const size_t u = static_cast<size_t>(i);
      const int32_t g = s.nodes[u].group;
      if (earliest[u] > now && (g < 0 || !group_busy[static_cast<size_t>(g)])) {
        next = std::min(next, earliest[u]);
      }
    }
    if (running.empty()) {
      if (next == kInf) break;  // nothing can ever start: a cycle or a stuck host
      now = next;
      continue;
    }
    Speeds(running, s.nodes, params, &speed);
    for (size_t k = 0; k < running.size(); ++k) {
      const double v = std::max(speed[k], 1e-6);
      next = std::min(next, now + rem[static_cast<size_t>(running[k])] / v);
    }
    const double dt = next - now;
    now = next;
    finished.clear();
    for (size_t k = 0; k < running.size(); ++k) {
      const size_t i = static_cast<size_t>(running[k]);
      rem[i] -= std::max(speed[k], 1e-6) * dt;
      if (rem[i] <= 1e-9 * std::max(1.0, s.nodes[i].work_us)) finished.push_back(running[k]);
    }
    for (int32_t f : finished) {
      const size_t i = static_cast<size_t>(f);
      running.erase(std::find(running.begin(), running.end(), f));
      out.end_us[i] = now;
      finished_flag[i] = 1;
      last_end = std::max(last_end, now);
      ++done;
      if (s.nodes[i].group >= 0) group_busy[static_cast<size_t>(s.nodes[i].group)] = 0;
      for (int32_t k = succ_begin[i]; k < succ_begin[i + 1]; ++k) {
        const size_t j = static_cast<size_t>(succ[static_cast<size_t>(k)]);
        dep_ready[j] = std::max(dep_ready[j], now);
        if (--indeg[j] == 0 && issued[j]) make_pending(j);
      }
      if (in_host[i]) {
        ++host_done;
        host_last_done = std::max(host_last_done, now);
      }
    }
    if (!finished.empty()) advance_host();
  }
  out.ok = done == n;
  if (!out.ok) out.stall = DescribeStall(s, host_pos, issued, finished_flag, done);
  const double origin = std::min(0.0, first_start == kInf ? 0.0 : first_start);
  double end = last_end == -kInf ? origin : last_end;
  if (out.ok && s.end_issue) {  // the next step's first launch (every node is issued by now)
    const SimNode& e = *s.end_issue;
    double issue_at;
    if (e.post_sync_us >= 0 && !s.host_order.empty()) {
      const double waited = e.sync_node >= 0 ? out.end_us[static_cast<size_t>(e.sync_node)] : host_last_done;
      issue_at = std::max(host_time + e.host_delta_us, waited) + e.post_sync_us;
    } else {
      issue_at = s.host_order.empty() ? e.host_delta_us : host_time + e.host_delta_us;
    }
    end = std::max(end, issue_at + e.launch_latency_us);
  }
  out.makespan_us = end - origin + s.tail_us;
  return out;
}

}  // namespace dynaflow
