// For tests that read the traces dynaflow captured on a GPU machine
// (tests/data, whose README gives their provenance). The including test
// target defines DYNAFLOW_SOURCE_DIR. Header-only, as shared_traces_testing.h.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "analysis/importers/reader.h"

namespace dynaflow {

// tests/data/`name` read through the importers; a failed read fails the test.
inline Trace LoadCapturedTrace(const std::string& name) {
  const std::string path =
      (std::filesystem::path(DYNAFLOW_SOURCE_DIR) / "tests" / "data" / name).string();
  Trace trace;
  const Status st = ImportFiles({path}, {}, &trace);
  EXPECT_TRUE(st.ok()) << path << ": " << st.message();
  return trace;
}

}  // namespace dynaflow
