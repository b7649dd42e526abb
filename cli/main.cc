// The dynaflow command: parses arguments, calls the libraries, maps Status to
// exit codes (0 ok, 1 failure, 2 usage error or bad input).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "analysis/importers/reader.h"
#include "analysis/store/store.h"
#include "analysis/timeline/timeline.h"
#include "reports/format.h"
#include "reports/report.h"

namespace dynaflow {
namespace {

int Fail(const Status& st) {
  std::cerr << "dynaflow: " << st.message() << "\n";
  return st.exit_code();
}

// Progress on stderr, only when it is a terminal, at most four times a second.
ImportOptions ProgressOptions() {
  ImportOptions options;
  if (isatty(STDERR_FILENO) == 0) return options;
  auto last = std::make_shared<std::chrono::steady_clock::time_point>();
  options.progress = [last](int64_t done, int64_t total) {
    auto now = std::chrono::steady_clock::now();
    if (now - *last < std::chrono::milliseconds(250)) return;
    *last = now;
    if (total > 0) {
      std::fprintf(stderr, "\rimporting: %3d%% of %.1f MB", static_cast<int>(100 * done / total),
                   static_cast<double>(total) / 1e6);
    } else {
      std::fprintf(stderr, "\rimporting: %.1f MB", static_cast<double>(done) / 1e6);
    }
    std::fflush(stderr);
  };
  return options;
}

Status Load(const std::vector<std::string>& inputs, Trace* trace) {
  ImportOptions options = ProgressOptions();
  Status st = ImportFiles(inputs, options, trace);
  if (options.progress) std::fprintf(stderr, "\r%40s\r", "");
  return st;
}

// Writes `text` to `path` through a temporary file, so a failure leaves no
// partial output; "-" or empty means stdout.
Status WriteOutput(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    std::cout << text;
    std::cout.flush();
    return std::cout ? Status::Ok() : Status::Failure("cannot write to stdout");
  }
  const std::string tmp = path + ".tmp-" + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    f << text;
    if (!f) {
      std::remove(tmp.c_str());
      return Status::Failure(path + ": cannot write");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    return Status::Failure(path + ": cannot write: " + ec.message());
  }
  return Status::Ok();
}

int RunImport(const std::vector<std::string>& inputs, const std::string& output) {
  Trace trace;
  Status st = Load(inputs, &trace);
  if (!st.ok()) return Fail(st);
  st = WriteTraceDb(trace, output);
  if (!st.ok()) return Fail(st);
  std::cerr << "dynaflow: wrote " << output << ": " << trace.gpu.size() << " GPU activities, "
            << trace.ops.size() << " operators, " << trace.api.size() << " API calls\n";
  return 0;
}

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
  Status st = Load({input}, &trace);
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

struct AdviseArgs {
  std::vector<std::string> inputs;
  std::string format = "text";
  std::string output;
  double kernel_wait_us = 30.0;
  size_t top = 10;
};

int RunAdvise(const AdviseArgs& args) {
  Trace trace;
  Status st = Load(args.inputs, &trace);
  if (!st.ok()) return Fail(st);
  TimelineOptions options;
  options.kernel_wait_threshold_ns = static_cast<TimeNs>(args.kernel_wait_us * 1000.0);
  options.top_kernels = args.top;
  AdviseReport report;
  report.inputs = args.inputs;
  report.trace = &trace;
  report.devices = AnalyzeTimelines(trace, options);
  std::string text;
  if (args.format == "json") {
    text = ReportToJson(report).dump(2) + "\n";
  } else if (args.format == "html") {
    text = ReportToHtml(report);
  } else {
    text = ReportToText(report);
  }
  st = WriteOutput(args.output, text);
  return st.ok() ? 0 : Fail(st);
}

int Main(int argc, char** argv) {
  CLI::App app{
      "dynaflow: finds where your GPUs sit idle and which intra-device parallelism would "
      "recover that time.\n\nInputs (IN) are Kineto/PyTorch-profiler JSON (.json, .json.gz), "
      "Nsight Systems SQLite exports (nsys export --type sqlite) or dynaflow trace.db files; "
      "the format is detected from the content."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dynaflow 0.1.0");

  std::vector<std::string> import_inputs;
  std::string import_output;
  CLI::App* import = app.add_subcommand(
      "import", "Import traces into one trace.db (SQLite; schema in schemas/trace.sql).");
  import->add_option("IN", import_inputs, "Trace files; several Kineto rank files at once")
      ->required();
  import->add_option("-o,--output", import_output, "The trace.db to write (replaced if present)")
      ->required();

  std::string info_input;
  CLI::App* info = app.add_subcommand(
      "info", "Show devices, event counts, time span and import statistics of a trace.");
  info->add_option("IN", info_input, "A trace file or trace.db")->required();

  AdviseArgs advise_args;
  CLI::App* advise = app.add_subcommand(
      "advise",
      "Measure the GPU timeline of each device (computation, exposed communication and "
      "memcpy, idle), per-stream idle causes and the top kernels.");
  advise->add_option("IN", advise_args.inputs, "Trace files or trace.db")->required();
  advise->add_option("--format", advise_args.format, "Report format")
      ->check(CLI::IsMember({"text", "json", "html"}))
      ->capture_default_str();
  advise->add_option("-o,--output", advise_args.output, "Write the report here instead of stdout");
  advise->add_option("--kernel-wait-us", advise_args.kernel_wait_us,
                     "Idle gaps on a stream shorter than this count as kernel (launch) wait")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  advise->add_option("--top", advise_args.top, "How many kernels to list per device")
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }

  if (*import) return RunImport(import_inputs, import_output);
  if (*info) return RunInfo(info_input);
  if (*advise) return RunAdvise(advise_args);
  return 2;
}

}  // namespace
}  // namespace dynaflow

int main(int argc, char** argv) {
  try {
    return dynaflow::Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "dynaflow: internal error: " << e.what() << "\n";
    return 1;
  }
}
