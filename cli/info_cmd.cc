#include <algorithm>
#include <climits>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "reports/format.h"

namespace dynaflow {
namespace {

// Last end minus first start of every event, in microseconds; none when empty.
std::optional<double> TimeSpanUs(const Trace& trace) {
  TimeNs lo = INT64_MAX;
  TimeNs hi = INT64_MIN;
  auto see = [&](TimeNs s, TimeNs e) {
    lo = std::min(lo, s);
    hi = std::max(hi, e);
  };
  for (const GpuActivity& g : trace.gpu) see(g.start, g.end);
  for (const ApiCall& a : trace.api) see(a.start, a.end);
  for (const Operator& o : trace.ops) see(o.start, o.end);
  if (lo > hi) return std::nullopt;
  return static_cast<double>(hi - lo) / 1000.0;
}

// A metadata value; "" when absent.
std::string Meta(const Trace& trace, const std::string& key) {
  const auto it = trace.metadata.find(key);
  return it == trace.metadata.end() ? "" : it->second;
}

std::string Format(const Trace& trace) { return Meta(trace, "format"); }

// A tracer status ("cupti", "ops"): the trace-wide value when every process
// that recorded it agrees, else each process's, as "value (pid N), ...".
std::string TracerStatus(const Trace& trace, const std::string& key) {
  std::string status = Meta(trace, key);
  if (!status.empty()) return status;
  for (const ProcessInfo& p : trace.processes) {
    const auto it = p.metadata.find(key);
    if (it == p.metadata.end()) continue;
    if (!status.empty()) status += ", ";
    status += it->second + " (pid " + std::to_string(p.pid) + ")";
  }
  return status;
}

struct Counts {
  int64_t kernels = 0;
  int64_t memcpys = 0;
  int64_t memsets = 0;
};

Counts CountGpu(const Trace& trace) {
  Counts c;
  for (const GpuActivity& g : trace.gpu) {
    c.kernels += g.kind == GpuKind::kKernel;
    c.memcpys += g.kind == GpuKind::kMemcpy;
    c.memsets += g.kind == GpuKind::kMemset;
  }
  return c;
}

void PrintText(const std::string& input, const Trace& trace) {
  const Counts c = CountGpu(trace);
  const std::optional<double> span = TimeSpanUs(trace);
  std::cout << Printable(input) << "\n  format:     " << Format(trace)
            << "\n  time span:  " << (span ? FormatDuration(*span) : "empty")
            << "\n";
  // What `dynaflow trace` could record: CUPTI off means no GPU events, ops off
  // (or no torch extension) no operators.
  const std::string cupti = TracerStatus(trace, "cupti");
  const std::string ops = TracerStatus(trace, "ops");
  if (!cupti.empty()) std::cout << "  cupti:      " << Printable(cupti) << "\n";
  if (!ops.empty()) std::cout << "  operators recorded: " << Printable(ops) << "\n";
  std::cout << "  devices:    " << trace.devices.size() << "\n";
  for (const DeviceInfo& d : trace.devices) {
    std::cout << "    rank " << d.rank << " device " << d.device << ": "
              << (d.name.empty() ? "unknown" : Printable(d.name));
    if (d.sm_count > 0) std::cout << ", " << d.sm_count << " SMs";
    if (d.cc_major > 0) std::cout << ", sm_" << d.cc_major << d.cc_minor;
    if (d.memory_bytes > 0) std::cout << ", " << (d.memory_bytes >> 30) << " GiB";
    std::cout << "\n";
  }
  std::cout << "  kernels:    " << c.kernels << "\n  memcpy:     " << c.memcpys
            << "\n  memset:     " << c.memsets << "\n  api calls:  " << trace.api.size()
            << "\n  operators:  " << trace.ops.size() << "\n  ranges:     " << trace.ranges.size()
            << "\n  import statistics:\n";
  if (trace.stats.all().empty()) std::cout << "    none\n";
  for (const ImportStat& s : trace.stats.all()) {
    std::cout << "    " << s.name << " (" << s.severity << "): " << s.count << "\n";
  }
}

// `info --format json`: schema "dynaflow.info/1", the same facts as the text.
nlohmann::json InfoJson(const std::string& input, const Trace& trace) {
  using nlohmann::json;
  const Counts c = CountGpu(trace);
  const std::optional<double> span = TimeSpanUs(trace);
  json devices = json::array();
  for (const DeviceInfo& d : trace.devices) {
    devices.push_back({{"rank", d.rank},
                       {"device", d.device},
                       {"name", d.name.empty() ? json(nullptr) : json(d.name)},
                       {"sm_count", d.sm_count > 0 ? json(d.sm_count) : json(nullptr)},
                       {"compute_capability", d.cc_major > 0 ? json(std::to_string(d.cc_major) + "." +
                                                                    std::to_string(d.cc_minor))
                                                             : json(nullptr)},
                       {"memory_bytes", d.memory_bytes > 0 ? json(d.memory_bytes) : json(nullptr)}});
  }
  json processes = json::array();  // what each traced process said of itself
  for (const ProcessInfo& p : trace.processes) {
    if (p.metadata.empty()) continue;
    processes.push_back({{"rank", p.rank}, {"pid", p.pid}, {"name", p.name}, {"meta", p.metadata}});
  }
  json stats = json::array();
  for (const ImportStat& s : trace.stats.all()) {
    stats.push_back({{"name", s.name}, {"severity", s.severity}, {"count", s.count}});
  }
  return {{"schema", "dynaflow.info/1"},
          {"input", input},
          {"format", Format(trace)},
          {"time_span_us", span ? json(*span) : json(nullptr)},
          {"tracer",
           {{"cupti", TracerStatus(trace, "cupti").empty() ? json(nullptr)
                                                           : json(TracerStatus(trace, "cupti"))},
            {"ops", TracerStatus(trace, "ops").empty() ? json(nullptr)
                                                       : json(TracerStatus(trace, "ops"))},
            {"processes", processes}}},
          {"devices", devices},
          {"counts",
           {{"kernels", c.kernels},
            {"memcpy", c.memcpys},
            {"memset", c.memsets},
            {"api_calls", trace.api.size()},
            {"operators", trace.ops.size()},
            {"ranges", trace.ranges.size()}}},
          {"import_stats", stats}};
}

int RunInfo(const std::string& input, const std::string& format) {
  Trace trace;
  Status st = LoadInputs({input}, &trace);
  if (!st.ok()) return Fail(st);
  if (format == "json") {
    // Invalid UTF-8 in a trace's names becomes U+FFFD rather than an exception.
    std::cout << InfoJson(input, trace).dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
  } else {
    PrintText(input, trace);
  }
  std::cout.flush();
  return std::cout ? 0 : Fail(Status::Failure("cannot write to stdout"));
}

}  // namespace

void AddInfoCommand(CLI::App& app, int* exit_code) {
  auto input = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("text");
  CLI::App* cmd = app.add_subcommand(
      "info", "Show devices, event counts, time span and import statistics of a trace.");
  cmd->add_option("IN", *input, "A trace file or trace.db; - reads standard input")->required();
  cmd->footer(
      "Example: what a Nsight Systems export holds, as JSON:\n"
      "  dynaflow info --format json profile.sqlite");
  cmd->add_option("--format", *format,
                  "text, or json: one object, schema \"dynaflow.info/1\" (devices, counts, "
                  "time_span_us, import_stats)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd->final_callback([input, format, exit_code] { *exit_code = RunInfo(*input, *format); });
}

}  // namespace dynaflow
