// The keys a planned call is looked up by, walked in C++: the audit key of
// its kind (plugin/python/dynaflow/_rows.py: audit_key) on every planned
// call, and the graph key with its tensors (_graphs.py: flatten_inputs) on
// every call replayed from a CUDA graph. In Python the two walks cost more
// than a replayed call's other per-call work together (docs/performance.md).
//
// Contract: the result is the Python walk's, value for value (equal keys,
// the same tensors, the same names). C++ takes only the cases whose outcome
// it knows for certain and hands every other value to the Python walk,
// which appends its own part:
// - an exact torch.Tensor or nn.Parameter, strided and not nested (a
//   subclass may answer dtype and shape in Python);
// - the values either walk keeps as they are (None, bool, str, ..., below);
// - an exact tuple, list or dict (a subclass may iterate otherwise), whose
//   items are walked.
// The GIL is held throughout. What Python raises (RecursionError past
// Python's recursion limit, NoGraph from the fallback) propagates as
// pybind11::error_already_set.
#pragma once

#include <Python.h>

#include <cstdint>

#include <pybind11/pybind11.h>

#include "plugin/torch/python_walk.h"

namespace dynaflow {

class CallKeys {
 public:
  // `immutable_types`: as CallSplitter's (flatten_inputs keeps those
  // values); `kept_types`: what audit_key keeps as itself besides None, bool
  // and str (enum.Enum, torch.dtype, torch.device).
  CallKeys(pybind11::tuple immutable_types, pybind11::tuple kept_types)
      : immutable_types_(std::move(immutable_types)), kept_types_(std::move(kept_types)) {}

  // audit_key: `key` (a list holding the call's head: the module's mode,
  // grad, ...) with the walk of `args` and then `kwargs` appended, as a
  // tuple; a tensor's first dimension is told apart as the call's `batch`
  // rows, 1, or another size. What C++ does not take goes to
  // `fallback(key, value, batch)` (_rows._walk_into), which appends its part.
  pybind11::tuple AuditKey(pybind11::list key, pybind11::handle args, pybind11::handle kwargs,
                           int64_t batch, pybind11::handle fallback) const;

  // flatten_inputs: walks the arguments into `flattening` (a
  // _graphs._Flattening: its `parts` and `leaves` lists, `batch`, `Leaf`
  // type, and `walk(value, where)` for what C++ does not take).
  void Flatten(pybind11::handle flattening, pybind11::tuple args, pybind11::dict kwargs) const;

 private:
  struct Flattening;

  void AuditWalk(pybind11::list& key, pybind11::handle value, int64_t batch,
                 pybind11::handle fallback) const;
  void FlattenWalk(Flattening& f, const ValuePath& path, pybind11::handle value) const;

  pybind11::tuple immutable_types_;
  pybind11::tuple kept_types_;
};

}  // namespace dynaflow
