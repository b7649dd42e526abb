// The nn.Module forward calls in flight on each thread. The Python hooks
// (plugin/python/dynaflow) push and pop qualified module names; the operator
// recorder reads the innermost one as the module path of each operator.
#pragma once

#include <cstddef>
#include <string_view>

namespace dynaflow {

// A copy of `path` that lives until the process exits, the same pointer for
// equal strings. Distinct module names are few, so the table only grows.
// Thread-safe.
const char* InternModulePath(std::string_view path);

// Enters a module on the calling thread; `interned` comes from InternModulePath.
void PushModule(const char* interned);

// Leaves the innermost module of the calling thread; no-op outside any module.
void PopModule();

// The innermost module of the calling thread, nullptr outside any module.
const char* CurrentModulePath();

// How many modules the calling thread is inside.
size_t ModuleDepth();

}  // namespace dynaflow
