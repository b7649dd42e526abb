#include "reports/format.h"

#include <cstdio>

namespace dynaflow {

std::string FormatDuration(double us) {
  char buf[64];
  if (us < 1.0) {
    std::snprintf(buf, sizeof buf, "%.0f ns", us * 1000.0);
  } else if (us < 1000.0) {
    std::snprintf(buf, sizeof buf, "%.1f us", us);
  } else if (us < 1e6) {
    std::snprintf(buf, sizeof buf, "%.3f ms", us / 1000.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.3f s", us / 1e6);
  }
  return buf;
}

std::string FormatPercent(double part, double whole) {
  if (whole <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * part / whole);
  return buf;
}

std::string Shorten(std::string_view s, size_t width) {
  if (s.size() <= width) return std::string(s);
  return std::string(s.substr(0, width - 3)) + "...";
}

}  // namespace dynaflow
