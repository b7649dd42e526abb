#include "analysis/sim/step_graph.h"

#include <algorithm>
#include <cctype>
#include <unordered_map>

namespace dynaflow {
namespace {

// Per-step work that does not grow with the batch: optimizer updates and
// gradient zeroing.
bool PerStepName(std::string_view n) {
  return ContainsAny(n, {"optimizer", "zero_grad", "adam", "_foreach_", "multi_tensor_apply",
                         "sgd"});
}

// Collectives whose result only the optimizer needs: data-parallel gradient
// synchronisation (DDP's reducer hooks under AccumulateGrad, FSDP's
// reduce-scatter).
bool GradientSyncName(std::string_view n) {
  return ContainsAny(n, {"accumulategrad", "reducer", "distributeddataparallel", "ddp", "fsdp",
                         "fullyshardeddataparallel", "reduce_scatter", "grad_sync",
                         "allreduce_grads"});
}

// Calls that block the host until the GPU catches up.
bool BlockingCall(std::string_view name, double dur_us) {
  if (ContainsIgnoringCase(name, "synchronize")) return true;
  if (name == "cudaMemcpy" || name == "cuMemcpyDtoH_v2" || name == "cuMemcpyHtoD_v2") {
    return dur_us > 20;
  }
  return dur_us > 200;  // any other call that long waited on something
}

double Us(TimeNs ns) { return static_cast<double>(ns) / 1000.0; }

constexpr int32_t kAnyProcess = -1;

// One nanosecond, the traces' resolution: a start later than the host
// explains by more than this is GPU-side latency.
constexpr double kNsUs = 1e-3;

// The process that launched the device's work: the one whose calls carry the
// step's correlation ids and precede their activities. Correlation ids are
// unique per process only, so an export of several processes (one Nsight
// Systems file of two ranks' processes, each driving its own GPU) has the same
// id in each; matching without the process gives a kernel another process's
// launch, and a host replay that waits for work it has not issued.
int32_t LaunchingProcess(const Trace& trace, int32_t rank, const StepGraph& g,
                         const std::unordered_map<int64_t, int32_t>& by_correlation) {
  std::unordered_map<int32_t, int64_t> votes;
  for (const ApiCall& c : trace.api) {
    if (c.rank != rank || c.correlation < 0 || c.kind == ApiKind::kSync) continue;
    auto it = by_correlation.find(c.correlation);
    if (it == by_correlation.end()) continue;
    const SimTask& t = g.tasks[static_cast<size_t>(it->second)];
    if (c.start <= g.start + static_cast<TimeNs>(t.start_us * 1000.0)) ++votes[c.pid];
  }
  int32_t best = kAnyProcess;
  int64_t best_votes = -1;
  for (const auto& [pid, v] : votes) {
    if (v > best_votes || (v == best_votes && pid < best)) {
      best = pid;
      best_votes = v;
    }
  }
  return best;
}

struct HostBlock {
  TimeNs start, end;
  int32_t tid;
};

// The launch of the next step's first activity, whose start ends this step
// (Step::end); at < 0 when unknown.
struct NextLaunch {
  TimeNs at = -1;
  TimeNs gpu_start = 0;
  double call_us = 0;
  int32_t tid = 0;
};

// The host side of each launched task (step_graph.h): its host time since the
// previous launch, and, after a blocking call of its own thread, the task the
// call waited for. That task is one the host issued before the launch that
// follows the call (an earlier host position, or no launch call at all): the
// host cannot wait for work it issues later, and a replay that did would never
// finish. With several launching threads, each thread's blocking calls are
// matched to that thread's next launch.
void AttachHost(const std::vector<TimeNs>& launch, const std::vector<double>& call_us,
                const std::vector<int32_t>& launch_tid, const std::vector<HostBlock>& blocks,
                TimeNs step_start, double max_latency_us, const NextLaunch& next, StepGraph* g) {
  const size_t n = g->tasks.size();
  std::vector<int32_t> host_pos(n, -1);
  for (size_t h = 0; h < g->host_order.size(); ++h) {
    host_pos[static_cast<size_t>(g->host_order[h])] = static_cast<int32_t>(h);
  }
  // Tasks by measured end, to find what a blocking call waited for.
  std::vector<std::pair<double, int32_t>> by_end(n);
  for (size_t t = 0; t < n; ++t) {
    by_end[t] = {g->tasks[t].start_us + g->tasks[t].dur_us, static_cast<int32_t>(t)};
  }
  std::sort(by_end.begin(), by_end.end());
  constexpr double eps_sync = 2.0;  // us between a task's end and the call's return
  TimeNs prev = step_start;
  std::unordered_map<int32_t, TimeNs> prev_of_thread;  // each thread's previous launch
  // One launch at host position h: a call at L on thread tid of call_dur us,
  // whose activity starts at gpu_start.
  auto issue = [&](size_t h, TimeNs L, int32_t tid, double call_dur, TimeNs gpu_start) {
    HostIssue out;
    // A long launch call (lazy module loading, JIT) holds its kernel back:
    // the GPU starts it near the call's return, not its start.
    out.latency_us = std::clamp(Us(gpu_start - L), 0.0, call_dur + max_latency_us);
    const auto own_prev = prev_of_thread.find(tid);
    const TimeNs since = own_prev == prev_of_thread.end() ? prev : own_prev->second;
    prev_of_thread[tid] = L;
    if (h == 0) {
      out.host_delta_us = Us(L - step_start);  // may be negative: launched before the step began
      prev = L;
      return out;
    }
    // The last blocking call of this thread since its previous launch during
    // which a task finished: the call waited for that task (the last to
    // finish in it, issued before this launch: the host cannot wait for work
    // it issues later, and a replay that did would never finish). Earlier
    // calls and the host time around them stay host time.
    auto b = std::lower_bound(blocks.begin(), blocks.end(), since,
                              [](const HostBlock& x, TimeNs v) { return x.start < v; });
    auto e = std::lower_bound(b, blocks.end(), L,
                              [](const HostBlock& x, TimeNs v) { return x.start < v; });
    int32_t waited = -1;
    double waited_end_us = 0;
    const HostBlock* call = nullptr;
    for (; e != b && waited < 0; --e) {
      const HostBlock& x = *std::prev(e);
      if (x.tid != tid || x.end > L) continue;
      const double begin_us = Us(x.start - step_start) - eps_sync;
      const double end_us = Us(x.end - step_start) + eps_sync;
      auto it = std::upper_bound(by_end.begin(), by_end.end(), std::make_pair(end_us, INT32_MAX));
      while (it != by_end.begin() && std::prev(it)->first >= begin_us) {
        --it;
        if (host_pos[static_cast<size_t>(it->second)] < static_cast<int32_t>(h)) {
          waited = it->second;
          waited_end_us = it->first;
          call = &x;
          break;
        }
      }
    }
    if (waited >= 0) {
      // Relative to the previous launch of any thread: negative when another
      // thread launched while this one blocked; the replay takes the later of
      // that and the waited task's end.
      // The host resumes when the waited task ends: the rest of the call (a
      // cudaMalloc that synchronized, then allocated) and the time after it
      // are host time.
      out.host_delta_us = Us(call->start - prev);
      out.post_sync_us = std::max(0.0, Us(L - step_start) - waited_end_us);
      out.sync_task = waited;
    } else {
      out.host_delta_us = Us(L - prev);
    }
    prev = L;
    return out;
  };
  for (size_t h = 0; h < g->host_order.size(); ++h) {
    const size_t t = static_cast<size_t>(g->host_order[h]);
    SimTask& s = g->tasks[t];
    s.launched = true;
    const HostIssue i = issue(h, launch[t], launch_tid[t], call_us[t],
                              step_start + static_cast<TimeNs>(s.start_us * 1000.0));
    s.host_delta_us = i.host_delta_us;
    s.post_sync_us = i.post_sync_us;
    s.sync_task = i.sync_task;
    s.launch_latency_us = i.latency_us;
  }
  if (next.at >= 0 && !g->host_order.empty() && next.at >= prev) {
    g->end = issue(g->host_order.size(), next.at, next.tid, next.call_us, next.gpu_start);
    g->end_known = true;
  }
}

}  // namespace

StepGraph BuildStepGraph(const Trace& trace, const OperatorLinks& links,
                         const DeviceResources& dev, const DeviceSteps& steps,
                         size_t step_index, CostCache* costs, const GraphOptions& options) {
  StepGraph g;
  g.device_index = dev.device_index;
  g.step_index = step_index;
  if (step_index >= steps.steps.size()) return g;
  const Step& step = steps.steps[step_index];
  g.start = step.start;
  g.measured_us = step.duration_us();

  std::vector<size_t> ks;
  for (size_t k = 0; k < dev.order.size(); ++k) {
    if (steps.step_of[k] == static_cast<int32_t>(step_index)) ks.push_back(k);
  }
  if (ks.size() > options.max_tasks) {
    ks.resize(options.max_tasks);
    g.truncated = true;
  }
  const size_t n = ks.size();
  if (n == 0) return g;

  // GPU time of each operator's execution inside the step, to share its cost.
  OperatorGpuTime op_time(trace);
  for (size_t k : ks) {
    const uint32_t i = dev.order[k];
    const int32_t op = links.activity_op[i];
    if (op >= 0) op_time.Add(op, trace.gpu[i]);
  }

  g.tasks.resize(n);
  std::unordered_map<int64_t, int32_t> by_correlation;
  std::unordered_map<int32_t, double> rows_count;  // GEMM rows -> operator instances
  std::vector<int32_t> counted_ops;
  for (size_t t = 0; t < n; ++t) {
    const uint32_t i = dev.order[ks[t]];
    const GpuActivity& a = trace.gpu[i];
    SimTask& s = g.tasks[t];
    s.resource = dev.resource[ks[t]];
    s.dur_us = Us(a.end - a.start);
    s.start_us = Us(a.start - step.start);
    s.kernel = a.name;
    s.grid_waves = GridWaves(a, dev.peaks);
    auto lane = std::find(g.lane_streams.begin(), g.lane_streams.end(), a.stream);
    s.lane = static_cast<int32_t>(lane - g.lane_streams.begin());
    if (lane == g.lane_streams.end()) g.lane_streams.push_back(a.stream);
    if (a.kind == GpuKind::kMemcpy) s.bytes = static_cast<double>(a.bytes);
    if (a.kind == GpuKind::kMemset) s.token_scaled = false;
    const int32_t op = links.activity_op[i];
    if (op >= 0) {
      const Operator& o = trace.ops[static_cast<size_t>(op)];
      const OpCost& c = costs->Get(o);
      s.kind = c.kind;
      s.op = DisplayOperator(trace, links, i);
      const int32_t top = links.op_top[static_cast<size_t>(op)];
      s.top = trace.ops[static_cast<size_t>(top)].name;
      s.module = o.module_path != 0 ? o.module_path : (top != op ? s.top : 0);
      if (c.known()) {
        const double share = s.dur_us / std::max(1e-9, op_time.Of(op, a) * kNsUs);
        s.flops = c.flops * share;
        s.bytes = c.bytes * share;
        s.weight_bytes = c.weight_bytes * share;
      }
      s.rows = c.tokens;
      if (c.kind == OpKind::kOptimizer || PerStepName(trace.strings.Get(s.top))) {
        s.token_scaled = false;
      }
      if (s.resource == Resource::kCommunication &&
          (GradientSyncName(trace.strings.Get(s.top)) ||
           GradientSyncName(trace.strings.Get(s.module)))) {
        // Gradients are parameter-sized: the collective neither shrinks with a
        // micro-batch nor repeats per micro-batch; it runs once per step.
        s.deferrable = true;
        s.token_scaled = false;
      }
      if (c.kind == OpKind::kMatmul && c.tokens > 0 &&
          std::find(counted_ops.begin(), counted_ops.end(), op) == counted_ops.end()) {
        counted_ops.push_back(op);
        rows_count[static_cast<int32_t>(std::min(c.tokens, 2e9))] += 1;
      }
    }
    if (PerStepName(trace.strings.Get(a.name))) s.token_scaled = false;
    if (a.correlation >= 0) by_correlation.emplace(a.correlation, static_cast<int32_t>(t));
  }
  // Tokens per step: the step's own, else the most common GEMM row count
  // (ties: the larger), else a convolution's batch or an embedding's rows.
  g.phase = step.phase;
  if (step.tokens > 0) {
    g.tokens = static_cast<double>(step.tokens);
    g.tokens_source = step.tokens_source;
  }
  double best_count = 0;
  for (const auto& [rows, count] : rows_count) {
    if (step.tokens > 0) break;
    if (count > best_count || (count == best_count && rows > g.tokens)) {
      best_count = count;
      g.tokens = rows;
      g.tokens_source = TokenSource::kGemmRows;
    }
  }
  if (g.tokens == 0) {
    for (const SimTask& s : g.tasks) {
      if ((s.kind == OpKind::kConvolution || s.kind == OpKind::kEmbedding) && s.rows > 0) {
        g.tokens = s.rows;
        g.tokens_source = TokenSource::kBatchRows;
        break;
      }
    }
  }

  // Launch calls of the step's tasks, and the host's blocking calls between them.
  const int32_t rank = trace.devices[dev.device_index].rank;
  const int32_t pid = LaunchingProcess(trace, rank, g, by_correlation);
  std::vector<TimeNs> launch(n, -1);
  std::vector<int32_t> launch_tid(n, 0);
  std::vector<double> call_us(n, 0);
  std::vector<double> launch_dur;
  if (!by_correlation.empty()) {
    for (const ApiCall& c : trace.api) {
      if (c.rank != rank || c.correlation < 0 || c.kind == ApiKind::kSync) continue;
      if (pid != kAnyProcess && c.pid != pid) continue;
      auto it = by_correlation.find(c.correlation);
      if (it == by_correlation.end()) continue;
      const size_t t = static_cast<size_t>(it->second);
      if (launch[t] < 0) {
        launch[t] = c.start;
        launch_tid[t] = c.tid;
        call_us[t] = Us(c.end - c.start);
        launch_dur.push_back(Us(c.end - c.start));
      }
    }
  }
  for (size_t t = 0; t < n; ++t) {
    if (launch[t] >= 0) g.host_order.push_back(static_cast<int32_t>(t));
  }
  std::stable_sort(g.host_order.begin(), g.host_order.end(),
                   [&launch](int32_t a, int32_t b) { return launch[a] < launch[b]; });
  if (!launch_dur.empty()) {
    std::nth_element(launch_dur.begin(), launch_dur.begin() + launch_dur.size() / 2, launch_dur.end());
    g.launch_cost_us = std::clamp(launch_dur[launch_dur.size() / 2], 1.0, 50.0);
  }
  // The next step's first activity and its launch call: the host's issue of
  // it ends this step.
  NextLaunch next;
  if (step_index + 1 < steps.steps.size()) {
    int64_t corr = -1;
    for (size_t k = 0; k < dev.order.size(); ++k) {
      if (steps.step_of[k] == static_cast<int32_t>(step_index + 1)) {
        corr = trace.gpu[dev.order[k]].correlation;
        next.gpu_start = trace.gpu[dev.order[k]].start;
        break;
      }
    }
    for (const ApiCall& c : trace.api) {
      if (corr < 0 || c.rank != rank || c.correlation != corr || c.kind == ApiKind::kSync) continue;
      if ((pid != kAnyProcess && c.pid != pid) || c.start > next.gpu_start) continue;
      next.at = c.start;
      next.call_us = Us(c.end - c.start);
      next.tid = c.tid;
      break;
    }
  }
  std::vector<HostBlock> blocks;
  if (!g.host_order.empty()) {
    const TimeNs lo = launch[static_cast<size_t>(g.host_order.front())];
    const TimeNs hi = std::max(launch[static_cast<size_t>(g.host_order.back())], next.at);
    for (const ApiCall& c : trace.api) {
      if (c.rank != rank || c.kind == ApiKind::kSync || c.start < lo || c.start >= hi) continue;
      if (pid != kAnyProcess && c.pid != pid) continue;
      if (BlockingCall(trace.strings.Get(c.name), Us(c.end - c.start))) {
        blocks.push_back({c.start, c.end, c.tid});
      }
    }
    std::sort(blocks.begin(), blocks.end(),
              [](const HostBlock& a, const HostBlock& b) { return a.start < b.start; });
  }
  AttachHost(launch, call_us, launch_tid, blocks, step.start, options.max_launch_latency_us, next,
             &g);

  // Dependencies, in measured start order.
  g.dep_begin.assign(n + 1, 0);
  std::vector<std::vector<int32_t>> lane_tasks(g.lane_streams.size());
  const double eps = options.idle_epsilon_us;
  for (size_t t = 0; t < n; ++t) {
    SimTask& s = g.tasks[t];
    std::vector<int32_t>& own = lane_tasks[static_cast<size_t>(s.lane)];
    double ready = -1e300;
    if (!own.empty()) {
      g.deps.push_back(own.back());
      const SimTask& p = g.tasks[static_cast<size_t>(own.back())];
      ready = p.start_us + p.dur_us;
    }
    if (s.start_us - ready > eps) {
      // The stream went idle: a task on another stream that just ended?
      int32_t producer = -1;
      double producer_end = -1e300;
      for (size_t l = 0; l < lane_tasks.size(); ++l) {
        if (static_cast<int32_t>(l) == s.lane) continue;
        const std::vector<int32_t>& other = lane_tasks[l];
        for (size_t j = other.size(); j-- > 0 && j + 3 > other.size();) {
          const SimTask& q = g.tasks[static_cast<size_t>(other[j])];
          const double e = q.start_us + q.dur_us;
          if (e <= s.start_us + eps) {
            if (e > producer_end) {
              producer_end = e;
              producer = other[j];
            }
            break;
          }
        }
      }
      const bool host_had_it =
          !s.launched || launch[t] <= g.start + static_cast<TimeNs>(producer_end * 1000.0) +
                                         static_cast<TimeNs>(eps * 1000.0);
      if (producer >= 0 && producer_end > ready && s.start_us - producer_end <= options.wait_window_us &&
          host_had_it) {
        g.deps.push_back(producer);
        ready = producer_end;
      }
    }
    // What the dependencies do not explain: the host, or GPU-side latency.
    const double host_ready =
        s.launched ? Us(launch[t] - g.start) + s.launch_latency_us : -1e300;
    if (host_ready < s.start_us - kNsUs) {
      // Measured from the dependencies, or from the step's start for a task
      // with none that the host does not explain either.
      s.delay_us = std::max(0.0, s.start_us - (ready > -1e299 ? ready : 0.0));
    }
    g.dep_begin[t + 1] = static_cast<int32_t>(g.deps.size());
    own.push_back(static_cast<int32_t>(t));
  }
  double last_end = 0;
  for (const SimTask& s : g.tasks) last_end = std::max(last_end, s.start_us + s.dur_us);
  // Without the next step's launch (the last step, no launch calls), the idle
  // after the last task is taken as measured: the only place the graph reads
  // the step's measured end.
  if (!g.end_known) g.tail_us = std::max(0.0, g.measured_us - last_end);
  return g;
}

}  // namespace dynaflow
