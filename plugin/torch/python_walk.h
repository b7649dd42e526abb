// What the C++ walks of a planned call's Python values share (call_split.h,
// call_keys.h): where a value sits in the call, named as the Python walks
// name it; Python's recursion limit; and which values pass as they are.
#pragma once

#include <Python.h>

#include <string>

#include <pybind11/pybind11.h>

namespace dynaflow {

// Where a value sits in a call: an argument's name (or "output"), then an
// index of a sequence or a key of a dict per level. Its text ("name[0]['k']",
// a key by its repr) is built only when asked for.
struct ValuePath {
  const ValuePath* parent = nullptr;
  const std::string* name = nullptr;  // the argument's, at the top
  PyObject* key = nullptr;            // a dict's key, else the index below
  Py_ssize_t index = 0;
  std::string Text() const;
};

// Python's recursion limit held in a walk, as the Python walks hold it: a
// value nested too deep, or holding itself, raises RecursionError instead of
// overflowing the C stack.
class RecursionGuard {
 public:
  explicit RecursionGuard(const char* where) {
    if (Py_EnterRecursiveCall(where) != 0) throw pybind11::error_already_set();
  }
  ~RecursionGuard() { Py_LeaveRecursiveCall(); }
  RecursionGuard(const RecursionGuard&) = delete;
  RecursionGuard& operator=(const RecursionGuard&) = delete;
};

// _split._is_immutable: None, Ellipsis, an int, float, complex, str or bytes
// (bool is an int), or an instance of `immutable_types` (a tuple of types).
bool IsImmutable(pybind11::handle value, pybind11::handle immutable_types);

}  // namespace dynaflow
