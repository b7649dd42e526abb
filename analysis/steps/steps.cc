#include "analysis/steps/steps.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <unordered_map>

namespace dynaflow {
namespace {

constexpr std::string_view kStepPrefix = "ProfilerStep#";

// The most digits a serving annotation's count may have, and the most tokens
// a step may sum: 10^15 stays exact as a double and below the plan's bound on
// token counts (2^53 - 1, PlanLimits::kMaxCount), however many annotations a
// step encloses. A longer count is not an annotation (bad input, not a crash).
constexpr size_t kMaxCountDigits = 15;
constexpr int64_t kMaxTokens = 1'000'000'000'000'000;

bool StepNumber(std::string_view name, int64_t* n) {
  if (name.substr(0, kStepPrefix.size()) != kStepPrefix) return false;
  int64_t v = 0;
  bool digits = false;
  for (size_t i = kStepPrefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') break;
    v = v * 10 + (name[i] - '0');
    digits = true;
  }
  *n = digits ? v : -1;
  return true;
}

struct Window {
  int64_t number;
  TimeNs start;
  TimeNs end;
  StepPhase phase = StepPhase::kUnknown;
  int64_t tokens = 0;
};

// Merges the per-stream ranges of each step number into one window.
std::vector<Window> MergeByNumber(std::vector<Window> w) {
  std::sort(w.begin(), w.end(), [](const Window& a, const Window& b) {
    return a.number != b.number ? a.number < b.number : a.start < b.start;
  });
  std::vector<Window> out;
  for (const Window& x : w) {
    if (!out.empty() && out.back().number == x.number && x.number >= 0) {
      out.back().start = std::min(out.back().start, x.start);
      out.back().end = std::max(out.back().end, x.end);
    } else {
      out.push_back(x);
    }
  }
  std::sort(out.begin(), out.end(), [](const Window& a, const Window& b) { return a.start < b.start; });
  return out;
}

// Index of the window containing t (start <= t < end), -1 if none. Windows
// sorted by start; they may overlap slightly, the latest-starting one wins.
int32_t Locate(const std::vector<Window>& w, TimeNs t) {
  auto it = std::upper_bound(w.begin(), w.end(), t,
                             [](TimeNs v, const Window& x) { return v < x.start; });
  while (it != w.begin()) {
    --it;
    if (t < it->end) return static_cast<int32_t>(it - w.begin());
    if (it->end <= t) break;
  }
  return -1;
}

// The device's kernel names in start order.
std::vector<StringId> KernelSequence(const Trace& trace, const DeviceResources& dev) {
  std::vector<StringId> seq;
  for (uint32_t i : dev.order) {
    if (trace.gpu[i].kind == GpuKind::kKernel) seq.push_back(trace.gpu[i].name);
  }
  return seq;
}

struct Repeat {
  std::vector<int64_t> anchors;  // kernel ordinals of the anchor name
  int64_t period = 0;            // in kernels
};

// Finds the anchor kernel name of a repeating sequence; returns the kernel
// ordinals (positions among the device's kernels) where it occurs, empty when
// the trace does not repeat. Candidates recur at a constant period (2% slack)
// of at least 4 kernels covering 80% of the trace; the smallest period at
// which 90% of the sequence repeats itself wins, and among its names the
// earliest.
Repeat RepeatAnchors(const std::vector<StringId>& seq) {
  struct NameStat {
    int64_t count = 0, first = -1, last = -1, gap_min = INT64_MAX, gap_max = 0;
  };
  std::unordered_map<StringId, NameStat> stats;
  const int64_t n = static_cast<int64_t>(seq.size());
  for (int64_t k = 0; k < n; ++k) {
    NameStat& s = stats[seq[static_cast<size_t>(k)]];
    if (s.count > 0) {
      s.gap_min = std::min(s.gap_min, k - s.last);
      s.gap_max = std::max(s.gap_max, k - s.last);
    } else {
      s.first = k;
    }
    s.last = k;
    ++s.count;
  }
  struct Candidate {
    StringId name;
    int64_t period;
    int64_t first;
  };
  std::vector<Candidate> candidates;
  for (const auto& [name, s] : stats) {
    if (s.count < 2) continue;
    const double slack = std::max(1.0, 0.02 * static_cast<double>(s.gap_min));
    if (s.gap_min < 4 || static_cast<double>(s.gap_max - s.gap_min) > slack) continue;
    const int64_t period = (s.last - s.first + (s.count - 1) / 2) / (s.count - 1);
    if (static_cast<double>(period * s.count) < 0.8 * static_cast<double>(n)) continue;
    candidates.push_back({name, period, s.first});
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.period != b.period ? a.period < b.period : a.first < b.first;
  });
  Repeat out;
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (c > 0 && candidates[c].period == candidates[c - 1].period) continue;  // period already tested
    const int64_t p = candidates[c].period;
    int64_t same = 0, total = 0;
    for (int64_t i = candidates[c].first; i + p < n; ++i, ++total) same += seq[i] == seq[i + p];
    if (total == 0 || static_cast<double>(same) < 0.9 * static_cast<double>(total)) continue;
    for (int64_t k = 0; k < n; ++k) {
      if (seq[static_cast<size_t>(k)] == candidates[c].name) out.anchors.push_back(k);
    }
    out.period = p;
    break;
  }
  return out;
}

