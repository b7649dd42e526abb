#include "analysis/steps/steps.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <unordered_map>

namespace dynaflow {
namespace {

constexpr std::string_view kStepPrefix = "ProfilerStep#";

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

// Finds the anchor kernel name of a repeating sequence; returns the kernel
// ordinals (positions among the device's kernels) where it occurs, empty when
// the trace does not repeat. Candidates recur at a constant period (2% slack)
// of at least 4 kernels covering 80% of the trace; the smallest period at
// which 90% of the sequence repeats itself wins, and among its names the
// earliest.
std::vector<int64_t> RepeatAnchors(const Trace& trace, const DeviceResources& dev) {
  struct NameStat {
    int64_t count = 0, first = -1, last = -1, gap_min = INT64_MAX, gap_max = 0;
  };
  std::vector<StringId> seq;
  std::unordered_map<StringId, NameStat> stats;
  for (uint32_t i : dev.order) {
    const GpuActivity& g = trace.gpu[i];
    if (g.kind != GpuKind::kKernel) continue;
    const int64_t n = static_cast<int64_t>(seq.size());
    NameStat& s = stats[g.name];
    if (s.count > 0) {
      const int64_t gap = n - s.last;
      s.gap_min = std::min(s.gap_min, gap);
      s.gap_max = std::max(s.gap_max, gap);
    } else {
      s.first = n;
    }
    s.last = n;
    ++s.count;
    seq.push_back(g.name);
  }
  const int64_t n = static_cast<int64_t>(seq.size());
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
  std::vector<int64_t> anchors;
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (c > 0 && candidates[c].period == candidates[c - 1].period) continue;  // period already tested
    const int64_t p = candidates[c].period;
    int64_t same = 0, total = 0;
    for (int64_t i = candidates[c].first; i + p < n; ++i, ++total) same += seq[i] == seq[i + p];
    if (total == 0 || static_cast<double>(same) < 0.9 * static_cast<double>(total)) continue;
    for (int64_t k = 0; k < n; ++k) {
      if (seq[static_cast<size_t>(k)] == candidates[c].name) anchors.push_back(k);
    }
    break;
  }
  return anchors;
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
  // The representative step: median duration among the steps that end where
  // the next begins (all but the last, when there are three or more).
  const size_t pool = n >= 3 ? n - 1 : n;
  std::vector<size_t> idx(pool);
  for (size_t i = 0; i < pool; ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&d](size_t a, size_t b) { return d[a] < d[b]; });
  s->representative = idx[pool / 2];
}

}  // namespace

const char* StepSourceName(StepSource s) {
  switch (s) {
    case StepSource::kGpuAnnotation: return "profiler_step_gpu";
    case StepSource::kHostAnnotation: return "profiler_step_host";
    case StepSource::kRepeat: return "repeating_sequence";
    case StepSource::kWhole: return "whole_trace";
  }
  return "whole_trace";
}

DeviceSteps FindSteps(const Trace& trace, const DeviceResources& dev) {
  DeviceSteps out;
  const size_t n = dev.order.size();
  out.step_of.assign(n, -1);
  if (n == 0) return out;
  const DeviceInfo& info = trace.devices[dev.device_index];

  std::vector<Window> gpu_windows;
  std::vector<Window> host_windows;
  for (const Range& r : trace.ranges) {
    int64_t number = 0;
    if (!StepNumber(trace.strings.Get(r.name), &number) || r.end <= r.start) continue;
    if (r.domain == RangeDomain::kGpuUser) {
      if (r.device_index == static_cast<int32_t>(dev.device_index)) {
        gpu_windows.push_back({number, r.start, r.end});
      }
    } else if (r.domain == RangeDomain::kUser && r.rank == info.rank) {
      host_windows.push_back({number, r.start, r.end});
    }
  }

  // Step membership as an index into `windows`, then compacted to steps.
  std::vector<Window> windows;
  if (!gpu_windows.empty()) {
    out.source = StepSource::kGpuAnnotation;
    windows = MergeByNumber(std::move(gpu_windows));
    for (size_t k = 0; k < n; ++k) out.step_of[k] = Locate(windows, trace.gpu[dev.order[k]].start);
  } else if (!host_windows.empty()) {
    out.source = StepSource::kHostAnnotation;
    windows = MergeByNumber(std::move(host_windows));
    std::unordered_map<int64_t, TimeNs> launch;
    for (const ApiCall& a : trace.api) {
      if (a.rank == info.rank && a.correlation >= 0 && a.kind != ApiKind::kSync) {
        launch.emplace(a.correlation, a.start);
      }
    }
    for (size_t k = 0; k < n; ++k) {
      const GpuActivity& g = trace.gpu[dev.order[k]];
      TimeNs t = g.start;
      auto it = g.correlation >= 0 ? launch.find(g.correlation) : launch.end();
      if (it != launch.end()) t = it->second;
      out.step_of[k] = Locate(windows, t);
    }
  } else {
    std::vector<int64_t> anchors = RepeatAnchors(trace, dev);
    if (anchors.size() >= 2) {
      out.source = StepSource::kRepeat;
      // Kernel ordinal -> activity position, then windows between anchors.
      std::vector<TimeNs> anchor_start;
      int64_t kernel = 0;
      size_t a = 0;
      for (size_t k = 0; k < n && a < anchors.size(); ++k) {
        const GpuActivity& g = trace.gpu[dev.order[k]];
        if (g.kind != GpuKind::kKernel) continue;
        if (kernel == anchors[a]) {
          anchor_start.push_back(g.start);
          ++a;
        }
        ++kernel;
      }
      for (size_t j = 0; j < anchor_start.size(); ++j) {
        const TimeNs end = j + 1 < anchor_start.size() ? anchor_start[j + 1] : INT64_MAX;
        windows.push_back({static_cast<int64_t>(j), anchor_start[j], end});
      }
      for (size_t k = 0; k < n; ++k) out.step_of[k] = Locate(windows, trace.gpu[dev.order[k]].start);
    } else {
      out.source = StepSource::kWhole;
      windows.push_back({0, INT64_MIN, INT64_MAX});
      std::fill(out.step_of.begin(), out.step_of.end(), 0);
    }
  }

  // Compact: windows with activity become steps, in time order.
  std::vector<int32_t> remap(windows.size(), -1);
  std::vector<Step> steps(windows.size());
  for (size_t k = 0; k < n; ++k) {
    const int32_t w = out.step_of[k];
    if (w < 0) continue;
    const GpuActivity& g = trace.gpu[dev.order[k]];
    Step& s = steps[static_cast<size_t>(w)];
    if (s.activities == 0) {
      s.number = windows[static_cast<size_t>(w)].number;
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
    out.steps.push_back(steps[live[i]]);
  }
  for (int32_t& s : out.step_of) {
    if (s >= 0) s = remap[static_cast<size_t>(s)];
  }
  for (size_t i = 0; i < out.steps.size(); ++i) {
    Step& s = out.steps[i];
    s.end = i + 1 < out.steps.size() ? std::max(s.busy_end, out.steps[i + 1].start) : s.busy_end;
    if (out.source == StepSource::kRepeat) s.number = static_cast<int64_t>(i);
  }
  FinishStats(&out);
  return out;
}

}  // namespace dynaflow
