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

std::string Printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7F) {
      out += c;
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", u);
      out += buf;
    }
  }
  return out;
}

std::string Shorten(std::string_view raw, size_t width) {
  const std::string s = Printable(raw);
  if (s.size() <= width) return s;
  return s.substr(0, width - 3) + "...";
}

}  // namespace dynaflow
