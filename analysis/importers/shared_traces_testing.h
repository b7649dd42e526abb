// For tests that read the real traces beside the checkout (../shared/traces,
// whose README gives their provenance): where they are and which files import.
// The including test target defines DYNAFLOW_SOURCE_DIR. Header-only: tests
// of several libraries use it, none links another's testing library for it.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace dynaflow {

inline std::filesystem::path SharedTraces() {
  return std::filesystem::path(DYNAFLOW_SOURCE_DIR) / ".." / "shared" / "traces";
}

// The importable traces (Kineto JSON, Nsight Systems SQLite; not the
// TraceLens CSVs or READMEs), sorted. Empty when ../shared/traces is absent.
inline std::vector<std::filesystem::path> SharedTraceFiles() {
  namespace fs = std::filesystem;
  std::vector<fs::path> out;
  for (const char* dir : {"kineto", "nsys"}) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(SharedTraces() / dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.ends_with(".json.gz") || name.ends_with(".json") || name.ends_with(".sqlite")) {
        out.push_back(e.path());
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// "kineto/name.json.gz": how a test names a shared trace in its messages.
inline std::string SharedTraceName(const std::filesystem::path& file) {
  return file.parent_path().filename().string() + "/" + file.filename().string();
}

}  // namespace dynaflow
