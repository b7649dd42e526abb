#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "analysis/advisor/advisor.h"
#include "analysis/advisor/plan.h"
#include "analysis/timeline/timeline.h"
#include "cli/commands.h"
#include "reports/report.h"

namespace dynaflow {
namespace {

// "0..1448 tokens: sequential; 1448.. tokens: nanobatch_overlap x2 (1.15x)".
std::string PlanSummary(const Plan& plan) {
  std::string out;
  char buf[160];
  for (const PlanBucket& b : plan.buckets) {
    const std::string max = b.max_tokens ? std::to_string(static_cast<int64_t>(*b.max_tokens)) : "";
    std::snprintf(buf, sizeof buf, "%s%lld..%s tokens: %s", out.empty() ? "" : "; ",
                  static_cast<long long>(b.min_tokens), max.c_str(), StrategyName(b.strategy));
    out += buf;
    if (b.strategy != Strategy::kSequential) {
      std::snprintf(buf, sizeof buf, " x%d (%.2fx)", b.splits, b.predicted_speedup);
      out += buf;
    }
  }
  return out;
}

struct AdviseArgs {
  std::vector<std::string> inputs;
  std::string format = "text";
  std::string output;
  double kernel_wait_us = 30.0;
  size_t top = 10;
  std::string plan;            // --plan: write plan.json here
  std::string force_strategy;  // --force-strategy
  int splits = 0;              // --splits: nano-batches (0: try 2 and 4)
  double min_gain_pct = 3.0;   // --min-gain
  bool no_advice = false;      // --no-advice: the timeline report alone
};

int RunAdvise(const AdviseArgs& args) {
  AdviseOptions advise;
  advise.min_gain = args.min_gain_pct / 100.0;
  advise.splits = args.splits;
  if (args.no_advice && !args.plan.empty()) {
    return Fail(Status::BadInput("--plan needs the advice that --no-advice skips"));
  }
  if (!args.force_strategy.empty()) {
    Strategy s;
    if (!ParseStrategy(args.force_strategy, &s)) {
      return Fail(Status::BadInput("--force-strategy: unknown strategy " + args.force_strategy));
    }
    if (args.plan.empty()) return Fail(Status::BadInput("--force-strategy needs --plan FILE"));
    advise.force = s;
  }
  // Output paths are checked before the work: a missing directory fails at
  // once, not after the report was printed.
  for (const std::string* path : {&args.output, &args.plan}) {
    const Status writable = CheckOutputPath(*path);
    if (!writable.ok()) return Fail(writable);
  }
  Trace trace;
  Status st = LoadInputs(args.inputs, &trace);
  if (!st.ok()) return Fail(st);
  TimelineOptions options;
  options.kernel_wait_threshold_ns = static_cast<TimeNs>(args.kernel_wait_us * 1000.0);
  options.top_kernels = args.top;
  AdviseReport report;
  report.inputs = args.inputs;
  report.trace = &trace;
  ShowPhase("measuring the GPU timeline");
  report.devices = AnalyzeTimelines(trace, options);
  AdviceResult advice;
  if (!args.no_advice) {
    ShowPhase("simulating the candidate schedules");
    advice = Advise(trace, args.inputs, advise);
    report.advice = &advice;
    // A forced split that names nothing `apply` can split is bad input:
    // nothing is written.
    if (advise.force && (*advise.force == Strategy::kNanobatchOverlap ||
                         *advise.force == Strategy::kDualBatchOverlap) &&
        !SplitsModules(advice.plan)) {
      return Fail(Status::BadInput(
          "--force-strategy " + args.force_strategy +
          ": nothing to split: no repeated module (a layer of a stack, \"Model.layers.*\") "
          "was found in the trace; trace the program with `dynaflow "
          "trace`, which records module paths"));
    }
    if (advise.force && *advise.force == Strategy::kCommOverlap && !OverlapsModules(advice.plan)) {
      return Fail(Status::BadInput(
          "--force-strategy comm_overlap: nothing to overlap: no module of the trace makes a "
          "torch.distributed collective (a c10d operator); trace the program with `dynaflow "
          "trace`, which records module paths"));
    }
  }
  ShowPhase("");
  std::string text;
  if (args.format == "json") {
    // Invalid UTF-8 in a trace's names becomes U+FFFD rather than an exception.
    text = ReportToJson(report).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  } else if (args.format == "html") {
    text = ReportToHtml(report);
  } else {
    text = ReportToText(report);
  }
  st = WriteOutput(args.output, text);
  if (!st.ok()) return Fail(st);
  if (!args.plan.empty()) {
    // A plan is always written, a sequential one included.
    const nlohmann::json plan = PlanToJson(advice.plan);
    st = ValidatePlanJson(plan);
    if (!st.ok()) return Fail(Status::Failure("internal: the plan fails its schema: " + st.message()));
    st = WriteOutput(args.plan,
                     plan.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    if (!st.ok()) return Fail(st);
    std::cerr << "dynaflow: wrote the plan " << args.plan << ": " << PlanSummary(advice.plan)
              << "\n";
    const bool splits = std::any_of(advice.plan.buckets.begin(), advice.plan.buckets.end(),
                                    [](const PlanBucket& b) { return b.splits > 1; });
    if (splits && !SplitsModules(advice.plan)) {
      std::cerr << "dynaflow: the trace names no nn.Module to split (no module paths: trace the "
                   "program with `dynaflow trace`), so `dynaflow apply` runs this plan "
                   "unmodified\n";
    }
  }
  return 0;
}

}  // namespace

void AddAdviseCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<AdviseArgs>();
  CLI::App* cmd = app.add_subcommand(
      "advise",
      "Measure the GPU timeline of each device (computation, exposed communication and "
      "memcpy, idle), per-stream idle causes, the top kernels, the bound resource of every "
      "kernel, idle-resource windows, and recommend an overlap strategy per workload bucket "
      "from a simulation of the step.");
  cmd->add_option("IN", args->inputs, "Trace files or trace.db; - reads standard input")->required();
  cmd->footer(
      "Example: an HTML report of two ranks, and the plan for `dynaflow apply`:\n"
      "  dynaflow advise rank0.json.gz rank1.json.gz --format html -o report.html --plan plan.json");
  cmd->add_option("--format", args->format, "Report format")
      ->check(CLI::IsMember({"text", "json", "html"}))
      ->capture_default_str();
  cmd->add_option("-o,--output", args->output, "Write the report here instead of stdout");
  cmd->add_option("--kernel-wait-us", args->kernel_wait_us,
                  "Idle gaps on a stream shorter than this count as kernel (launch) wait")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--top", args->top, "How many kernels to list per device")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--plan", args->plan,
                  "Write the plan (plan.json, schemas/plan.schema.json) for `dynaflow apply` here");
  std::vector<std::string> strategies;
  for (int i = 0; i < kStrategyCount; ++i) strategies.emplace_back(StrategyName(static_cast<Strategy>(i)));
  cmd->add_option("--force-strategy", args->force_strategy,
                  "Write a plan for this strategy whatever the prediction (needs --plan)")
      ->check(CLI::IsMember(strategies));
  cmd->add_option("--splits", args->splits,
                  "Nano-batches for nanobatch_overlap (default: try 2 and 4)")
      ->check(CLI::Range(2, 16));
  cmd->add_flag("--no-advice", args->no_advice,
               "Skip the resource model, idle windows and simulation: the timeline report alone");
  cmd->add_option("--min-gain", args->min_gain_pct,
                  "Percent a strategy must gain over sequential to be chosen")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  cmd->final_callback([args, exit_code] { *exit_code = RunAdvise(*args); });
}

}  // namespace dynaflow
