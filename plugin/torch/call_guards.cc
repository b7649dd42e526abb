#include "plugin/torch/call_guards.h"

#include <stdexcept>
#include <unordered_set>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DefaultDtype.h>

#include "plugin/torch/python_walk.h"

namespace py = pybind11;

namespace dynaflow {

namespace {

// Whether `module`'s hook dict `name` is a dict holding a hook, or cannot
// be read as one (check_module then raises what Python raises).
bool HasHooks(PyObject* module, PyObject* name) {
  PyObject* hooks = PyObject_GetAttr(module, name);
  if (hooks == nullptr) {
    PyErr_Clear();
    return true;
  }
  const bool has = !PyDict_Check(hooks) || PyDict_GET_SIZE(hooks) != 0;
  Py_DECREF(hooks);
  return has;
}

}  // namespace

UnitWalk::UnitWalk(py::object module_type, py::tuple flagged_types)
    : module_type_(std::move(module_type)),
      named_modules_(module_type_.attr("named_modules")),
      flagged_types_(std::move(flagged_types)),
      named_modules_name_(Interned("named_modules")),
      modules_name_(Interned("_modules")),
      hook_names_{Interned("_forward_pre_hooks"), Interned("_forward_hooks"),
                  Interned("_backward_pre_hooks"), Interned("_backward_hooks")},
      dot_(Interned(".")),
      object_getattribute_(PyDict_GetItemString(PyBaseObject_Type.tp_dict, "__getattribute__")),
      object_class_(PyDict_GetItemString(PyBaseObject_Type.tp_dict, "__class__")),
      getattribute_name_(Interned("__getattribute__")),
      class_name_(Interned("__class__")) {
  if (!PyType_Check(module_type_.ptr())) throw std::invalid_argument("module_type: not a type");
  for (const py::handle t : flagged_types_) {
    // isinstance of a type whose metaclass is `type` is a subtype test.
    if (!Py_IS_TYPE(t.ptr(), &PyType_Type)) {
      throw std::invalid_argument("flagged_types: a type whose metaclass is not type");
    }
  }
}

py::object UnitWalk::Walk(py::handle unit) const {
  py::list pairs;
  py::list flagged;
  std::unordered_set<PyObject*> seen;  // alive: `pairs` holds each
  if (!WalkInto(unit, py::str(""), /*depth=*/0, pairs, flagged, seen)) return py::none();
  return py::make_tuple(std::move(pairs), std::move(flagged));
}

bool UnitWalk::ReadAsPythonWould(PyObject* m) const {
  PyTypeObject* type = Py_TYPE(m);
  // named_modules' memo is a set: identity, unless the type hashes otherwise.
  if (type->tp_hash != PyBaseObject_Type.tp_hash) return false;
  // Its attributes (_modules, the hook dicts) read by object.__getattribute__.
  if (_PyType_Lookup(type, getattribute_name_.ptr()) != object_getattribute_) return false;
  // m.named_modules, which named_modules recurses through: nn.Module's, on m
  // (not overridden by its type nor set on the instance).
  const py::object bound = py::reinterpret_steal<py::object>(
      PyObject_GetAttr(m, named_modules_name_.ptr()));
  if (!bound) {
    PyErr_Clear();
    return false;
  }
  PyObject* b = bound.ptr();
  return PyMethod_Check(b) && PyMethod_GET_FUNCTION(b) == named_modules_.ptr() &&
         PyMethod_GET_SELF(b) == m;
}

bool UnitWalk::WalkInto(py::handle module, py::handle name, int depth, py::list& pairs,
                        py::list& flagged, std::unordered_set<PyObject*>& seen) const {
  const RecursionGuard guard(" while walking a unit's modules");
  PyObject* m = module.ptr();
  if (!ReadAsPythonWould(m)) return false;
  if (!seen.insert(m).second) return true;
  if (Flagged(m, depth == 0)) flagged.append(py::int_(py::len(pairs)));
  pairs.append(py::make_tuple(name, module));
  const py::object children = py::reinterpret_steal<py::object>(
      PyObject_GetAttr(m, modules_name_.ptr()));
  if (!children || !PyDict_CheckExact(children.ptr())) {
    PyErr_Clear();
    return false;
  }
  // A copy of the items: what named_modules iterates live is the same, as
  // no Python code runs in the walk (no __class__, __instancecheck__ or
  // __getattribute__ of the model's is called).
  const py::list items = DictItems(children);
  const bool no_prefix = PyUnicode_GET_LENGTH(name.ptr()) == 0;
  for (const py::handle item : items) {
    const py::handle child = PyTuple_GET_ITEM(item.ptr(), 1);
    if (child.is_none()) continue;
    const py::handle key = PyTuple_GET_ITEM(item.ptr(), 0);
    if (!PyObject_TypeCheck(child.ptr(), reinterpret_cast<PyTypeObject*>(module_type_.ptr())) ||
        !PyUnicode_CheckExact(key.ptr())) {
      return false;
    }
    // named_modules' prefix + ('.' if prefix else '') + name
    py::object path = py::reinterpret_borrow<py::object>(key);
    if (!no_prefix) {
      const py::object dotted = py::reinterpret_steal<py::object>(
          PyUnicode_Concat(name.ptr(), dot_.ptr()));
      if (!dotted) throw py::error_already_set();
      path = py::reinterpret_steal<py::object>(PyUnicode_Concat(dotted.ptr(), key.ptr()));
      if (!path) throw py::error_already_set();
    }
    if (!WalkInto(child, path, depth + 1, pairs, flagged, seen)) return false;
  }
  return true;
}

bool UnitWalk::Flagged(PyObject* module, bool unit) const {
  PyTypeObject* type = Py_TYPE(module);
  // A type that answers __class__ itself: isinstance is left to Python.
  if (_PyType_Lookup(type, class_name_.ptr()) != object_class_) return true;
  for (const py::handle t : flagged_types_) {
    if (PyType_IsSubtype(type, reinterpret_cast<PyTypeObject*>(t.ptr()))) return true;
  }
  // The unit's own hooks run once, around the whole planned call.
  if (unit) return false;
  for (const py::object& hooks : hook_names_) {
    if (HasHooks(module, hooks.ptr())) return true;
  }
  return false;
}

py::tuple GlobalModes() {
  const auto autocast = [](at::DeviceType device) {
    return at::autocast::is_autocast_enabled(device)
               ? static_cast<int>(at::autocast::get_autocast_dtype(device))
               : -1;
  };
  at::Context& c = at::globalContext();
  return py::make_tuple(autocast(at::kCPU), autocast(at::kCUDA),
                        at::autocast::is_autocast_cache_enabled(),
                        static_cast<int>(c10::get_default_dtype_as_scalartype()),
                        static_cast<int>(c.float32MatmulPrecision()), c.allowTF32CuBLAS(),
                        c.allowTF32CuDNN(), static_cast<int>(c.allowFP16ReductionCuBLAS()),
                        static_cast<int>(c.allowBF16ReductionCuBLAS()),
                        c.allowFP16AccumulationCuBLAS(), c.userEnabledFlashSDP(),
                        c.userEnabledMemEfficientSDP(), c.userEnabledMathSDP(),
                        c.userEnabledCuDNNSDP(), c.deterministicAlgorithms(),
                        c.deterministicAlgorithmsWarnOnly());
}

}  // namespace dynaflow
