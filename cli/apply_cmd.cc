// dynaflow apply PLAN [--strict] [--verify] [--no-graphs] -- CMD ARGS...
//
// Runs CMD with the Python bootstrap first on PYTHONPATH and the plan in its
// environment: when the program imports torch, the bootstrap replaces the
// forward of the modules the plan splits with planned ones that run through
// the overlap runtime (libdynaflow_apply.so; plugin/python/dynaflow/_apply.py).
// Each Python process of the program writes a JSON summary at exit; they are
// merged and printed here. The exit
// code is CMD's; --verify makes it 1 when a planned output differs from the
// original beyond the dtype's tolerance, or when no call ran the plan.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "analysis/advisor/plan.h"
#include "cli/child_process.h"
#include "cli/commands.h"
#include "reports/format.h"

namespace dynaflow {
namespace {

namespace fs = std::filesystem;

struct ApplyArgs {
  std::string plan;
  bool strict = false;
  bool verify = false;
  bool no_graphs = false;
  std::vector<std::string> command;
};

// The plan, validated against schemas/plan.schema.json's rules.
Status CheckPlan(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::BadInput("cannot read the plan " + path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::BadInput(path + " is not JSON");
  Status st = ValidatePlanJson(j);
  if (!st.ok()) return Status::BadInput(path + ": " + st.message());
  return Status::Ok();
}

struct ApplyTools {
  std::string runtime_lib;    // libdynaflow_apply.so
  std::string bootstrap_dir;  // holds sitecustomize.py
  // _dynaflow_replay.so, which CUDA graphs of planned calls need; empty when
  // there is no such file (not built, or a DYNAFLOW_REPLAY_EXT naming
  // nothing, which stays for apply to report: graphs are then off).
  std::string replay_ext;
};

StatusOr<ApplyTools> FindTools() {
  const fs::path plugins = BinaryDir() / ".." / "plugin";
  ApplyTools tools;
  tools.runtime_lib = EnvOr("DYNAFLOW_APPLY_LIB", plugins / "apply" / "libdynaflow_apply.so");
  if (!fs::is_regular_file(tools.runtime_lib)) {
    return Status::Failure("cannot find the runtime library " + tools.runtime_lib +
                           " (build the dynaflow_apply target, or set DYNAFLOW_APPLY_LIB)");
  }
  tools.runtime_lib = fs::absolute(tools.runtime_lib).lexically_normal();
  tools.bootstrap_dir = fs::absolute(plugins / "python" / "bootstrap").lexically_normal();
  tools.replay_ext = EnvOr("DYNAFLOW_REPLAY_EXT", plugins / "torch" / "_dynaflow_replay.so");
  tools.replay_ext = fs::is_regular_file(tools.replay_ext)
                         ? fs::absolute(tools.replay_ext).lexically_normal().string()
                         : "";
  return tools;
}

// A fresh empty folder where each Python process of the program writes its
// summary (<pid>.json); removed by the caller.
StatusOr<std::string> MakeReportDir() {
  std::string templ = (fs::temp_directory_path() / "dynaflow-apply-XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr) {
    return Status::Failure("cannot create a temporary folder in " + templ);
  }
  return templ;
}

// The summaries of every process (a program may run several: ranks spawned by
// torch.multiprocessing, workers), merged: calls added up over the processes
// that ran the plan's model, verification combined, the first refusal kept.
// Processes that never ran the model (a launcher, a worker) count only when
// none ran it.
struct ApplySummary {
  int processes = 0;  // that reported
  int ran_model = 0;  // that ran the plan's model
  int64_t planned_calls = 0;
  int64_t original_calls = 0;
  size_t units = 0;
  std::string refused;
  bool refusal_said = false;  // printed by the program when it refused
  int64_t verified_calls = 0;
  double max_abs_diff = 0;
  double max_rel_diff = 0;
  bool verify_ok = true;
  std::string worst;
  // Per staggered unit (by path): its schedule and how many calls ran it in
  // the schedule's issue order.
  struct Region {
    std::string kind;  // "staggered" (segments) or "dual-batch" (segments are collectives)
    int64_t segments = 0;
    int64_t micro_batches = 0;
    int64_t calls = 0;
    int64_t off_schedule_calls = 0;
    // Of those, calls captured into a CUDA graph, issued from one host thread
    // micro-batch by micro-batch, the order kept by the schedule's events.
    int64_t by_micro_batch = 0;
  };
  std::map<std::string, Region> regions;
  // Calls that ran the original way for a reason that passes: why -> calls.
  std::map<std::string, int64_t> unsplit;
  int64_t overlapped_collectives = 0;  // comm_overlap: launched asynchronously
  // Of those: read inside their call (not only at its end), and the
  // operators that ran between a collective's launch and its read.
  int64_t read_in_call = 0;
  int64_t ops_beside = 0;
  std::string comm_overlap_error;  // a call whose schedule the runtime's builder refused
  // A plan with a tiling per phase: per phase (by name), the unit calls of
  // that phase and those no tiling was for (run unplanned).
  struct PhaseCalls {
    int64_t calls = 0;
    int64_t unplanned = 0;
  };
  std::map<std::string, PhaseCalls> phases;
  // CUDA graphs (plugin/python/dynaflow/_graphs.py): graphs captured, calls
  // replayed, and planned calls that ran eagerly: why -> calls.
  int64_t graphs_captured = 0;
  int64_t graph_replays = 0;
  std::map<std::string, int64_t> graph_eager;
};

ApplySummary MergeReports(const std::string& dir) {
  std::vector<nlohmann::json> all;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".json") continue;
    std::ifstream in(e.path());
    nlohmann::json r = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!r.is_discarded() && r.is_object()) all.push_back(std::move(r));
  }
  ApplySummary s;
  s.processes = static_cast<int>(all.size());
  for (const nlohmann::json& r : all) s.ran_model += r.value("ran_model", false) ? 1 : 0;
  for (const nlohmann::json& r : all) {
    if (s.ran_model > 0 && !r.value("ran_model", false)) continue;
    s.planned_calls += r.value("planned_calls", int64_t{0});
    s.original_calls += r.value("original_calls", int64_t{0});
    s.units = std::max(s.units, r.value("units", nlohmann::json::array()).size());
    if (s.refused.empty() && !r.value("refused", "").empty()) {
      s.refused = r.value("refused", "");
      s.refusal_said = r.value("refusal_said", false);
    }
    const nlohmann::json v = r.value("verify", nlohmann::json::object());
    s.verified_calls += v.value("calls", int64_t{0});
    s.max_abs_diff = std::max(s.max_abs_diff, v.value("max_abs_diff", 0.0));
    s.max_rel_diff = std::max(s.max_rel_diff, v.value("max_rel_diff", 0.0));
    if (!v.value("worst", "").empty() && s.worst.empty()) s.worst = v.value("worst", "");
    if (!v.value("ok", false)) s.verify_ok = false;
    s.overlapped_collectives += r.value("overlapped_collectives", int64_t{0});
    const nlohmann::json comm = r.value("comm_overlap", nlohmann::json::object());
    s.read_in_call += comm.value("read_in_call", int64_t{0});
    s.ops_beside += comm.value("ops_beside", int64_t{0});
    if (s.comm_overlap_error.empty()) s.comm_overlap_error = comm.value("error", "");
    const nlohmann::json phases = r.value("phase_calls", nlohmann::json::object());
    for (auto it = phases.begin(); phases.is_object() && it != phases.end(); ++it) {
      if (!it.value().is_object()) continue;
      s.phases[it.key()].calls += it.value().value("calls", int64_t{0});
      s.phases[it.key()].unplanned += it.value().value("unplanned", int64_t{0});
    }
    const nlohmann::json graphs = r.value("graphs", nlohmann::json::object());
    s.graphs_captured += graphs.value("captured", int64_t{0});
    s.graph_replays += graphs.value("replayed", int64_t{0});
    const nlohmann::json eager = graphs.value("eager_calls", nlohmann::json::object());
    for (auto it = eager.begin(); eager.is_object() && it != eager.end(); ++it) {
      if (it.value().is_number_integer()) s.graph_eager[it.key()] += it.value().get<int64_t>();
    }
    const nlohmann::json unsplit = r.value("unsplit_calls", nlohmann::json::object());
    for (auto it = unsplit.begin(); unsplit.is_object() && it != unsplit.end(); ++it) {
      if (it.value().is_number_integer()) s.unsplit[it.key()] += it.value().get<int64_t>();
    }
    const nlohmann::json regions = r.value("regions", nlohmann::json::object());
    if (!regions.is_object()) continue;
    for (auto it = regions.begin(); it != regions.end(); ++it) {
      if (!it.value().is_object()) continue;
      ApplySummary::Region& g = s.regions[it.key()];
      g.kind = it.value().value("kind", "staggered");
      g.segments = it.value().value("segments", int64_t{0});
      g.micro_batches = it.value().value("micro_batches", int64_t{0});
      g.calls += it.value().value("calls", int64_t{0});
      g.off_schedule_calls += it.value().value("off_schedule_calls", int64_t{0});
      g.by_micro_batch += it.value().value("calls_issued_by_micro_batch", int64_t{0});
    }
  }
  return s;
}

