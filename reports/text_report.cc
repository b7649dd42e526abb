#include <cstdio>
#include <sstream>

#include "reports/format.h"
#include "reports/report.h"

namespace dynaflow {
namespace {

void Line(std::ostringstream& out, const char* label, double us, double total) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "    %-24s %14s %8s\n", label, FormatDuration(us).c_str(),
                FormatPercent(us, total).c_str());
  out << buf;
}

void DeviceSection(std::ostringstream& out, const DeviceTimeline& d) {
  const TimelineBreakdown& t = d.timeline;
  out << "rank " << d.rank << " · device " << d.device << " · "
      << (d.name.empty() ? "unknown GPU" : d.name) << "\n";
  out << "  " << d.events << " GPU events";
  if (d.profiler_steps > 0) out << " inside " << d.profiler_steps << " ProfilerStep window(s)";
  out << "\n\n  GPU timeline\n";
  Line(out, "computation", t.computation_us, t.total_us);
  Line(out, "exposed communication", t.exposed_comm_us, t.total_us);
  Line(out, "exposed memcpy", t.exposed_memcpy_us, t.total_us);
  Line(out, "idle", t.idle_us, t.total_us);
  Line(out, "total", t.total_us, t.total_us);
  out << "    busy " << FormatDuration(t.busy_us) << " · communication "
      << FormatDuration(t.total_comm_us) << " ("
      << (t.comm_hidden_pct ? FormatPercent(*t.comm_hidden_pct, 100.0) + " hidden" : "none")
      << ") · memcpy " << FormatDuration(t.total_memcpy_us) << "\n\n";

  char buf[256];
  out << "  Streams\n";
  std::snprintf(buf, sizeof buf, "    %-8s %8s %12s %12s %12s %12s %12s\n", "stream", "events",
                "busy", "idle", "host wait", "kernel wait", "other");
  out << buf;
  for (const StreamStats& s : d.streams) {
    std::snprintf(buf, sizeof buf, "    %-8d %8lld %12s %12s %12s %12s %12s\n", s.stream,
                  static_cast<long long>(s.kernels + s.memcpys + s.memsets),
                  FormatDuration(s.busy_us).c_str(), FormatDuration(s.idle_us).c_str(),
                  FormatDuration(s.host_wait_us).c_str(), FormatDuration(s.kernel_wait_us).c_str(),
                  FormatDuration(s.other_wait_us).c_str());
    out << buf;
  }

  out << "\n  By class (sum of durations)\n";
  for (const ClassStats& c : d.classes) {
    if (c.count == 0) continue;
    std::snprintf(buf, sizeof buf, "    %-14s %8lld events %14s\n", c.name.c_str(),
                  static_cast<long long>(c.count), FormatDuration(c.time_us).c_str());
    out << buf;
  }

  out << "\n  Top kernels by total time\n";
  for (const KernelStats& k : d.top_kernels) {
    std::snprintf(buf, sizeof buf, "    %12s %6.1f%% %7lldx  %s\n", FormatDuration(k.total_us).c_str(),
                  k.share_pct, static_cast<long long>(k.count), Shorten(k.name, 90).c_str());
    out << buf;
  }
  out << "\n";
}

}  // namespace

std::string ReportToText(const AdviseReport& report) {
  std::ostringstream out;
  out << "dynaflow advise: " << report.devices.size() << " GPU(s) in";
  for (const std::string& in : report.inputs) out << " " << in;
  out << "\n\n";
  if (report.devices.empty()) out << "No GPU activity in this trace (host events only).\n\n";
  for (const DeviceTimeline& d : report.devices) DeviceSection(out, d);
  if (report.trace != nullptr) {
    bool header = false;
    for (const ImportStat& s : report.trace->stats.all()) {
      if (s.severity == "info") continue;
      if (!header) out << "Import problems (events skipped)\n";
      header = true;
      out << "    " << s.name << ": " << s.count << " — " << s.description << "\n";
    }
  }
  return out.str();
}

}  // namespace dynaflow