// True when the repeating period is one layer of a stack inside one forward:
// kernels that run once in the whole trace come both before the first anchor
// (the embedding) and after the last (the final norm, the head, sampling).
// Repeated forwards or training iterations have no such kernels on both ends:
// what precedes the first anchor and follows the last is part of an
// iteration whose kernels recur in the others.
bool IsLayerStack(const std::vector<StringId>& seq, const Repeat& r) {
  if (r.anchors.size() < 2) return false;
  std::unordered_map<StringId, int64_t> count;
  for (StringId s : seq) ++count[s];
  const int64_t n = static_cast<int64_t>(seq.size());
  auto once_in = [&](int64_t from, int64_t to) {
    for (int64_t k = std::max<int64_t>(0, from); k < std::min(n, to); ++k) {
      if (count[seq[static_cast<size_t>(k)]] == 1) return true;
    }
    return false;
  };
  return once_in(0, r.anchors.front()) && once_in(r.anchors.back() + 1, n);
}

void FinishStats(DeviceSteps* s) {
  const size_t n = s->steps.size();
  if (n == 0) return;
  std::vector<double> d(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    d[i] = s->steps[i].duration_us();
    sum += d[i];
  }
  s->mean_us = sum / static_cast<double>(n);
  double var = 0;
  for (double x : d) var += (x - s->mean_us) * (x - s->mean_us);
  s->stdev_us = n > 1 ? std::sqrt(var / static_cast<double>(n - 1)) : 0;
  s->cv_pct = s->mean_us > 0 ? 100.0 * s->stdev_us / s->mean_us : 0;
  std::vector<double> sorted = d;
  std::sort(sorted.begin(), sorted.end());
  s->min_us = sorted.front();
  s->max_us = sorted.back();
  s->median_us = n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  s->representative = RepresentativeStep(s->steps);
}

// The windows of ProfilerStep#N and serving annotations of one device: on
// the device itself, or on the host of its rank.
struct StepWindows {
  std::vector<Window> profiler_gpu, profiler_host, serving_gpu, serving_host;
};

StepWindows CollectWindows(const Trace& trace, const DeviceResources& dev) {
  StepWindows out;
  const int32_t rank = trace.devices[dev.device_index].rank;
  for (const Range& r : trace.ranges) {
    if (r.end <= r.start) continue;
    const bool on_device = r.domain == RangeDomain::kGpuUser &&
                           r.device_index == static_cast<int32_t>(dev.device_index);
    const bool on_host = r.domain == RangeDomain::kUser && r.rank == rank;
    if (!on_device && !on_host) continue;
    const std::string_view name = trace.strings.Get(r.name);
    int64_t number = 0;
    ServingAnnotation a;
    if (StepNumber(name, &number)) {
      (on_device ? out.profiler_gpu : out.profiler_host).push_back({number, r.start, r.end});
    } else if (ParseServingAnnotation(name, &a)) {
      std::vector<Window>& w = on_device ? out.serving_gpu : out.serving_host;
      // Numbered by order: the same annotation on two streams stays two windows.
      w.push_back({static_cast<int64_t>(w.size()), r.start, r.end, a.phase(), a.tokens()});
    }
  }
  return out;
}

