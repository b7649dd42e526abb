// dynaflow trace [-o trace.db] [options] -- CMD ARGS...
//
// Runs CMD with the tracer preloaded (libdynaflow_preload.so) and the Python
// bootstrap first on PYTHONPATH; every traced process writes <pid>.db into a
// fresh parts directory beside the output, and the parts are merged into the
// output once CMD has exited (processes CMD left running get 3 s to exit).
// The exit code is CMD's (128+N when a signal N killed it; 127 or 126 when it
// could not be run, as in a shell).
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <thread>

#include "analysis/store/store.h"
#include "cli/child_process.h"
#include "cli/commands.h"
#include "cli/trace_parts.h"

namespace dynaflow {
namespace {

namespace fs = std::filesystem;

struct TraceArgs {
  std::string output = "trace.db";
  std::string delay_s;  // passed verbatim to the tracer when given
  std::string duration_s;
  int64_t flush_ms = 0;  // 0: the tracer's default
  std::string ops = "on";
  std::vector<std::string> command;
};

// What goes into the traced program, found beside this binary in the build
// tree (bin/../plugin/...) unless the environment names it.
struct TraceTools {
  std::string preload;        // libdynaflow_preload.so
  std::string bootstrap_dir;  // holds sitecustomize.py
  // _dynaflow_torch.so; empty when there is no such file (not built, or a
  // DYNAFLOW_TORCH_EXT naming nothing, which stays for the bootstrap to report).
  std::string torch_ext;
  std::string torch_ext_looked_at;  // where torch_ext was looked for
};

StatusOr<TraceTools> FindTools() {
  const fs::path plugins = BinaryDir() / ".." / "plugin";
  TraceTools tools;
  tools.preload = EnvOr("DYNAFLOW_PRELOAD", plugins / "preload" / "libdynaflow_preload.so");
  if (!fs::is_regular_file(tools.preload)) {
    return Status::Failure("cannot find the tracer " + tools.preload +
                           " (build the dynaflow_preload target, which needs the CUDA "
                           "toolkit, or set DYNAFLOW_PRELOAD)");
  }
  tools.bootstrap_dir = fs::absolute(plugins / "python" / "bootstrap").lexically_normal();
  tools.torch_ext = EnvOr("DYNAFLOW_TORCH_EXT", plugins / "torch" / "_dynaflow_torch.so");
  tools.torch_ext_looked_at = fs::path(tools.torch_ext).lexically_normal();
  if (!fs::is_regular_file(tools.torch_ext)) tools.torch_ext.clear();
  tools.preload = fs::absolute(tools.preload).lexically_normal();
  if (!tools.torch_ext.empty()) tools.torch_ext = fs::absolute(tools.torch_ext).lexically_normal();
  return tools;
}

// A new empty directory beside `output`: .<name>.parts-XXXXXX.
StatusOr<std::string> MakePartsDir(const std::string& output) {
  const fs::path out = fs::absolute(output);
  std::string templ = (out.parent_path() / ("." + out.filename().string() + ".parts-XXXXXX"));
  if (mkdtemp(templ.data()) == nullptr) {
    return Status::BadInput("cannot create a directory beside " + output + ": " + strerror(errno));
  }
  return templ;
}

std::vector<std::string> ChildEnvironment(const TraceArgs& args, const TraceTools& tools,
                                          const std::string& parts_dir) {
  std::vector<std::string> env = CurrentEnvironment();
  PrependEnv(&env, "LD_PRELOAD", tools.preload);
  PrependEnv(&env, "PYTHONPATH", tools.bootstrap_dir);
  if (!tools.torch_ext.empty()) ReplaceEnv(&env, "DYNAFLOW_TORCH_EXT", tools.torch_ext);
  ReplaceEnv(&env, "DYNAFLOW_OUTPUT_DIR", parts_dir);
  ReplaceEnv(&env, "DYNAFLOW_OPS", args.ops);
  if (!args.delay_s.empty()) ReplaceEnv(&env, "DYNAFLOW_DELAY_S", args.delay_s);
  if (!args.duration_s.empty()) ReplaceEnv(&env, "DYNAFLOW_DURATION_S", args.duration_s);
  if (args.flush_ms > 0) ReplaceEnv(&env, "DYNAFLOW_FLUSH_MS", std::to_string(args.flush_ms));
  return env;
}

// How many live processes were started with `entry` ("NAME=value") in their
// environment. A zombie's environment reads empty, so it does not count.
int ProcessesWithEnv(const std::string& entry) {
  int n = 0;
  std::error_code ec;
  for (const auto& proc : fs::directory_iterator("/proc", ec)) {
    const std::string name = proc.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream in(proc.path() / "environ", std::ios::binary);
    std::string var;
    while (std::getline(in, var, '\0')) {
      if (var == entry) {
        ++n;
        break;
      }
    }
  }
  return n;
}

// Processes CMD started may outlive it by a moment (multiprocessing's resource
// tracker exits once its parent's pipe closes), and a process's store may not
// exist yet when CMD exits. Waits up to kStragglerWait for every process
// traced into `parts_dir` (found by its DYNAFLOW_OUTPUT_DIR) to exit and
// finish its store; returns how many still run then. One scan can miss a
// live process (one in the middle of execve shows an empty environ: its new
// memory holds no environment yet), so they are believed gone only once
// kQuietScans scans in a row, kScanPeriod apart, find none. A straggler went
// unseen once, in a test run on a loaded host, when one empty scan ended the
// wait.
constexpr auto kStragglerWait = std::chrono::seconds(3);
constexpr auto kScanPeriod = std::chrono::milliseconds(20);
constexpr int kQuietScans = 3;

int WaitForStragglers(const std::string& parts_dir) {
  const std::string entry = "DYNAFLOW_OUTPUT_DIR=" + parts_dir;
  const auto deadline = std::chrono::steady_clock::now() + kStragglerWait;
  int quiet = 0;
  while (true) {
    const int running = ProcessesWithEnv(entry);
    quiet = running == 0 ? quiet + 1 : 0;
    if (quiet >= kQuietScans || std::chrono::steady_clock::now() >= deadline) return running;
    std::this_thread::sleep_for(kScanPeriod);
  }
}

// One line when no GPU work was recorded, with the tracer's reason (its
// "cupti" status, e.g. "unavailable: ... did not initialise CUDA").
void ReportMissingGpu(const Trace& trace, const PartsSummary& summary) {
  std::string why;
  for (const std::string& status : summary.cupti) {
    if (status.rfind("enabled", 0) != 0) why = status;
  }
  std::cerr << "dynaflow: no GPU activity recorded" << (why.empty() ? "" : " (cupti " + why + ")")
            << (trace.ops.empty() ? "" : "; operators only") << "\n";
}

// `missing_ext`: where the torch extension was looked for when operators were
// asked for and it is not there ("" otherwise); the summary then says why
// there are no operators instead of a bare "0 operators".
void PrintSummary(const Trace& trace, const PartsSummary& summary, const std::string& output,
                  const std::string& missing_ext) {
  const int64_t kernels =
      std::count_if(trace.gpu.begin(), trace.gpu.end(),
                    [](const GpuActivity& g) { return g.kind == GpuKind::kKernel; });
  if (trace.gpu.empty()) ReportMissingGpu(trace, summary);
  WarnSharedRanks(summary);
  for (const std::string& crash : summary.crashes) {
    std::cerr << "dynaflow: process " << crash << "; what it recorded up to then is kept\n";
  }
  std::cerr << "dynaflow: " << kernels << " kernels, " << trace.ops.size() << " operators"
            << (missing_ext.empty() || !trace.ops.empty()
                    ? ""
                    : " (no torch extension at " + missing_ext +
                          ": PyTorch operators are not recorded; build the dynaflow_torch target)")
            << ", "
            << summary.dropped_records << " dropped records, " << summary.processes
            << (summary.processes == 1 ? " process" : " processes") << " -> " << output << "\n";
}

int RunTrace(const TraceArgs& args) {
  StatusOr<TraceTools> tools = FindTools();
  if (!tools.ok()) return Fail(tools.status());
  StatusOr<std::string> parts_dir = MakePartsDir(args.output);
  if (!parts_dir.ok()) return Fail(parts_dir.status());

  StatusOr<ChildExit> child = RunChild(args.command, ChildEnvironment(args, *tools, *parts_dir));
  if (!child.ok() || child->exec_errno != 0) {
    std::error_code ec;
    fs::remove_all(*parts_dir, ec);
    if (!child.ok()) return Fail(child.status());
    std::cerr << "dynaflow: " << ExecFailure(args.command[0], child->exec_errno) << "\n";
    return ExecExitCode(child->exec_errno);
  }
  const int exit_code = child->exit_code;

  if (const int running = WaitForStragglers(*parts_dir); running > 0) {
    std::cerr << "dynaflow: " << running << " traced process" << (running == 1 ? " is" : "es are")
              << " still running; the trace has their records up to their last flush\n";
  }
  Trace trace;
  const PartsSummary summary = MergeParts(*parts_dir, &trace);
  const Status written = WriteTraceDb(trace, args.output);
  if (!written.ok()) {
    std::cerr << "dynaflow: " << written.message() << " (the parts are kept in " << *parts_dir
              << ")\n";
    return exit_code != 0 ? exit_code : 1;
  }
  std::error_code ec;
  fs::remove_all(*parts_dir, ec);
  PrintSummary(trace, summary, args.output,
               args.ops == "on" && tools->torch_ext.empty() ? tools->torch_ext_looked_at : "");
  return exit_code;
}

}  // namespace

void AddTraceCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<TraceArgs>();
  CLI::App* cmd = app.add_subcommand(
      "trace",
      "Run CMD with the tracer: CUDA kernels, copies, API calls and NVTX ranges through "
      "CUPTI, and PyTorch operators with their nn.Module paths. The exit code is CMD's.\n"
      "Environment: DYNAFLOW_OPS_SAMPLE=N records one top-level operator in N per thread "
      "(bounds the overhead of operator-heavy programs); DYNAFLOW_PRELOAD and "
      "DYNAFLOW_TORCH_EXT override where the tracer and the torch extension are found.");
  cmd->footer(
      "Example: trace 20 steps of a training script, then see where the GPU idles:\n"
      "  dynaflow trace -o run.db -- python train.py --steps 20\n"
      "  dynaflow advise run.db");
  cmd->add_option("-o,--output", args->output, "The trace.db to write (replaced if present)")
      ->capture_default_str();
  cmd->add_option("--delay", args->delay_s, "Start recording this many seconds after CMD starts")
      ->type_name("SECONDS")
      ->check(kNonNegative);
  cmd->add_option("--duration", args->duration_s, "Record for this many seconds, then stop")
      ->type_name("SECONDS")
      ->check(kPositive);
  cmd->add_option("--ops", args->ops, "Record framework operators")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--flush-ms", args->flush_ms,
                  "How often traced processes write their records (default 1000)")
      ->check(kPositive);
  // After --, every word is CMD's, its options included.
  cmd->add_option("CMD", args->command,
                  "The program to trace and its arguments; after -- when they include options")
      ->required();
  cmd->final_callback([args, exit_code] { *exit_code = RunTrace(*args); });
}

}  // namespace dynaflow
