#include <memory>

#include "analysis/timeline/timeline.h"
#include "cli/commands.h"
#include "reports/report.h"

namespace dynaflow {
namespace {

struct AdviseArgs {
  std::vector<std::string> inputs;
  std::string format = "text";
  std::string output;
  double kernel_wait_us = 30.0;
  size_t top = 10;
};

int RunAdvise(const AdviseArgs& args) {
  Trace trace;
  Status st = LoadInputs(args.inputs, &trace);
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

}  // namespace

void AddAdviseCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<AdviseArgs>();
  CLI::App* cmd = app.add_subcommand(
      "advise",
      "Measure the GPU timeline of each device (computation, exposed communication and "
      "memcpy, idle), per-stream idle causes and the top kernels.");
  cmd->add_option("IN", args->inputs, "Trace files or trace.db")->required();
  cmd->add_option("--format", args->format, "Report format")
      ->check(CLI::IsMember({"text", "json", "html"}))
      ->capture_default_str();
  cmd->add_option("-o,--output", args->output, "Write the report here instead of stdout");
  cmd->add_option("--kernel-wait-us", args->kernel_wait_us,
                  "Idle gaps on a stream shorter than this count as kernel (launch) wait")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--top", args->top, "How many kernels to list per device")
      ->capture_default_str();
  cmd->final_callback([args, exit_code] { *exit_code = RunAdvise(*args); });
}

}  // namespace dynaflow
