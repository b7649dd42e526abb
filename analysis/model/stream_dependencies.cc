#include "analysis/model/stream_dependencies.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace dynaflow {
namespace {

// GPU activities of one (rank, launching process, stream) ordered by
// correlation id; the process is -1 where the source does not name it.
struct Launch {
  int64_t correlation;
  size_t index;  // into Trace::gpu
  int32_t device;
};
using StreamKey = std::tuple<int32_t, int32_t, int32_t>;  // rank, pid, stream
using LaunchIndex = std::map<StreamKey, std::vector<Launch>>;

LaunchIndex IndexLaunches(const Trace& trace) {
  LaunchIndex index;
  for (size_t i = 0; i < trace.gpu.size(); ++i) {
    const GpuActivity& g = trace.gpu[i];
    if (g.correlation < 0 || g.device_index >= trace.devices.size()) continue;
    const DeviceInfo& d = trace.devices[g.device_index];
    index[{d.rank, g.pid, g.stream}].push_back({g.correlation, i, d.device});
  }
  for (auto& [key, launches] : index) {
    std::stable_sort(launches.begin(), launches.end(), [](const Launch& a, const Launch& b) {
      return a.correlation < b.correlation;
    });
  }
  return index;
}

bool OnDevice(const Launch& l, int32_t device) { return device < 0 || l.device == device; }

// The last activity on the stream launched before `correlation`.
int64_t LastBefore(const Trace& trace, const std::vector<Launch>& launches, int64_t correlation,
                   int32_t device) {
  auto it = std::lower_bound(
      launches.begin(), launches.end(), correlation,
      [](const Launch& l, int64_t c) { return l.correlation < c; });
  int64_t best = -1;
  int64_t best_correlation = -1;
  while (it != launches.begin()) {
    --it;
    if (!OnDevice(*it, device)) continue;
    if (best >= 0 && it->correlation != best_correlation) break;
    if (best < 0 || trace.gpu[it->index].end > trace.gpu[static_cast<size_t>(best)].end) {
      best = static_cast<int64_t>(it->index);
      best_correlation = it->correlation;
    }
  }
  return best;
}

// The first activity on the stream launched after `correlation`.
int64_t FirstAfter(const Trace& trace, const std::vector<Launch>& launches, int64_t correlation,
                   int32_t device) {
  auto it = std::upper_bound(
      launches.begin(), launches.end(), correlation,
      [](int64_t c, const Launch& l) { return c < l.correlation; });
  int64_t best = -1;
  int64_t best_correlation = -1;
  for (; it != launches.end(); ++it) {
    if (!OnDevice(*it, device)) continue;
    if (best >= 0 && it->correlation != best_correlation) break;
    if (best < 0 || trace.gpu[it->index].start < trace.gpu[static_cast<size_t>(best)].start) {
      best = static_cast<int64_t>(it->index);
      best_correlation = it->correlation;
    }
  }
  return best;
}

bool IsCrossStreamWait(const ApiCall& a) {
  return a.kind == ApiKind::kSync && a.sync_stream >= 0 && a.wait_on_stream >= 0 &&
         a.wait_on_stream != a.sync_stream && a.wait_event_correlation >= 0 &&
         a.correlation >= 0;
}

}  // namespace

std::vector<StreamDependency> CrossStreamDependencies(const Trace& trace) {
  std::vector<StreamDependency> edges;
  const LaunchIndex launches = IndexLaunches(trace);
  static const std::vector<Launch> kNone;
  // Correlation ids are per process: the wait's own process's launches, or
  // the rank's when its GPU rows name no process (one process per Kineto file).
  auto on = [&](const ApiCall& a, int32_t stream) -> const std::vector<Launch>& {
    auto it = launches.find({a.rank, a.pid, stream});
    if (it == launches.end()) it = launches.find({a.rank, -1, stream});
    return it == launches.end() ? kNone : it->second;
  };
  for (size_t i = 0; i < trace.api.size(); ++i) {
    const ApiCall& a = trace.api[i];
    if (!IsCrossStreamWait(a)) continue;
    StreamDependency e;
    e.wait = i;
    e.from = LastBefore(trace, on(a, a.wait_on_stream), a.wait_event_correlation, a.sync_device);
    e.to = FirstAfter(trace, on(a, a.sync_stream), a.correlation, a.sync_device);
    edges.push_back(e);
  }
  return edges;
}

}  // namespace dynaflow
