// Running a user's command under dynaflow (`trace`, `apply`): its
// environment, signal forwarding while it runs, and its exit code as a
// shell reports it.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "analysis/base/status.h"

namespace dynaflow {

// The directory of the running dynaflow binary (its tools are found from it).
std::filesystem::path BinaryDir();

// The environment variable `name` when set and non-empty, else `fallback`.
std::string EnvOr(const char* name, const std::filesystem::path& fallback);

// This process's environment as name=value strings.
std::vector<std::string> CurrentEnvironment();

// `name=value` prepended to the colon-separated list already in `env`.
void PrependEnv(std::vector<std::string>* env, const std::string& name, const std::string& value);

// `name=value` in `env`, replacing any value there.
void ReplaceEnv(std::vector<std::string>* env, const std::string& name, const std::string& value);

struct ChildExit {
  // The child's exit code, or 128+N when signal N killed it.
  int exit_code = 0;
  // Why the command could not be executed (errno of exec); 0 when it ran.
  int exec_errno = 0;
};

// Runs `command` (searched on PATH) with `env` and waits for it. SIGINT,
// SIGTERM and SIGHUP sent to dynaflow by another process are forwarded to the
// child; a terminal's Ctrl-C reaches it directly. Failure when it cannot fork.
StatusOr<ChildExit> RunChild(std::vector<std::string> command, std::vector<std::string> env);

// "CMD: command not found" or the errno's text, for a command that did not run;
// its shell-style exit code is ExecExitCode.
std::string ExecFailure(const std::string& program, int err);
int ExecExitCode(int err);

}  // namespace dynaflow
