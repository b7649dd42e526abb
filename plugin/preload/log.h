// Diagnostics of a library that runs inside someone else's process: one line
// on stderr, prefixed "dynaflow:", and each kind of problem reported once.
#pragma once

#include <atomic>
#include <string_view>

namespace dynaflow {

// Writes "dynaflow: <message>\n" to stderr in one write(2), so that lines
// of concurrent processes do not interleave. Any thread; never throws.
void Log(std::string_view message) noexcept;

// Log()s unless `once` is already set, and sets it.
void LogOnce(std::atomic<bool>& once, std::string_view message) noexcept;

}  // namespace dynaflow