// Each activity's window by its start on the device.
void AssignByStart(const Trace& trace, const DeviceResources& dev, const std::vector<Window>& w,
                   DeviceSteps* out) {
  for (size_t k = 0; k < dev.order.size(); ++k) out->step_of[k] = Locate(w, trace.gpu[dev.order[k]].start);
}

// Each activity's window by the start of its launch call on the host (by its
// own start when the launch is unknown): host ranges enclose launches, not
// the GPU work, which runs later.
void AssignByLaunch(const Trace& trace, const DeviceResources& dev, const std::vector<Window>& w,
                    DeviceSteps* out) {
  const int32_t rank = trace.devices[dev.device_index].rank;
  std::unordered_map<int64_t, TimeNs> launch;
  for (const ApiCall& a : trace.api) {
    if (a.rank == rank && a.correlation >= 0 && a.kind != ApiKind::kSync) {
      launch.emplace(a.correlation, a.start);
    }
  }
  for (size_t k = 0; k < dev.order.size(); ++k) {
    const GpuActivity& g = trace.gpu[dev.order[k]];
    auto it = g.correlation >= 0 ? launch.find(g.correlation) : launch.end();
    out->step_of[k] = Locate(w, it != launch.end() ? it->second : g.start);
  }
}

// Steps between the anchors of a repeating kernel sequence; one whole step
// when nothing repeats or the repeat is the layer stack of one forward.
std::vector<Window> AssignByRepeat(const Trace& trace, const DeviceResources& dev,
                                   DeviceSteps* out) {
  const std::vector<StringId> seq = KernelSequence(trace, dev);
  const Repeat r = RepeatAnchors(seq);
  std::vector<Window> windows;
  if (r.anchors.size() < 2 || IsLayerStack(seq, r)) {
    out->source = StepSource::kWhole;
    if (r.anchors.size() >= 2) out->layers = static_cast<int64_t>(r.anchors.size());
    windows.push_back({0, INT64_MIN, INT64_MAX});
    std::fill(out->step_of.begin(), out->step_of.end(), 0);
    return windows;
  }
  out->source = StepSource::kRepeat;
  // Kernel ordinal -> activity start, then windows between anchors.
  std::vector<TimeNs> anchor_start;
  int64_t kernel = 0;
  size_t a = 0;
  for (size_t k = 0; k < dev.order.size() && a < r.anchors.size(); ++k) {
    const GpuActivity& g = trace.gpu[dev.order[k]];
    if (g.kind != GpuKind::kKernel) continue;
    if (kernel == r.anchors[a]) {
      anchor_start.push_back(g.start);
      ++a;
    }
    ++kernel;
  }
  for (size_t j = 0; j < anchor_start.size(); ++j) {
    const TimeNs end = j + 1 < anchor_start.size() ? anchor_start[j + 1] : INT64_MAX;
    windows.push_back({static_cast<int64_t>(j), anchor_start[j], end});
  }
  AssignByStart(trace, dev, windows, out);
  return windows;
}

