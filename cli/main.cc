// The dynaflow command: each verb lives in its own file (cli/*_cmd.cc).
#include <iostream>
#include <string>

#include "cli/commands.h"

namespace {

// " import, info, ...": the verbs, for the message about an unknown one.
std::string KnownCommands(CLI::App& app) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    names += (names.empty() ? " " : ", ") + sub->get_name();
  }
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "dynaflow: finds where your GPUs sit idle and which intra-device parallelism would "
      "recover that time.\n\nInputs (IN) are Kineto/PyTorch-profiler JSON (.json, .json.gz), "
      "Nsight Systems SQLite exports (nsys export --type sqlite) or dynaflow trace.db files; "
      "the format is detected from the content. Exit codes: 0 ok, 1 failure, 2 usage error "
      "or bad input."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dynaflow 0.1.0");
  int exit_code = 2;
  dynaflow::AddImportCommand(app, &exit_code);
  dynaflow::AddInfoCommand(app, &exit_code);
  dynaflow::AddAdviseCommand(app, &exit_code);
  dynaflow::AddTraceCommand(app, &exit_code);
  dynaflow::AddExportCommand(app, &exit_code);
  dynaflow::AddApplyCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    if (argc == 1) {  // no verb at all: what there is to run
      std::cerr << app.help();
      return 2;
    }
    if (app.get_subcommands().empty() && argv[1][0] != '-') {
      std::cerr << "dynaflow: unknown command '" << argv[1] << "'; the commands are"
                << KnownCommands(app) << " (dynaflow --help)\n";
      return 2;
    }
    app.exit(e);
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dynaflow: internal error: " << e.what() << "\n";
    return 1;
  }
  return exit_code;
}
