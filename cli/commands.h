// One function per verb: each adds its subcommand to the app and, when the
// subcommand runs, stores the exit code in *exit_code (0 ok, 1 failure, 2 usage
// error or bad input). Verbs parse arguments and call libraries, nothing more.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "analysis/base/status.h"
#include "analysis/model/trace.h"

namespace dynaflow {

class RecordSink;

void AddImportCommand(CLI::App& app, int* exit_code);
void AddInfoCommand(CLI::App& app, int* exit_code);
void AddAdviseCommand(CLI::App& app, int* exit_code);
void AddTraceCommand(CLI::App& app, int* exit_code);
void AddExportCommand(CLI::App& app, int* exit_code);
void AddApplyCommand(CLI::App& app, int* exit_code);

// Shared by the verbs.

// Option checks for numbers: "must be >= 0" and "must be > 0" (CLI11 2.1's
// NonNegativeNumber and PositiveNumber print the largest double in full).
extern const CLI::Validator kNonNegative;
extern const CLI::Validator kPositive;

// Prints "dynaflow: <message>" on stderr and returns the status's exit code.
int Fail(const Status& status);

// Imports `inputs` into `trace`, with progress on stderr when it is a terminal
// ("importing NAME: 45%"). "-" is standard input.
// With `sink`, readers may hand records to it while reading (see reader.h).
Status LoadInputs(const std::vector<std::string>& inputs, Trace* trace,
                  RecordSink* sink = nullptr);

// On stderr when it is a terminal: "PHASE..." on the progress line, replacing
// what was there; "" clears the line. Nothing otherwise.
void ShowPhase(const std::string& phase);

// "PATH: cannot write: <errno's reason>", after a failed stream write.
Status CannotWrite(const std::string& path);

// Whether WriteOutput could write `path`, checked before any work: creates and
// removes the temporary file WriteOutput would write. BadInput naming the path
// and the reason (a missing directory, no permission) when not; "-", empty, and
// existing devices or FIFOs (written in place, not probed) pass.
Status CheckOutputPath(const std::string& path);

// Writes `text` to `path` through a temporary file, so a failure leaves no
// partial output; "-" or empty means stdout.
Status WriteOutput(const std::string& path, const std::string& text);

}  // namespace dynaflow
