#include "plugin/torch/python_walk.h"

#include <torch/csrc/autograd/python_variable.h>

namespace py = pybind11;

namespace dynaflow {

std::string ValuePath::Text() const {
  if (parent == nullptr) return *name;
  std::string text = parent->Text() + "[";
  text += key != nullptr ? py::repr(key).cast<std::string>() : std::to_string(index);
  return text + "]";
}

bool IsImmutable(py::handle value, py::handle immutable_types) {
  PyObject* v = value.ptr();
  if (v == Py_None || v == Py_Ellipsis || PyLong_Check(v) || PyFloat_Check(v) ||
      PyComplex_Check(v) || PyUnicode_Check(v) || PyBytes_Check(v)) {
    return true;
  }
  const int is = PyObject_IsInstance(v, immutable_types.ptr());
  if (is < 0) throw py::error_already_set();
  return is == 1;
}

const at::Tensor* PlainTensor(py::handle value) {
  if (!THPVariable_CheckExact(value.ptr())) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(value.ptr());
  if (t.layout() != at::kStrided || t.is_nested()) return nullptr;
  return &t;
}

py::tuple SequenceItems(py::handle sequence) {
  if (PyTuple_CheckExact(sequence.ptr())) return py::reinterpret_borrow<py::tuple>(sequence);
  return py::tuple(py::reinterpret_borrow<py::object>(sequence));
}

py::list DictItems(py::handle dict) {
  if (!PyDict_CheckExact(dict.ptr())) return py::list(dict.attr("items")());
  PyObject* items = PyDict_Items(dict.ptr());
  if (items == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::list>(items);
}

py::object Interned(const char* name) {
  PyObject* s = PyUnicode_InternFromString(name);
  if (s == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(s);
}

py::object Attr(py::handle value, const py::object& name) {
  PyObject* a = PyObject_GetAttr(value.ptr(), name.ptr());
  if (a == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(a);
}

}  // namespace dynaflow