std::vector<std::string> ChildEnvironment(const ApplyArgs& args, const ApplyTools& tools,
                                          const std::string& report) {
  std::vector<std::string> env = CurrentEnvironment();
  PrependEnv(&env, "PYTHONPATH", tools.bootstrap_dir);
  ReplaceEnv(&env, "DYNAFLOW_PLAN", fs::absolute(args.plan).lexically_normal().string());
  ReplaceEnv(&env, "DYNAFLOW_APPLY_LIB", tools.runtime_lib);
  if (!tools.replay_ext.empty()) ReplaceEnv(&env, "DYNAFLOW_REPLAY_EXT", tools.replay_ext);
  ReplaceEnv(&env, "DYNAFLOW_APPLY_STRICT", args.strict ? "1" : "0");
  ReplaceEnv(&env, "DYNAFLOW_APPLY_VERIFY", args.verify ? "1" : "0");
  ReplaceEnv(&env, "DYNAFLOW_APPLY_GRAPHS", args.no_graphs ? "0" : "1");
  ReplaceEnv(&env, "DYNAFLOW_APPLY_REPORT", report);
  return env;
}

// How many reasons of a summary's counts are printed: the most frequent (a
// reason names its module, so a stack's layers give one each).
constexpr size_t kReasons = 3;

