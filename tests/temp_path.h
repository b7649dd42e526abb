// Scratch file names for the unit tests.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace dynaflow {

// <temp dir>/dynaflow-<pid>-<name>. The pid keeps tests that ctest runs in
// parallel (one process each) apart; NAME carries the extension, if any. The
// caller removes the file.
inline std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("dynaflow-" + std::to_string(getpid()) + "-" + name))
      .string();
}

}  // namespace dynaflow
