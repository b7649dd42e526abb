#include "plugin/torch/python_walk.h"

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

}  // namespace dynaflow
