#include <iostream>
#include <memory>

#include "analysis/store/store.h"
#include "cli/commands.h"

namespace dynaflow {
namespace {

struct ImportArgs {
  std::vector<std::string> inputs;
  std::string output;
};

int RunImport(const ImportArgs& args) {
  Trace trace;
  Status st = LoadInputs(args.inputs, &trace);
  if (!st.ok()) return Fail(st);
  st = WriteTraceDb(trace, args.output);
  if (!st.ok()) return Fail(st);
  std::cerr << "dynaflow: wrote " << args.output << ": " << trace.gpu.size()
            << " GPU activities, " << trace.ops.size() << " operators, " << trace.api.size()
            << " API calls\n";
  return 0;
}

}  // namespace

void AddImportCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ImportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "import", "Import traces into one trace.db (SQLite; schema in schemas/trace.sql).");
  cmd->add_option("IN", args->inputs, "Trace files; several Kineto rank files at once")
      ->required();
  cmd->add_option("-o,--output", args->output, "The trace.db to write (replaced if present)")
      ->required();
  cmd->final_callback([args, exit_code] { *exit_code = RunImport(*args); });
}

}  // namespace dynaflow
