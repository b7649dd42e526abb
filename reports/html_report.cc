#include <sstream>

#include "reports/format.h"
#include "reports/report.h"

namespace dynaflow {
namespace {

std::string Escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A horizontal bar of the four parts that add up to the device's total time.
void TimelineBar(std::ostringstream& out, const TimelineBreakdown& t) {
  struct Part {
    const char* label;
    double us;
    const char* color;
  };
  const Part parts[] = {{"computation", t.computation_us, "#2e7d32"},
                        {"exposed communication", t.exposed_comm_us, "#c62828"},
                        {"exposed memcpy", t.exposed_memcpy_us, "#f9a825"},
                        {"idle", t.idle_us, "#bdbdbd"}};
  out << "<svg class=\"bar\" width=\"800\" height=\"28\" viewBox=\"0 0 800 28\">";
  double x = 0;
  for (const Part& p : parts) {
    const double w = t.total_us > 0 ? 800.0 * p.us / t.total_us : 0;
    out << "<rect x=\"" << x << "\" y=\"0\" width=\"" << w << "\" height=\"28\" fill=\"" << p.color
        << "\"><title>" << p.label << ": " << FormatDuration(p.us) << "</title></rect>";
    x += w;
  }
  out << "</svg><p class=\"legend\">";
  for (const Part& p : parts) {
    out << "<span style=\"color:" << p.color << "\">&#9632;</span> " << p.label << " "
        << FormatDuration(p.us) << " (" << FormatPercent(p.us, t.total_us) << ") &nbsp; ";
  }
  out << "</p>";
}

}  // namespace

std::string ReportToHtml(const AdviseReport& report) {
  std::ostringstream out;
  out << "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>dynaflow report</title>"
         "<style>body{font-family:sans-serif;margin:2em;color:#222}"
         "table{border-collapse:collapse;margin:0.5em 0 1.5em}"
         "td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:right}"
         "td.name{text-align:left;font-family:monospace}.legend{font-size:90%}</style>"
         "</head><body><h1>dynaflow advise</h1><p>Inputs:";
  for (const std::string& in : report.inputs) out << " <code>" << Escape(in) << "</code>";
  out << "</p>";
  if (report.devices.empty()) out << "<p>No GPU activity in this trace.</p>";
  for (const DeviceTimeline& d : report.devices) {
    out << "<section class=\"device\"><h2>rank " << d.rank << " · device " << d.device << " · "
        << Escape(d.name) << "</h2><p>" << d.events << " GPU events, total "
        << FormatDuration(d.timeline.total_us) << ", busy " << FormatDuration(d.timeline.busy_us)
        << "</p>";
    TimelineBar(out, d.timeline);
    out << "<h3>Streams</h3><table><tr><th>stream</th><th>busy</th><th>idle</th>"
           "<th>host wait</th><th>kernel wait</th><th>other</th></tr>";
    for (const StreamStats& s : d.streams) {
      out << "<tr><td>" << s.stream << "</td><td>" << FormatDuration(s.busy_us) << "</td><td>"
          << FormatDuration(s.idle_us) << "</td><td>" << FormatDuration(s.host_wait_us)
          << "</td><td>" << FormatDuration(s.kernel_wait_us) << "</td><td>"
          << FormatDuration(s.other_wait_us) << "</td></tr>";
    }
    out << "</table><h3>Top kernels</h3><table><tr><th>total</th><th>share</th><th>count</th>"
           "<th>name</th></tr>";
    for (const KernelStats& k : d.top_kernels) {
      out << "<tr><td>" << FormatDuration(k.total_us) << "</td><td>"
          << FormatPercent(k.share_pct, 100.0) << "</td><td>" << k.count
          << "</td><td class=\"name\">" << Escape(Shorten(k.name, 120)) << "</td></tr>";
    }
    out << "</table></section>";
  }
  out << "</body></html>\n";
  return out.str();
}

}  // namespace dynaflow
