#include <algorithm>
#include <cstdio>
#include <sstream>
#include <tuple>

#include "reports/format.h"
#include "reports/report.h"

namespace dynaflow {
namespace {

// HTML-escaped Printable(s): no markup and no control characters (a NUL
// byte is not allowed in an HTML document).
std::string Escape(std::string_view raw) {
  const std::string s = Printable(raw);
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

const char* ResourceColor(Resource r) {
  switch (r) {
    case Resource::kCompute: return "#2e7d32";
    case Resource::kMemory: return "#1565c0";
    case Resource::kCommunication: return "#c62828";
    case Resource::kCopy: return "#f9a825";
    case Resource::kLatency: return "#8e24aa";
  }
  return "#1565c0";
}

const char* WindowColor(WindowKind k) {
  switch (k) {
    case WindowKind::kCommExposed: return "#c62828";
    case WindowKind::kCopyExposed: return "#f9a825";
    case WindowKind::kMemoryBound: return "#64b5f6";  // lighter than the bars' resource colours
    case WindowKind::kComputeBound: return "#a5d6a7";
    case WindowKind::kLaunchBound: return "#8e24aa";
    case WindowKind::kGpuIdle: return "#757575";
  }
  return "#757575";
}

// One step as lanes of bars coloured by bound resource; with windows, a first
// row marks the idle-resource windows and faint bands cross the lanes where
// the SMs or the whole GPU idle.
void StepTimeline(std::ostringstream& out, const StepPicture& pic, const Trace& trace,
                  const char* role) {
  constexpr double kWidth = 660, kLabel = 170, kLane = 16, kGap = 4, kTop = 34;
  const bool marks = !pic.windows.empty();
  const size_t rows = pic.lanes.size() + (marks ? 1 : 0);
  const double height = kTop + static_cast<double>(rows) * (kLane + kGap) + 8;
  const double span = pic.span_us > 0 ? pic.span_us : 1;
  const double plot = kWidth - kLabel - 8;
  auto x = [&](double us) { return kLabel + plot * std::clamp(us / span, 0.0, 1.0); };
  out << "<figure class=\"step\"><svg class=\"timeline\" data-role=\"" << role << "\" width=\""
      << kWidth << "\" height=\"" << height << "\" viewBox=\"0 0 " << kWidth << " " << height
      << "\" xmlns=\"http://www.w3.org/2000/svg\"><rect width=\"100%\" height=\"100%\" fill=\"#fafafa\"/>"
      << "<text x=\"4\" y=\"13\" font-size=\"12\" font-weight=\"bold\">" << Escape(pic.title) << " · "
      << Escape(FormatDuration(pic.span_us)) << "</text>";
  for (int i = 0; i <= 4; ++i) {
    const double t = span * i / 4;
    out << "<line x1=\"" << x(t) << "\" x2=\"" << x(t) << "\" y1=\"" << kTop - 6 << "\" y2=\"" << height - 6
        << "\" stroke=\"#ddd\"/><text x=\"" << x(t) << "\" y=\"" << kTop - 9
        << "\" font-size=\"9\" text-anchor=\"" << (i == 0 ? "start" : i == 4 ? "end" : "middle")
        << "\">" << Escape(FormatDuration(t)) << "</text>";
  }
  double y = kTop;
  if (marks) {
    out << "<text x=\"4\" y=\"" << y + 12 << "\" font-size=\"10\">idle windows</text>";
    for (const KindInterval& k : pic.windows) {
      const double s = static_cast<double>(k.start) / 1000.0, e = static_cast<double>(k.end) / 1000.0;
      const double w = std::max(0.5, x(e) - x(s));
      out << "<rect class=\"window\" x=\"" << x(s) << "\" y=\"" << y << "\" width=\"" << w
          << "\" height=\"" << kLane << "\" fill=\"" << WindowColor(k.kind) << "\"><title>"
          << WindowKindName(k.kind) << " " << Escape(FormatDuration(e - s)) << "</title></rect>";
      if (k.kind == WindowKind::kCommExposed || k.kind == WindowKind::kGpuIdle ||
          k.kind == WindowKind::kCopyExposed) {
        out << "<rect x=\"" << x(s) << "\" y=\"" << y + kLane << "\" width=\"" << w << "\" height=\""
            << static_cast<double>(pic.lanes.size()) * (kLane + kGap) + kGap << "\" fill=\""
            << WindowColor(k.kind) << "\" opacity=\"0.12\"/>";
      }
    }
    y += kLane + kGap;
  }
  for (size_t l = 0; l < pic.lanes.size(); ++l) {
    out << "<text x=\"4\" y=\"" << y + static_cast<double>(l) * (kLane + kGap) + 12
        << "\" font-size=\"10\">" << Escape(Shorten(pic.lanes[l], 30)) << "</text>";
  }
  for (const PictureBar& b : pic.bars) {
    const double by = y + static_cast<double>(b.lane) * (kLane + kGap);
    const double w = std::max(0.4, x(b.end_us) - x(b.start_us));
    out << "<rect class=\"bar\" x=\"" << x(b.start_us) << "\" y=\"" << by << "\" width=\"" << w
        << "\" height=\"" << kLane << "\" fill=\"" << ResourceColor(b.resource) << "\">";
    if (w >= 1.0) {
      out << "<title>" << Escape(Shorten(trace.strings.Get(b.name), 100)) << " · "
          << ResourceName(b.resource) << " · " << Escape(FormatDuration(b.end_us - b.start_us))
          << "</title>";
    }
    out << "</rect>";
  }
  out << "</svg></figure>";
}

// Horizontal bars of labelled values (breakdown charts).
void BarChart(std::ostringstream& out, const char* title,
              const std::vector<std::tuple<std::string, double, std::string, std::string>>& rows) {
  // rows: label, value, colour, value text
  double max = 0;
  for (const auto& r : rows) max = std::max(max, std::get<1>(r));
  constexpr double kWidth = 470, kLabel = 150, kRow = 18;
  const double height = 22 + kRow * static_cast<double>(rows.size());
  out << "<figure class=\"chart\"><svg width=\"" << kWidth << "\" height=\"" << height
      << "\" xmlns=\"http://www.w3.org/2000/svg\"><text x=\"0\" y=\"13\" font-size=\"12\" "
         "font-weight=\"bold\">"
      << Escape(title) << "</text>";
  double y = 20;
  for (const auto& [label, value, color, text] : rows) {
    const double w = max > 0 ? (kWidth - kLabel - 130) * value / max : 0;
    out << "<text x=\"0\" y=\"" << y + 12 << "\" font-size=\"10\">" << Escape(Shorten(label, 30))
        << "</text><rect x=\"" << kLabel << "\" y=\"" << y + 2 << "\" width=\"" << std::max(0.5, w)
        << "\" height=\"" << kRow - 5 << "\" fill=\"" << color << "\"/><text x=\"" << kLabel + w + 4
        << "\" y=\"" << y + 12 << "\" font-size=\"10\">" << Escape(text) << "</text>";
    y += kRow;
  }
  out << "</svg></figure>";
}

void DeviceAdviceHtml(std::ostringstream& out, const DeviceAdvice& a) {
  std::vector<std::tuple<std::string, double, std::string, std::string>> classes, windows;
  for (int c = 0; c < kResourceCount; ++c) {
    const ResourceTotals& t = a.totals[c];
    if (t.count == 0) continue;
    classes.emplace_back(ResourceName(static_cast<Resource>(c)), t.time_us,
                         ResourceColor(static_cast<Resource>(c)), FormatDuration(t.time_us));
  }
  for (int k = 0; k < kWindowKindCount; ++k) {
    const double us = a.windows.per_step_us[k];
    if (us <= 0) continue;
    windows.emplace_back(WindowKindName(static_cast<WindowKind>(k)), us,
                         WindowColor(static_cast<WindowKind>(k)),
                         FormatDuration(us) + " (" + FormatPercent(us, a.step_mean_us) + ")");
  }
  out << "<h3>Steps</h3><p>" << a.steps.size() << " step(s) from " << StepSourceName(a.step_source)
      << ": mean " << FormatDuration(a.step_mean_us) << ", median " << FormatDuration(a.step_median_us)
      << ", min " << FormatDuration(a.step_min_us) << ", max " << FormatDuration(a.step_max_us)
      << ", spread " << FormatPercent(a.step_cv_pct, 100.0) << "</p><div class=\"row\">";
  BarChart(out, "GPU time by bound resource", classes);
  BarChart(out, "Idle-resource windows per step", windows);
  out << "</div><h3>Idle-resource windows</h3><table><tr><th>per step</th><th>share</th>"
         "<th>recoverable</th><th>saturated</th><th>idle</th><th>where</th></tr>";
  for (const IdleWindow& w : a.windows.windows) {
    out << "<tr><td>" << FormatDuration(w.per_step_us) << "</td><td>"
        << FormatPercent(w.share_of_step_pct, 100.0) << "</td><td>" << FormatDuration(w.recoverable_us)
        << "</td><td>" << WindowSaturated(w.kind) << "</td><td>" << WindowIdle(w.kind)
        << "</td><td class=\"name\">" << Escape(Shorten(w.label, 120)) << "</td></tr>";
  }
  out << "</table><h3>Roofline by operator</h3><table><tr><th>GPU time</th><th>bound</th>"
         "<th>TFLOP/s</th><th>GB/s</th><th>% of peak</th><th>operator</th></tr>";
  for (const OperatorRoofline& o : a.operators) {
    char rates[96];
    std::snprintf(rates, sizeof rates, "</td><td>%.1f</td><td>%.0f</td><td>%.0f%%", o.achieved_tflops,
                  o.achieved_gbps, o.pct_of_peak);
    out << "<tr><td>" << FormatDuration(o.gpu_us) << "</td><td>" << ResourceName(o.resource) << rates
        << "</td><td class=\"name\">" << Escape(Shorten(o.name, 100)) << "</td></tr>";
  }
  out << "</table>";
}

void AdviceHtml(std::ostringstream& out, const AdviceResult& a, const Trace& trace) {
  out << "<section class=\"advice\"><h2>Advice</h2>";
  if (a.has_graph) {
    out << "<p>Simulated on rank " << a.plan.rank << " device " << a.plan.device
        << "'s median step";
    if (a.plan.tokens_per_step > 0) out << " (" << static_cast<long long>(a.plan.tokens_per_step) << " tokens)";
    out << "; replay error " << FormatPercent(a.replay_error_pct, 100.0) << ".</p>"
        << "<div class=\"row timelines\">";
    StepTimeline(out, a.measured, trace, "measured");
    StepTimeline(out, a.predicted, trace, "predicted");
    out << "</div><p class=\"legend\">";
    for (int c = 0; c < kResourceCount; ++c) {
      out << "<span style=\"color:" << ResourceColor(static_cast<Resource>(c)) << "\">&#9632;</span> "
          << ResourceName(static_cast<Resource>(c)) << " &nbsp; ";
    }
    out << "&nbsp; idle windows: ";
    for (int k = 0; k < kWindowKindCount; ++k) {
      out << "<span style=\"color:" << WindowColor(static_cast<WindowKind>(k)) << "\">&#9632;</span> "
          << WindowKindName(static_cast<WindowKind>(k)) << " &nbsp; ";
    }
    out << "</p>";
  }
  std::vector<std::tuple<std::string, double, std::string, std::string>> speedups;
  for (const Recommendation& r : a.recommendations) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2fx", r.predicted_speedup);
    std::string name = StrategyName(r.strategy);
    if (r.splits > 1) name += " x" + std::to_string(r.splits);
    speedups.emplace_back(name, r.predicted_speedup,
                          r.predicted_speedup >= 1 ? "#2e7d32" : "#9e9e9e", text);
  }
  if (!speedups.empty()) BarChart(out, "Predicted speedup per strategy", speedups);
  out << "<h3>Recommendations</h3><table><tr><th>strategy</th><th>speedup</th><th>step</th>"
         "<th>extra memory</th><th>rationale</th></tr>";
  for (const Recommendation& r : a.recommendations) {
    char speed[32];
    std::snprintf(speed, sizeof speed, "%.2fx", r.predicted_speedup);
    out << "<tr><td>" << StrategyName(r.strategy) << (r.splits > 1 ? " x" + std::to_string(r.splits) : "")
        << "</td><td>" << speed << "</td><td>" << FormatDuration(r.baseline_step_us) << " &rarr; "
        << FormatDuration(r.predicted_step_us) << "</td><td>"
        << static_cast<long long>(r.extra_memory_bytes / 1e6) << " MB</td><td class=\"name\">"
        << Escape(r.rationale) << "</td></tr>";
  }
  out << "</table>";
  if (a.has_graph) {
    out << "<h3>Plan by tokens per step</h3><table><tr><th>phase</th><th>tokens</th><th>strategy</th>"
           "<th>speedup</th></tr>";
    for (const PlanBucket& b : a.plan.buckets) {
      char speed[32];
      std::snprintf(speed, sizeof speed, "%.2fx", b.predicted_speedup);
      out << "<tr><td>" << Escape(b.phase.empty() ? a.plan.phase : b.phase) << "</td><td>"
          << static_cast<long long>(b.min_tokens) << " &ndash; "
          << (b.max_tokens ? std::to_string(static_cast<long long>(*b.max_tokens)) : std::string("&infin;"))
          << "</td><td>" << StrategyName(b.strategy) << (b.splits > 1 ? " x" + std::to_string(b.splits) : "")
          << "</td><td>" << speed << "</td></tr>";
    }
    out << "</table>";
  }
  out << "</section>";
}

}  // namespace

std::string ReportToHtml(const AdviseReport& report) {
  std::ostringstream out;
  out << "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>dynaflow report</title>"
         "<style>body{font-family:sans-serif;margin:2em;color:#222}"
         "table{border-collapse:collapse;margin:0.5em 0 1.5em}"
         "td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:right}"
         "td.name{text-align:left;font-family:monospace}.legend{font-size:90%}"
         ".row{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}figure{margin:0}</style>"
         "</head><body><h1>dynaflow advise</h1><p>Inputs:";
  for (const std::string& in : report.inputs) out << " <code>" << Escape(in) << "</code>";
  out << "</p>";
  if (report.devices.empty()) out << "<p>No GPU activity in this trace.</p>";
  if (report.advice != nullptr && report.trace != nullptr && !report.devices.empty()) {
    AdviceHtml(out, *report.advice, *report.trace);
  }
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
    out << "</table>";
    if (report.advice != nullptr) {
      for (const DeviceAdvice& a : report.advice->devices) {
        if (a.device_index == d.device_index) DeviceAdviceHtml(out, a);
      }
    }
    out << "</section>";
  }
  out << "</body></html>\n";
  return out.str();
}

}  // namespace dynaflow
