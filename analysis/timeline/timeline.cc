#include "analysis/timeline/timeline.h"

#include <algorithm>
#include <cctype>
#include <unordered_map>
#include <unordered_set>

#include "analysis/timeline/intervals.h"

namespace dynaflow {
namespace {

constexpr double kNsPerUs = 1000.0;
constexpr std::string_view kStepPrefix = "ProfilerStep#";

double Us(TimeNs ns) { return static_cast<double>(ns) / kNsPerUs; }

bool IsCommunicationName(std::string_view name) {
  for (size_t i = 0; i + 4 <= name.size(); ++i) {
    char c0 = static_cast<char>(std::tolower(static_cast<unsigned char>(name[i])));
    if (c0 != 'n' && c0 != 'r') continue;
    if (std::tolower(static_cast<unsigned char>(name[i + 1])) == 'c' &&
        std::tolower(static_cast<unsigned char>(name[i + 2])) == 'c' &&
        std::tolower(static_cast<unsigned char>(name[i + 3])) == 'l') {
      return true;
    }
  }
  return false;
}

// Caches the communication test per interned name.
class Classifier {
 public:
  explicit Classifier(const Trace& trace) : trace_(trace), comm_(trace.strings.size(), -1) {}
  GpuClass operator()(const GpuActivity& g) {
    if (g.kind == GpuKind::kMemcpy) return GpuClass::kMemcpy;
    if (g.kind == GpuKind::kMemset) return GpuClass::kComputation;
    int8_t& c = comm_[g.name];
    if (c < 0) c = IsCommunicationName(trace_.strings.Get(g.name)) ? 1 : 0;
    return c != 0 ? GpuClass::kCommunication : GpuClass::kComputation;
  }

