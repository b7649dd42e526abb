// Small formatting helpers shared by the text and HTML reports.
#pragma once

#include <string>
#include <string_view>

namespace dynaflow {

// 0.42 -> "420 ns", 388.3 -> "388.3 us", 3496 -> "3.496 ms", 2.1e6 -> "2.100 s".
std::string FormatDuration(double us);

// Percentage of `part` in `whole` with one decimal, "-" when whole is zero.
std::string FormatPercent(double part, double whole);

// `s` with its control characters (U+0000..U+001F, U+007F) written as C
// escapes (\t, \n, \r, \xHH): a name from a trace cannot split a table row
// or put a NUL byte into a report.
std::string Printable(std::string_view s);

// Printable(s), cut to `width` characters with a trailing "...".
std::string Shorten(std::string_view s, size_t width);

}  // namespace dynaflow