// (calls, reason) of `counts` (reason -> calls), the most calls first.
std::vector<std::pair<int64_t, std::string>> ByCalls(const std::map<std::string, int64_t>& counts) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& [why, calls] : counts) out.emplace_back(-calls, why);
  std::sort(out.begin(), out.end());
  for (auto& [calls, why] : out) calls = -calls;
  return out;
}

// CUDA graphs: how many planned calls replayed one, and why the others ran
// eagerly (the most frequent reasons).
void PrintGraphs(const ApplySummary& r) {
  if (r.graphs_captured == 0 && r.graph_eager.empty()) return;
  std::cerr << "dynaflow apply: " << r.graph_replays << " planned calls replayed "
            << r.graphs_captured << " CUDA graphs (each captured once per unit and shape)\n";
  const auto reasons = ByCalls(r.graph_eager);
  for (size_t i = 0; i < std::min(reasons.size(), kReasons); ++i) {
    const auto& [calls, why] = reasons[i];
    std::cerr << "dynaflow apply: " << calls << (calls == 1 ? " planned call" : " planned calls")
              << " ran eagerly, not as a CUDA graph: " << Shorten(why, 300) << "\n";
  }
  if (reasons.size() > kReasons) {
    std::cerr << "dynaflow apply: and " << reasons.size() - kReasons
              << " more reasons for planned calls that ran eagerly\n";
  }
}