 private:
  const Trace& trace_;
  std::vector<int8_t> comm_;
};

// ProfilerStep#N windows projected on the device, sorted and merged; *steps
// counts distinct steps (Kineto repeats a step's annotation on each stream).
IntervalSet StepWindows(const Trace& trace, uint32_t device_index, int32_t* steps) {
  std::vector<Interval> windows;
  std::unordered_set<StringId> names;
  for (const Range& r : trace.ranges) {
    if (r.domain != RangeDomain::kGpuUser || r.device_index != static_cast<int32_t>(device_index)) {
      continue;
    }
    if (trace.strings.Get(r.name).substr(0, kStepPrefix.size()) != kStepPrefix) continue;
    windows.push_back({r.start, r.end});
    names.insert(r.name);
  }
  *steps = static_cast<int32_t>(names.size());
  return IntervalSet::FromUnsorted(std::move(windows));
}

bool StartsInside(const IntervalSet& windows, TimeNs t) {
  const auto& w = windows.intervals();
  auto it = std::upper_bound(w.begin(), w.end(), t,
                             [](TimeNs v, const Interval& i) { return v < i.start; });
  if (it == w.begin()) return false;
  --it;
  return t >= it->start && t < it->end;
}

TimelineBreakdown Breakdown(const std::vector<Interval> (&by_class)[3]) {
  IntervalSet comp = IntervalSet::FromUnsorted(by_class[0]);
  IntervalSet comm = IntervalSet::FromUnsorted(by_class[1]);
  IntervalSet copy = IntervalSet::FromUnsorted(by_class[2]);
  IntervalSet all = comp.Union(comm).Union(copy);
  TimelineBreakdown b;
  if (all.empty()) return b;
  const TimeNs total = all.last_end() - all.first_start();
  const TimeNs busy = all.Length();
  const TimeNs total_comm = comm.Length();
  const TimeNs exposed_comm = comm.Subtract(comp).Length();
  b.computation_us = Us(comp.Length());
  b.total_comm_us = Us(total_comm);
  b.exposed_comm_us = Us(exposed_comm);
  b.total_memcpy_us = Us(copy.Length());
  b.exposed_memcpy_us = Us(copy.Subtract(comp).Subtract(comm).Length());
  b.busy_us = Us(busy);
  b.total_us = Us(total);
  b.idle_us = Us(total - busy);
  if (total_comm > 0) {
    b.comm_hidden_pct = 100.0 * static_cast<double>(total_comm - exposed_comm) /
                        static_cast<double>(total_comm);
  }
  return b;
}

// Launch time of each correlation id, per rank.
using LaunchIndex = std::unordered_map<int64_t, TimeNs>;

std::unordered_map<int32_t, LaunchIndex> BuildLaunchIndex(const Trace& trace) {
  std::unordered_map<int32_t, LaunchIndex> index;
  for (const ApiCall& a : trace.api) {
    if (a.correlation < 0 || a.kind == ApiKind::kSync) continue;
    index[a.rank].emplace(a.correlation, a.start);
  }
  return index;
}

StreamStats AnalyzeStream(std::vector<const GpuActivity*>& events,
                          const LaunchIndex* launches, TimeNs kernel_wait_threshold) {
  std::sort(events.begin(), events.end(),
            [](const GpuActivity* a, const GpuActivity* b) { return a->start < b->start; });
  StreamStats s;
  s.stream = events.front()->stream;
  TimeNs busy = 0;
  TimeNs covered_end = events.front()->start;
  for (const GpuActivity* g : events) {
    switch (g->kind) {
      case GpuKind::kKernel: ++s.kernels; break;
      case GpuKind::kMemcpy: ++s.memcpys; break;
      case GpuKind::kMemset: ++s.memsets; break;
    }
    if (g->start > covered_end) {
      const TimeNs gap = g->start - covered_end;
      TimeNs launch = -1;
      if (launches != nullptr && g->correlation >= 0) {
        auto it = launches->find(g->correlation);
        if (it != launches->end()) launch = it->second;
      }
      if (launch > covered_end) {
        s.host_wait_us += Us(gap);
      } else if (gap < kernel_wait_threshold) {
        s.kernel_wait_us += Us(gap);
      } else {
        s.other_wait_us += Us(gap);
      }
    }
    const TimeNs from = std::max(g->start, covered_end);
    if (g->end > from) busy += g->end - from;
    covered_end = std::max(covered_end, g->end);
  }
  s.busy_us = Us(busy);
  s.span_us = Us(covered_end - events.front()->start);
  s.idle_us = s.span_us - s.busy_us;
  return s;
}

}  // namespace

GpuClass ClassifyActivity(const Trace& trace, const GpuActivity& g) {
  if (g.kind == GpuKind::kMemcpy) return GpuClass::kMemcpy;
  if (g.kind == GpuKind::kMemset) return GpuClass::kComputation;
  return IsCommunicationName(trace.strings.Get(g.name)) ? GpuClass::kCommunication
                                                        : GpuClass::kComputation;
}

std::vector<DeviceTimeline> AnalyzeTimelines(const Trace& trace, const TimelineOptions& options) {
  const size_t n_devices = trace.devices.size();
  std::vector<std::vector<const GpuActivity*>> per_device(n_devices);
  for (const GpuActivity& g : trace.gpu) {
    // Times beyond +-kMaxAbsTimeNs (only a hand-made store can hold them) are
    // left out so that no sum or difference below can overflow.
    if (g.end > g.start && g.device_index < n_devices && g.start >= -kMaxAbsTimeNs &&
        g.end <= kMaxAbsTimeNs) {
      per_device[g.device_index].push_back(&g);
    }
  }
  const auto launches = BuildLaunchIndex(trace);
  Classifier classify(trace);

  std::vector<DeviceTimeline> out;
  for (uint32_t d = 0; d < n_devices; ++d) {
    if (per_device[d].empty()) continue;
    const DeviceInfo& info = trace.devices[d];
    DeviceTimeline dt;
    dt.device_index = d;
    dt.rank = info.rank;
    dt.device = info.device;
    dt.name = info.name;

    const IntervalSet windows = StepWindows(trace, d, &dt.profiler_steps);
    std::vector<const GpuActivity*> events;
    events.reserve(per_device[d].size());
    for (const GpuActivity* g : per_device[d]) {
      if (windows.empty() || StartsInside(windows, g->start)) events.push_back(g);
    }
    dt.events = static_cast<int64_t>(events.size());

    std::vector<Interval> by_class[3];
    ClassStats classes[4] = {{"computation"}, {"communication"}, {"memcpy"}, {"memset"}};
    std::unordered_map<StringId, KernelStats> kernels;
    std::unordered_map<int32_t, std::vector<const GpuActivity*>> streams;
    for (const GpuActivity* g : events) {
      const GpuClass c = classify(*g);
      by_class[static_cast<int>(c)].push_back({g->start, g->end});
      const double dur = Us(g->end - g->start);
      ClassStats& cs = g->kind == GpuKind::kMemset ? classes[3] : classes[static_cast<int>(c)];
      ++cs.count;
      cs.time_us += dur;
      streams[g->stream].push_back(g);
      if (g->kind != GpuKind::kKernel) continue;
      KernelStats& k = kernels[g->name];
      if (k.count == 0) {
        k.gpu_class = c;
        k.min_us = dur;
      }
      ++k.count;
      k.total_us += dur;
      k.min_us = std::min(k.min_us, dur);
      k.max_us = std::max(k.max_us, dur);
    }
    dt.timeline = Breakdown(by_class);
    dt.classes.assign(std::begin(classes), std::end(classes));

    auto launch_it = launches.find(info.rank);
    const LaunchIndex* launch_index = launch_it == launches.end() ? nullptr : &launch_it->second;
    for (auto& [stream, list] : streams) {
      dt.streams.push_back(
          AnalyzeStream(list, launch_index, options.kernel_wait_threshold_ns));
    }
    std::sort(dt.streams.begin(), dt.streams.end(),
              [](const StreamStats& a, const StreamStats& b) { return a.stream < b.stream; });

    for (auto& [name, k] : kernels) {
      k.name = std::string(trace.strings.Get(name));
      k.mean_us = k.total_us / static_cast<double>(k.count);
      k.share_pct = dt.timeline.busy_us > 0 ? 100.0 * k.total_us / dt.timeline.busy_us : 0;
      dt.top_kernels.push_back(std::move(k));
    }
    std::sort(dt.top_kernels.begin(), dt.top_kernels.end(),
              [](const KernelStats& a, const KernelStats& b) {
                return a.total_us != b.total_us ? a.total_us > b.total_us : a.name < b.name;
              });
    if (dt.top_kernels.size() > options.top_kernels) dt.top_kernels.resize(options.top_kernels);
    out.push_back(std::move(dt));
  }
  std::sort(out.begin(), out.end(), [](const DeviceTimeline& a, const DeviceTimeline& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.device < b.device;
  });
  return out;
}

}  // namespace dynaflow
