// What a planned call checks on every call before it splits or replays
// (hooks come and go, settings change), in C++:
// - UnitWalk: the unit's submodules, as nn.Module.named_modules lists them,
//   and which of them _split.check_module must look at in Python. In Python
//   the walk alone cost about 1 ms per call of a 418-module unit, as a
//   decoder stack split as one region is (docs/performance.md).
// - GlobalModes: torch's global settings that change what a call's kernels
//   do (_graphs._global_modes), part of a replayed call's graph key.
// The GIL is held throughout.
#pragma once

#include <Python.h>

#include <array>
#include <unordered_set>

#include <pybind11/pybind11.h>

namespace dynaflow {

class UnitWalk {
 public:
  // `module_type`: torch.nn.Module; `flagged_types`: the types whose
  // instances check_module looks at whatever their hooks (a lazy module, a
  // module that computes across the rows of its batch), each of metaclass
  // `type` (std::invalid_argument otherwise).
  UnitWalk(pybind11::object module_type, pybind11::tuple flagged_types);

  // (pairs, flagged), or None.
  // - `pairs`: list(unit.named_modules()), the same (name, module) tuples in
  //   the same order (pre-order, children in their _modules order, a module
  //   reached twice listed once, None children skipped).
  // - `flagged`: the indices into `pairs` of the modules where check_module
  //   could refuse the call outside a CUDA graph capture: instances of
  //   `flagged_types` (and any module whose type answers __class__ itself),
  //   and modules other than the unit with a forward or backward hook of
  //   their own, or whose hook dicts cannot be read.
  // None where C++ cannot be sure to list what named_modules would: a
  // module whose type hashes or reads its attributes its own way
  // (__hash__, __getattribute__), whose named_modules is not nn.Module's
  // (on its type or its instance), a _modules that is not an exact dict,
  // a child that is not an nn.Module or is named by a str subclass. The
  // caller then walks in Python. No Python code of the model runs in the
  // walk. RecursionError where named_modules would raise it, or one level
  // of modules before (Python counts a generator's frames its own way).
  pybind11::object Walk(pybind11::handle unit) const;

 private:
  // Whether C++ reads `module` as named_modules would (above).
  bool ReadAsPythonWould(PyObject* module) const;
  // False where the walk must be left to Python.
  bool WalkInto(pybind11::handle module, pybind11::handle name, int depth, pybind11::list& pairs,
                pybind11::list& flagged, std::unordered_set<PyObject*>& seen) const;
  bool Flagged(PyObject* module, bool unit) const;

  pybind11::object module_type_;
  pybind11::object named_modules_;  // nn.Module.named_modules
  pybind11::tuple flagged_types_;
  // Interned attribute names, and ".".
  pybind11::object named_modules_name_;
  pybind11::object modules_name_;
  std::array<pybind11::object, 4> hook_names_;  // forward pre-, forward, backward pre-, backward
  pybind11::object dot_;
  // object's own __getattribute__ and __class__ (borrowed: object lives on).
  PyObject* object_getattribute_;
  PyObject* object_class_;
  pybind11::object getattribute_name_;
  pybind11::object class_name_;
};

// A value equal for two calls exactly when these settings are the same:
// the dtype of each enabled autocast (CPU, CUDA) and autocast's cache, the
// default dtype, float32 matmul precision, TF32 in cuBLAS and cuDNN,
// cuBLAS's reduced-precision reductions (fp16, bf16) and fp16 accumulation,
// the scaled-dot-product attention backends enabled (flash,
// memory-efficient, math, cuDNN), deterministic algorithms and whether they
// only warn. The settings of CUDA kernels: a graph holds no other (oneDNN's
// precision, for the CPU, is left out).
pybind11::tuple GlobalModes();

}  // namespace dynaflow