// Prints what the program reported; the exit code that follows from it given
// CMD's own (`exit_code`).
int Summarize(const ApplyArgs& args, const std::string& report_dir, int exit_code) {
  const ApplySummary r = MergeReports(report_dir);
  if (r.processes == 0) {
    // A process reports at its exit: one killed, or aborted, reports nothing.
    if (exit_code == 0) {
      std::cerr << "dynaflow apply: the program never imported torch (no Python process "
                   "reported): nothing was applied\n";
    } else {
      std::cerr << "dynaflow apply: no Python process of the program reported (each reports at "
                   "its exit: they died first, or never imported torch)\n";
    }
    if (args.strict && exit_code == 0) return 2;
    if (args.verify) std::cerr << "verify: no call ran the plan\n";
    return exit_code == 0 && args.verify ? 1 : exit_code;
  }
  if (!r.refused.empty()) {
    // One line: the program said it when it refused during the run; what it
    // found at exit (the plan's model never ran) is said here. That ends a
    // run that itself succeeded; the others already ended it with 2.
    if (!r.refusal_said) std::cerr << "dynaflow apply: plan not applied: " << r.refused << "\n";
    if (args.strict && exit_code == 0) return 2;
  } else {
    std::cerr << "dynaflow apply: " << r.planned_calls << " planned and " << r.original_calls
              << " original calls of " << r.units << " modules"
              << (r.ran_model > 1 ? " in " + std::to_string(r.ran_model) + " processes" : "")
              << "\n";
    // Calls that ran the original way for a reason that passes: the most
    // frequent reasons.
    const auto reasons = ByCalls(r.unsplit);
    for (size_t i = 0; i < std::min(reasons.size(), kReasons); ++i) {
      const auto& [calls, why] = reasons[i];
      std::cerr << "dynaflow apply: " << calls << (calls == 1 ? " call" : " calls")
                << " ran the original way: " << Shorten(why, 300) << "\n";
    }
    if (reasons.size() > kReasons) {
      int64_t calls = 0;
      for (size_t i = kReasons; i < reasons.size(); ++i) calls += reasons[i].first;
      std::cerr << "dynaflow apply: " << calls << " more calls ran the original way, for "
                << reasons.size() - kReasons << " other modules or reasons\n";
    }
    if (r.overlapped_collectives > 0) {
      std::cerr << "dynaflow apply: " << r.overlapped_collectives
                << " collectives launched asynchronously, each waited for just before the first "
                   "operator that uses its tensors: "
                << r.read_in_call << " read inside their call, " << r.ops_beside
                << " operators ran beside them\n";
      if (!r.comm_overlap_error.empty()) {
        std::cerr << "dynaflow apply: comm_overlap: a call ran no schedule the runtime builds: "
                  << r.comm_overlap_error << "\n";
      }
    }
    if (!r.phases.empty()) {
      std::cerr << "dynaflow apply: calls by phase:";
      const char* sep = " ";
      for (const auto& [phase, c] : r.phases) {
        std::cerr << sep << Shorten(phase, 40) << " " << c.calls;
        if (c.unplanned > 0) {
          std::cerr << " (" << c.unplanned << " unplanned: the plan has no buckets for them)";
        }
        sep = ", ";
      }
      std::cerr << "\n";
    }
    PrintGraphs(r);
    // Whether the calls ran the schedule the prediction simulated.
    for (const auto& [path, g] : r.regions) {
      const bool dual = g.kind == "dual-batch";
      std::cerr << "dynaflow apply: " << Shorten(path, 200) << " ran "
                << (dual ? "dual-batch" : "staggered") << " (" << g.segments
                << (dual ? " collectives x " : " segments x ") << g.micro_batches
                << " micro-batches) in the predicted order in " << g.calls - g.off_schedule_calls
                << " of " << g.calls << " calls";
      if (g.by_micro_batch > 0) {
        std::cerr << " (" << g.by_micro_batch << " captured in a CUDA graph, issued micro-batch "
                  << "by micro-batch, the order kept by the schedule's stream waits)";
      }
      if (g.off_schedule_calls > 0) {
        std::cerr << (dual ? "; the others made another number of collectives"
                           : "; the others called its stage modules another number of times")
                  << " than the traced program";
      }
      std::cerr << "\n";
    }
  }
  if (!args.verify) return exit_code;
  char line[160];
  std::snprintf(line, sizeof(line), "verify: max_abs_diff=%.3g max_rel_diff=%.3g (%lld calls)",
                r.max_abs_diff, r.max_rel_diff, static_cast<long long>(r.verified_calls));
  std::cout << line << std::endl;
  if (r.verify_ok && r.verified_calls > 0) return exit_code;
  std::cerr << "verify: FAILED: " << (r.worst.empty() ? "no call ran the plan" : r.worst) << "\n";
  return exit_code == 0 ? 1 : exit_code;
}

