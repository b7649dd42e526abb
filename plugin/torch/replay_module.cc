// _dynaflow_replay: the C++ side of apply's planned calls
// (plugin/python/dynaflow/_apply.py, _graphs.py): ReplayStep's copies and
// ModuleSnapshot's comparison, the per-call work of a replay from a CUDA
// graph that Python would do tensor by tensor and attribute by attribute;
// CallSplitter, the walk of an eager planned call's arguments into its
// micro-batches' (_split.py); CallKeys, the walks that key a planned call
// (_rows.audit_key, _graphs.flatten_inputs); ModuleState, what such a call must leave
// unchanged in its modules (_split.py); UnitWalk and global_modes, what it
// checks of its unit's modules and of torch's settings (_split.check_module,
// _graphs._global_modes); and CallerState, the caller's torch state carried
// into each micro-batch.
//
// pybind11 with torch's type casters (torch/csrc/utils/pybind.h): a list of
// tensors crosses as std::vector<at::Tensor> without copying any data. A C++
// exception reaches Python as RuntimeError (c10::Error, std::runtime_error)
// or ValueError (std::invalid_argument).
#include <ATen/ThreadLocalState.h>
#include <torch/csrc/utils/pybind.h>

#include "plugin/torch/call_guards.h"
#include "plugin/torch/call_keys.h"
#include "plugin/torch/call_split.h"
#include "plugin/torch/module_snapshot.h"
#include "plugin/torch/module_state.h"
#include "plugin/torch/replay_step.h"

namespace py = pybind11;

PYBIND11_MODULE(_dynaflow_replay, m) {
  m.doc() = "dynaflow: the per-call work of a planned call replayed from a CUDA graph";

  // The copies run without the GIL, as torch's own operators do (the
  // arguments are converted before, the result after).
  using no_gil = py::call_guard<py::gil_scoped_release>;
  py::class_<dynaflow::ReplayStep>(m, "ReplayStep")
      .def(py::init<std::vector<at::Tensor>, std::vector<int64_t>, int64_t>(),
           py::arg("inputs"), py::arg("flags"), py::arg("padded"))
      .def_readonly_static("ROWS", &dynaflow::ReplayStep::kRows)
      .def_readonly_static("BOUND", &dynaflow::ReplayStep::kBound)
      .def("set_outputs", &dynaflow::ReplayStep::SetOutputs, py::arg("outputs"))
      .def("copy_in", &dynaflow::ReplayStep::CopyIn, py::arg("leaves"), py::arg("rows"),
           no_gil())
      .def("copy_out", &dynaflow::ReplayStep::CopyOut, py::arg("rows"), no_gil())
      .def_property_readonly("padded", &dynaflow::ReplayStep::padded);

  py::class_<dynaflow::TypeKinds>(m, "TypeKinds")
      .def(py::init<py::object>(), py::arg("kind_of"))
      .def("of", [](dynaflow::TypeKinds& k, py::handle v) { return static_cast<int>(k.Of(v.ptr())); },
           py::arg("value"));

  py::class_<dynaflow::ModuleSnapshot>(m, "ModuleSnapshot")
      .def(py::init<const py::sequence&, dynaflow::TypeKinds*, py::object>(),
           py::arg("modules"), py::arg("kinds").none(false), py::arg("tables"),
           py::keep_alive<1, 3>())  // the snapshot keeps its TypeKinds
      .def("same", &dynaflow::ModuleSnapshot::Same, py::arg("modules"))
      .def_property_readonly("objects", &dynaflow::ModuleSnapshot::objects)
      .def_property_readonly("tensors", &dynaflow::ModuleSnapshot::tensors);

  py::class_<dynaflow::CallSplitter>(m, "CallSplitter")
      .def(py::init<py::tuple, py::frozenset>(), py::arg("immutable_types"),
           py::arg("shared_names"))
      .def("split", &dynaflow::CallSplitter::Split, py::arg("splitter"), py::arg("names"),
           py::arg("args"), py::arg("kwargs"))
      .def("merge", &dynaflow::CallSplitter::Merge, py::arg("split"), py::arg("results"),
           py::arg("view_owner"), py::arg("fallback"));

  py::class_<dynaflow::CallKeys>(m, "CallKeys")
      .def(py::init<py::tuple, py::tuple>(), py::arg("immutable_types"), py::arg("kept_types"))
      .def("audit_key", &dynaflow::CallKeys::AuditKey, py::arg("key"), py::arg("args"),
           py::arg("kwargs"), py::arg("batch"), py::arg("fallback"))
      .def("flatten", &dynaflow::CallKeys::Flatten, py::arg("flattening"), py::arg("args"),
           py::arg("kwargs"));

  py::class_<dynaflow::UnitWalk>(m, "UnitWalk")
      .def(py::init<py::object, py::tuple>(), py::arg("module_type"), py::arg("flagged_types"))
      .def("walk", &dynaflow::UnitWalk::Walk, py::arg("unit"));
  m.def("global_modes", &dynaflow::GlobalModes);

  py::class_<dynaflow::ModuleState>(m, "ModuleState")
      .def(py::init<const py::sequence&, py::frozenset, py::object>(), py::arg("modules"),
           py::arg("tables"), py::arg("unchanged"))
      .def("check", &dynaflow::ModuleState::Check)
      .def_property_readonly("attributes", &dynaflow::ModuleState::attributes)
      .def_property_readonly("tensors", &dynaflow::ModuleState::tensors);

  // The calling thread's torch state, captured where a planned call starts:
  // grad and inference mode, autocast, torch function and dispatch modes,
  // saved-tensor hooks, functorch transforms, the profiler's thread-local
  // callbacks (at::ThreadLocalState, which torch itself carries into its
  // autograd and at::launch threads). run(fn) calls fn with that state set
  // and puts the thread's own back afterwards, whatever thread runs it: a
  // micro-batch on the runtime's worker computes what the caller's thread
  // would have.
  py::class_<at::ThreadLocalState>(m, "CallerState")
      .def(py::init<>())
      .def(
          "run",
          [](const at::ThreadLocalState& state, const py::function& fn) {
            at::ThreadLocalStateGuard guard(state);
            return fn();
          },
          py::arg("fn"));
}
