#include "plugin/preload/log.h"

#include <unistd.h>

#include <string>

namespace dynaflow {

void Log(std::string_view message) noexcept {
  try {
    const std::string line = "dynaflow: " + std::string(message) + "\n";
    ssize_t ignored = write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
  } catch (...) {
    // Out of memory while reporting: nothing better to do than stay quiet.
  }
}

void LogOnce(std::atomic<bool>& once, std::string_view message) noexcept {
  if (!once.exchange(true)) Log(message);
}

}  // namespace dynaflow