// Windows with activity become steps, in time order; step_of is renumbered.
void Compact(const Trace& trace, const DeviceResources& dev, const std::vector<Window>& windows,
             DeviceSteps* out) {
  std::vector<int32_t> remap(windows.size(), -1);
  std::vector<Step> steps(windows.size());
  for (size_t k = 0; k < dev.order.size(); ++k) {
    const int32_t w = out->step_of[k];
    if (w < 0) continue;
    const GpuActivity& g = trace.gpu[dev.order[k]];
    Step& s = steps[static_cast<size_t>(w)];
    if (s.activities == 0) {
      const Window& x = windows[static_cast<size_t>(w)];
      s.number = x.number;
      s.phase = x.phase;
      s.tokens = x.tokens;
      if (x.tokens > 0) s.tokens_source = TokenSource::kAnnotation;
      s.start = g.start;
      s.busy_end = g.end;
    }
    s.start = std::min(s.start, g.start);
    s.busy_end = std::max(s.busy_end, g.end);
    ++s.activities;
  }
  std::vector<size_t> live;
  for (size_t w = 0; w < steps.size(); ++w) {
    if (steps[w].activities > 0) live.push_back(w);
  }
  std::sort(live.begin(), live.end(),
            [&steps](size_t a, size_t b) { return steps[a].start < steps[b].start; });
  for (size_t i = 0; i < live.size(); ++i) {
    remap[live[i]] = static_cast<int32_t>(i);
    out->steps.push_back(steps[live[i]]);
  }
  for (int32_t& s : out->step_of) {
    if (s >= 0) s = remap[static_cast<size_t>(s)];
  }
  const bool ordinal = out->source == StepSource::kRepeat || out->source == StepSource::kServingGpu ||
                       out->source == StepSource::kServingHost;
  for (size_t i = 0; i < out->steps.size(); ++i) {
    Step& s = out->steps[i];
    s.end = i + 1 < out->steps.size() ? std::max(s.busy_end, out->steps[i + 1].start) : s.busy_end;
    if (ordinal) s.number = static_cast<int64_t>(i);
  }
}

// ProfilerStep steps keep their windows; a serving annotation on the device
// that starts inside one gives it its phase and tokens (several: their sum,
// and kMixed when their phases differ).
void AttachServing(const std::vector<Window>& serving, DeviceSteps* out) {
  for (Step& s : out->steps) {
    for (const Window& w : serving) {
      if (w.start < s.start || w.start >= s.end) continue;
      s.phase = s.tokens == 0 && s.phase == StepPhase::kUnknown ? w.phase
                : s.phase == w.phase                        ? s.phase
                                                            : StepPhase::kMixed;
      s.tokens = std::min(s.tokens + w.tokens, kMaxTokens);
      if (s.tokens > 0) s.tokens_source = TokenSource::kAnnotation;
    }
  }
}

}  // namespace

const char* StepSourceName(StepSource s) {
  switch (s) {
    case StepSource::kGpuAnnotation: return "profiler_step_gpu";
    case StepSource::kHostAnnotation: return "profiler_step_host";
    case StepSource::kRepeat: return "repeating_sequence";
    case StepSource::kWhole: return "whole_trace";
    case StepSource::kServingGpu: return "serving_step_gpu";
    case StepSource::kServingHost: return "serving_step_host";
  }
  return "whole_trace";
}

const char* PhaseName(StepPhase p) {
  switch (p) {
    case StepPhase::kUnknown: return "unknown";
    case StepPhase::kPrefill: return "prefill";
    case StepPhase::kDecode: return "decode";
    case StepPhase::kMixed: return "mixed";
    case StepPhase::kTraining: return "training";
  }
  return "unknown";
}

const char* TokenSourceName(TokenSource s) {
  switch (s) {
    case TokenSource::kNone: return "none";
    case TokenSource::kAnnotation: return "annotation";
    case TokenSource::kAttentionShapes: return "attention_shapes";
    case TokenSource::kGemmRows: return "gemm_rows";
    case TokenSource::kBatchRows: return "batch_rows";
  }
  return "none";
}

StepPhase ServingAnnotation::phase() const {
  const bool prefill = context_requests > 0, decode = generation_requests > 0;
  if (prefill && decode) return StepPhase::kMixed;
  if (prefill) return StepPhase::kPrefill;
  return decode ? StepPhase::kDecode : StepPhase::kUnknown;
}