int RunApply(const ApplyArgs& args) {
  Status plan = CheckPlan(args.plan);
  if (!plan.ok()) return Fail(plan);
  StatusOr<ApplyTools> tools = FindTools();
  if (!tools.ok()) return Fail(tools.status());
  StatusOr<std::string> report = MakeReportDir();
  if (!report.ok()) return Fail(report.status());

  StatusOr<ChildExit> child = RunChild(args.command, ChildEnvironment(args, *tools, *report));
  int exit_code = 1;
  if (!child.ok()) {
    exit_code = Fail(child.status());
  } else if (child->exec_errno != 0) {
    std::cerr << "dynaflow: " << ExecFailure(args.command[0], child->exec_errno) << "\n";
    exit_code = ExecExitCode(child->exec_errno);
  } else {
    exit_code = Summarize(args, *report, child->exit_code);
  }
  std::error_code ec;
  fs::remove_all(*report, ec);
  return exit_code;
}

}  // namespace

void AddApplyCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ApplyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "apply",
      "Run CMD (a PyTorch program, unmodified) with PLAN, the plan.json of `dynaflow advise "
      "--plan`: the modules it splits (for example every decoder layer) run their micro-batches "
      "concurrently through dynaflow's overlap runtime, per workload bucket. A plan that does "
      "not fit the program is refused with one line and the program runs unmodified; in a "
      "torch.distributed program a call refused at run time ends the plan only for its kind of "
      "calls of that module on that rank, and the ranks of a module's collectives agree on it "
      "at its first call of each kind. The exit code is CMD's.\nIn code: import dynaflow; "
      "model = dynaflow.apply(model, \"plan.json\").");
  cmd->add_option("PLAN", args->plan, "plan.json from `dynaflow advise --plan`")->required();
  cmd->footer(
      "Example: advise a traced run, then serve with the plan, checking its outputs:\n"
      "  dynaflow advise run.db --plan plan.json\n"
      "  dynaflow apply --verify plan.json -- python serve.py --batch 64");
  cmd->add_flag("--strict", args->strict,
                "A plan that does not fit the program ends it with exit code 2");
  cmd->add_flag("--verify", args->verify,
                "Run every planned call the original way too, print 'verify: max_abs_diff=... "
                "max_rel_diff=...', and exit 1 when they differ beyond the dtype's tolerance");
  cmd->add_flag("--no-graphs", args->no_graphs,
                "On CUDA, run every planned call eagerly instead of capturing each unit's "
                "schedule once per shape into a CUDA graph and replaying it (to compare the two)");
  cmd->add_option("CMD", args->command,
                  "The program and its arguments; after -- when they include options")
      ->required();
  cmd->final_callback([args, exit_code] { *exit_code = RunApply(*args); });
}

}  // namespace dynaflow
