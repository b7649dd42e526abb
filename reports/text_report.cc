#include <algorithm>
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
      << (d.name.empty() ? "unknown GPU" : Printable(d.name)) << "\n";
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

// One line per phase the steps have (none when every phase is unknown): how
// many steps, and their median tokens with where those came from.
void PhaseLines(std::ostringstream& out, const std::vector<Step>& steps) {
  for (StepPhase p : {StepPhase::kPrefill, StepPhase::kDecode, StepPhase::kMixed, StepPhase::kTraining}) {
    int64_t n = 0;
    std::vector<int64_t> tokens;
    TokenSource source = TokenSource::kNone;
    for (const Step& s : steps) {
      if (s.phase != p) continue;
      ++n;
      if (s.tokens > 0) {
        tokens.push_back(s.tokens);
        source = s.tokens_source;
      }
    }
    if (n == 0) continue;
    out << "    " << n << " " << PhaseName(p) << " step(s)";
    if (!tokens.empty()) {
      std::nth_element(tokens.begin(), tokens.begin() + tokens.size() / 2, tokens.end());
      out << ", median " << tokens[tokens.size() / 2] << " tokens (" << TokenSourceName(source) << ")";
    }
    out << "\n";
  }
}

void AdviceSection(std::ostringstream& out, const DeviceAdvice& a) {
  char buf[320];
  out << "  Steps (" << StepSourceName(a.step_source) << ")\n";
  std::snprintf(buf, sizeof buf, "    %zu step(s): mean %s, median %s, min %s, max %s, spread %.1f%%\n",
                a.steps.size(), FormatDuration(a.step_mean_us).c_str(),
                FormatDuration(a.step_median_us).c_str(), FormatDuration(a.step_min_us).c_str(),
                FormatDuration(a.step_max_us).c_str(), a.step_cv_pct);
  out << buf;
  if (a.step_layers > 0) {
    out << "    one forward of " << a.step_layers << " repeating layers: one step, not one per layer\n";
  }
  PhaseLines(out, a.steps);
  out << "\n";
  out << "  Bound resource (roofline" << (a.peaks.known ? "" : ", peaks assumed: unknown GPU") << ")\n";
  for (int c = 0; c < kResourceCount; ++c) {
    const ResourceTotals& t = a.totals[c];
    if (t.count == 0) continue;
    const Resource r = static_cast<Resource>(c);
    std::string rate;
    if (r == Resource::kCompute && t.flops > 0) {
      std::snprintf(buf, sizeof buf, "%.1f TFLOP/s, %.0f%% of peak", t.achieved_tflops, t.pct_of_peak);
      rate = buf;
    } else if (r != Resource::kLatency && t.bytes > 0) {
      std::snprintf(buf, sizeof buf, "%.0f GB/s, %.0f%% of peak", t.achieved_gbps, t.pct_of_peak);
      rate = buf;
    }
    std::snprintf(buf, sizeof buf, "    %-14s %8lld kernels %14s   %s\n", ResourceName(r),
                  static_cast<long long>(t.count), FormatDuration(t.time_us).c_str(), rate.c_str());
    out << buf;
  }
  out << "\n  Idle-resource windows (per step, by recoverable time)\n";
  if (a.windows.windows.empty()) out << "    none\n";
  size_t shown = 0;
  for (const IdleWindow& w : a.windows.windows) {
    if (shown++ == 6) break;
    std::snprintf(buf, sizeof buf, "    %12s %6.1f%% of step, recoverable %s: %s\n",
                  FormatDuration(w.per_step_us).c_str(), w.share_of_step_pct,
                  FormatDuration(w.recoverable_us).c_str(), Shorten(w.label, 110).c_str());
    out << buf;
  }
  out << "\n";
}

void Recommendations(std::ostringstream& out, const AdviceResult& a) {
  char buf[256];
  out << "Recommendations";
  if (a.has_graph) {
    out << " (simulated on rank " << a.plan.rank << " device " << a.plan.device << "'s median step";
    if (a.plan.tokens_per_step > 0) {
      out << ", " << static_cast<long long>(a.plan.tokens_per_step) << " tokens from "
          << TokenSourceName(a.tokens_source);
    }
    if (a.phase != StepPhase::kUnknown) out << ", " << PhaseName(a.phase);
    out << ")";
  }
  out << "\n";
  if (a.recommendations.empty()) {
    if (a.replay_unfinished.empty()) {
      out << "    none: no step to simulate\n";
    } else {
      out << "    none: the replay of the step did not finish: " << a.replay_unfinished << "\n";
    }
  }
  for (const Recommendation& r : a.recommendations) {
    std::string name = StrategyName(r.strategy);
    if (r.splits > 1) name += " x" + std::to_string(r.splits);
    std::snprintf(buf, sizeof buf, "    %-22s %5.2fx  %s -> %s  +%.0f MB\n", name.c_str(),
                  r.predicted_speedup, FormatDuration(r.baseline_step_us).c_str(),
                  FormatDuration(r.predicted_step_us).c_str(), r.extra_memory_bytes / 1e6);
    out << buf << "        " << Printable(r.rationale) << "\n";
  }
  if (a.has_graph) {
    for (size_t i = 0; i < a.plan.buckets.size(); ++i) {
      const PlanBucket& b = a.plan.buckets[i];
      if (i == 0 || b.phase != a.plan.buckets[i - 1].phase) {
        // Each tiling scales one simulated step: it holds for steps of its phase.
        const std::string& phase = b.phase.empty() ? a.plan.phase : b.phase;
        out << "\n  Plan by tokens per step";
        if (!phase.empty()) out << " of " << phase << " steps";
        if (a.plan.tokens_per_step <= 0) out << " (token count unknown: one bucket)";
        out << "\n";
      }
      std::string range = std::to_string(static_cast<long long>(b.min_tokens)) + " .. " +
                          (b.max_tokens ? std::to_string(static_cast<long long>(*b.max_tokens)) : "");
      std::string name = StrategyName(b.strategy);
      if (b.splits > 1) name += " x" + std::to_string(b.splits);
      std::snprintf(buf, sizeof buf, "    %-18s %-22s %5.2fx\n", range.c_str(), name.c_str(),
                    b.predicted_speedup);
      out << buf;
    }
    for (const std::string& why : a.unplanned_phases) {
      out << "\n  No buckets of its own for " << Printable(why)
          << "; apply gives those calls the buckets above without a phase\n";
    }
  }
  out << "\n";
}

}  // namespace

std::string ReportToText(const AdviseReport& report) {
  std::ostringstream out;
  out << "dynaflow advise: " << report.devices.size() << " GPU(s) in";
  for (const std::string& in : report.inputs) out << " " << Printable(in);
  out << "\n\n";
  if (report.devices.empty()) out << "No GPU activity in this trace (host events only).\n\n";
  for (const DeviceTimeline& d : report.devices) {
    DeviceSection(out, d);
    if (report.advice == nullptr) continue;
    for (const DeviceAdvice& a : report.advice->devices) {
      if (a.device_index == d.device_index) AdviceSection(out, a);
    }
  }
  if (report.advice != nullptr && !report.devices.empty()) Recommendations(out, *report.advice);
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
