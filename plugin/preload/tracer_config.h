// The tracer's settings, read from the environment of the traced process
// (set by `dynaflow trace`).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dynaflow {

struct TracerConfig {
  std::string output_dir;  // DYNAFLOW_OUTPUT_DIR; empty: the tracer does nothing
  bool record_ops = true;  // DYNAFLOW_OPS=on|off
  std::chrono::nanoseconds delay{0};     // DYNAFLOW_DELAY_S: recording starts this late
  std::chrono::nanoseconds duration{0};  // DYNAFLOW_DURATION_S: and lasts this long; 0: to exit
  std::chrono::milliseconds flush_interval{1000};  // DYNAFLOW_FLUSH_MS
  int32_t rank = 0;        // DYNAFLOW_RANK, else RANK (torchrun's), else 0
  std::string cupti_path;  // DYNAFLOW_CUPTI_PATH: libcupti to try first
};

// Reads the variables above through `getenv`. A malformed value keeps its
// default and adds one line about it to `problems`.
TracerConfig ReadTracerConfig(const std::function<const char*(const char*)>& getenv,
                              std::vector<std::string>* problems);

}  // namespace dynaflow