namespace {

// Reads a decimal count at the front of `s` (at most kMaxCountDigits digits).
bool ReadNumber(std::string_view* s, int64_t* v) {
  size_t i = 0;
  *v = 0;
  for (; i < s->size() && (*s)[i] >= '0' && (*s)[i] <= '9'; ++i) {
    if (i == kMaxCountDigits) return false;
    *v = *v * 10 + ((*s)[i] - '0');
  }
  s->remove_prefix(i);
  return i > 0;
}

bool Skip(std::string_view* s, std::string_view word) {
  if (s->substr(0, word.size()) != word) return false;
  s->remove_prefix(word.size());
  return true;
}

// Reads `<word>_<digits>(<digits>` at the front of `s` and skips to the
// closing parenthesis; false on any other text.
bool ReadCount(std::string_view* s, std::string_view word, int64_t* requests, int64_t* tokens) {
  if (!Skip(s, word) || !ReadNumber(s, requests) || !Skip(s, "(") || !ReadNumber(s, tokens)) return false;
  const size_t close = s->find(')');
  if (close == std::string_view::npos) return false;
  s->remove_prefix(close + 1);
  return true;
}

// vLLM: execute_context_C(T[_S])_generation_G(U).
bool ParseVllm(std::string_view name, ServingAnnotation* a) {
  return ReadCount(&name, "execute_context_", &a->context_requests, &a->context_tokens) &&
         ReadCount(&name, "_generation_", &a->generation_requests, &a->generation_tokens);
}

// TensorRT-LLM's PyTorch backend (PyExecutor._forward_step's nvtx_range):
// `[Executor] _forward_step N: C ctx reqs, G gen reqs`, in older versions
// without the iteration N or the `[Executor] ` prefix. Requests, not tokens.
bool ParseTrtLlm(std::string_view name, ServingAnnotation* a) {
  int64_t iteration = 0;
  Skip(&name, "[Executor] ");
  if (!Skip(&name, "_forward_step")) return false;
  if (Skip(&name, " ") && !ReadNumber(&name, &iteration)) return false;
  return Skip(&name, ": ") && ReadNumber(&name, &a->context_requests) && Skip(&name, " ctx reqs, ") &&
         ReadNumber(&name, &a->generation_requests) && name == " gen reqs";
}

}  // namespace

bool ParseServingAnnotation(std::string_view name, ServingAnnotation* out) {
  ServingAnnotation a;
  // SGLang's scheduler (SGLANG_SCHEDULER_ENABLE_NVTX=1: an NVTX range and a
  // record_function) runs one batch, one forward, per `scheduler.run_batch`;
  // the name says neither its phase nor its tokens.
  if (name != "scheduler.run_batch" && !ParseVllm(name, &a) && !ParseTrtLlm(name, &a)) return false;
  *out = a;
  return true;
}

size_t RepresentativeStep(const std::vector<Step>& steps, std::optional<StepPhase> phase) {
  std::vector<size_t> of;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!phase || steps[i].phase == *phase) of.push_back(i);
  }
  if (of.size() >= 2 && steps.size() >= 3 && of.back() + 1 == steps.size()) of.pop_back();
  std::sort(of.begin(), of.end(),
            [&steps](size_t a, size_t b) { return steps[a].duration_us() < steps[b].duration_us(); });
  return of[of.size() / 2];
}

DeviceSteps FindSteps(const Trace& trace, const DeviceResources& dev) {
  DeviceSteps out;
  out.step_of.assign(dev.order.size(), -1);
  if (dev.order.empty()) return out;
  StepWindows w = CollectWindows(trace, dev);
  std::vector<Window> windows;
  if (!w.profiler_gpu.empty()) {
    out.source = StepSource::kGpuAnnotation;
    windows = MergeByNumber(std::move(w.profiler_gpu));
    AssignByStart(trace, dev, windows, &out);
  } else if (!w.profiler_host.empty()) {
    out.source = StepSource::kHostAnnotation;
    windows = MergeByNumber(std::move(w.profiler_host));
    AssignByLaunch(trace, dev, windows, &out);
  } else if (!w.serving_gpu.empty()) {
    out.source = StepSource::kServingGpu;
    windows = MergeByNumber(std::move(w.serving_gpu));
    AssignByStart(trace, dev, windows, &out);
  } else if (!w.serving_host.empty()) {
    out.source = StepSource::kServingHost;
    windows = MergeByNumber(std::move(w.serving_host));
    AssignByLaunch(trace, dev, windows, &out);
  } else {
    windows = AssignByRepeat(trace, dev, &out);
  }
  Compact(trace, dev, windows, &out);
  if (out.source == StepSource::kGpuAnnotation || out.source == StepSource::kHostAnnotation) {
    AttachServing(w.serving_gpu, &out);
  }
  FinishStats(&out);
  return out;
}

}  // namespace dynaflow
