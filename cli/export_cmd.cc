// dynaflow export IN... --format perfetto -o out.json
//
// Chrome-trace JSON in Kineto's conventions (reports/perfetto_export.h). A
// trace of one rank is one file; with several ranks each goes to its own file,
// out.json -> out.rank0.json, out.rank1.json, ... All files are written to
// temporaries first and renamed into place once all are complete, so a
// failure while writing leaves none.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "reports/perfetto_export.h"

namespace dynaflow {
namespace {

namespace fs = std::filesystem;

struct ExportArgs {
  std::vector<std::string> inputs;
  std::string format = "perfetto";
  std::string output;
};

// out.json -> out.rank3.json; a name without an extension gets one.
std::string RankPath(const std::string& output, int32_t rank) {
  fs::path p(output);
  const std::string ext = p.has_extension() ? p.extension().string() : ".json";
  return (p.parent_path() / (p.stem().string() + ".rank" + std::to_string(rank) + ext)).string();
}

// Writes rank's document to `tmp`, the temporary file of `path`.
Status WriteRank(const Trace& trace, int32_t rank, const std::string& tmp,
                 const std::string& path) {
  std::ofstream f(tmp, std::ios::binary);
  if (!f) return CannotWrite(path);
  WritePerfettoJson(trace, rank, f);
  f.close();
  return f ? Status::Ok() : CannotWrite(path);
}

int RunExport(const ExportArgs& args) {
  Trace trace;
  Status st = LoadInputs(args.inputs, &trace);
  if (!st.ok()) return Fail(st);
  std::vector<int32_t> ranks = TraceRanks(trace);
  if (ranks.empty()) ranks.push_back(0);  // an empty trace is still one document
  if (args.output == "-") {
    if (ranks.size() > 1) {
      return Fail(Status::BadInput("the trace has " + std::to_string(ranks.size()) +
                                   " ranks, one file each: -o must name a file"));
    }
    WritePerfettoJson(trace, ranks[0], std::cout);
    std::cout.flush();
    return std::cout ? 0 : Fail(Status::Failure("cannot write to stdout"));
  }

  std::vector<std::pair<std::string, std::string>> files;  // temporary, final
  for (int32_t rank : ranks) {
    const std::string path = ranks.size() == 1 ? args.output : RankPath(args.output, rank);
    files.emplace_back(path + ".tmp-" + std::to_string(getpid()), path);
    st = WriteRank(trace, rank, files.back().first, path);
    if (!st.ok()) break;
  }
  for (const auto& [tmp, path] : files) {
    std::error_code ec;
    if (st.ok()) fs::rename(tmp, path, ec);
    if (ec) st = Status::Failure(path + ": cannot write: " + ec.message());
    if (!st.ok()) std::remove(tmp.c_str());
  }
  if (!st.ok()) return Fail(st);
  for (const auto& [tmp, path] : files) std::cerr << "dynaflow: wrote " << path << "\n";
  return 0;
}

}  // namespace

void AddExportCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "export",
      "Write a trace as Chrome-trace JSON in Kineto's conventions, for Perfetto UI "
      "(ui.perfetto.dev), chrome://tracing and tools that read PyTorch profiler traces. "
      "Several ranks give one file per rank: out.json -> out.rank0.json, out.rank1.json...");
  cmd->add_option("IN", args->inputs, "Trace files or trace.db; - reads standard input")->required();
  cmd->footer(
      "Example: open a trace.db in Perfetto UI (ui.perfetto.dev, Open trace file):\n"
      "  dynaflow export run.db --format perfetto -o run.json");
  cmd->add_option("--format", args->format, "Output format")
      ->check(CLI::IsMember({"perfetto"}))
      ->capture_default_str();
  cmd->add_option("-o,--output", args->output, "The JSON file to write, - for stdout")->required();
  cmd->final_callback([args, exit_code] { *exit_code = RunExport(*args); });
}

}  // namespace dynaflow
