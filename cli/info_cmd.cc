#include <algorithm>
#include <climits>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "reports/format.h"

namespace dynaflow {
namespace {

std::string TimeSpan(const Trace& trace) {
  TimeNs lo = INT64_MAX;
  TimeNs hi = INT64_MIN;
  auto see = [&](TimeNs s, TimeNs e) {
    lo = std::min(lo, s);
    hi = std::max(hi, e);
  };
  for (const GpuActivity& g : trace.gpu) see(g.start, g.end);
  for (const ApiCall& a : trace.api) see(a.start, a.end);
  for (const Operator& o : trace.ops) see(o.start, o.end);
  if (lo > hi) return "empty";
  return FormatDuration(static_cast<double>(hi - lo) / 1000.0);
}

int RunInfo(const std::string& input) {
  Trace trace;
  Status st = LoadInputs({input}, &trace);
  if (!st.ok()) return Fail(st);
  int64_t kernels = 0;
  int64_t memcpys = 0;
  int64_t memsets = 0;
  for (const GpuActivity& g : trace.gpu) {
    kernels += g.kind == GpuKind::kKernel;
    memcpys += g.kind == GpuKind::kMemcpy;
    memsets += g.kind == GpuKind::kMemset;
  }
  std::cout << input << "\n  format:     " << trace.metadata["format"]
            << "\n  time span:  " << TimeSpan(trace) << "\n  devices:    " << trace.devices.size()
            << "\n";
  for (const DeviceInfo& d : trace.devices) {
    std::cout << "    rank " << d.rank << " device " << d.device << ": "
              << (d.name.empty() ? "unknown" : d.name);
    if (d.sm_count > 0) std::cout << ", " << d.sm_count << " SMs";
    if (d.cc_major > 0) std::cout << ", sm_" << d.cc_major << d.cc_minor;
    if (d.memory_bytes > 0) std::cout << ", " << (d.memory_bytes >> 30) << " GiB";
    std::cout << "\n";
  }
  std::cout << "  kernels:    " << kernels << "\n  memcpy:     " << memcpys
            << "\n  memset:     " << memsets << "\n  api calls:  " << trace.api.size()
            << "\n  operators:  " << trace.ops.size() << "\n  ranges:     " << trace.ranges.size()
            << "\n  import statistics:\n";
  if (trace.stats.all().empty()) std::cout << "    none\n";
  for (const ImportStat& s : trace.stats.all()) {
    std::cout << "    " << s.name << " (" << s.severity << "): " << s.count << "\n";
  }
  return 0;
}

}  // namespace

void AddInfoCommand(CLI::App& app, int* exit_code) {
  auto input = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "info", "Show devices, event counts, time span and import statistics of a trace.");
  cmd->add_option("IN", *input, "A trace file or trace.db")->required();
  cmd->final_callback([input, exit_code] { *exit_code = RunInfo(*input); });
}

}  // namespace dynaflow
