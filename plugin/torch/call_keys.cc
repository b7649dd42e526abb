#include "plugin/torch/call_keys.h"

#include <string>

#include <ATen/ATen.h>

#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

namespace py = pybind11;

namespace dynaflow {

namespace {

py::object DtypeOf(const at::Tensor& t) {
  return py::reinterpret_borrow<py::object>(
      reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type())));
}

py::object DeviceOf(const at::Tensor& t) {
  return py::reinterpret_steal<py::object>(THPDevice_New(t.device()));
}

}  // namespace

void CallKeys::AuditWalk(py::list& key, py::handle value, int64_t batch,
                         py::handle fallback) const {
  const RecursionGuard guard(" while keying a call's arguments");
  PyObject* v = value.ptr();
  // The order of _rows._walk_into.
  if (THPVariable_Check(v)) {
    const at::Tensor* t = PlainTensor(value);
    if (t == nullptr) {
      fallback(key, value, batch);
      return;
    }
    // (dtype, device type, dimensions, which dimensions past the rows are 1,
    // whether the first is the rows, 1 or another size: _rows._ROWS, ...)
    const int64_t dims = t->dim();
    py::tuple ones(dims > 0 ? dims - 1 : 0);
    for (int64_t d = 1; d < dims; ++d) ones[d - 1] = py::bool_(t->size(d) == 1);
    const int rows = dims == 0 ? 0 : t->size(0) == batch ? 1 : t->size(0) == 1 ? 2 : 0;
    key.append(py::make_tuple(DtypeOf(*t), c10::DeviceTypeName(t->device().type(), true), dims,
                              std::move(ones), rows));
    return;
  }
  if (v == Py_None || PyBool_Check(v) || PyUnicode_Check(v)) {
    key.append(value);
    return;
  }
  const int kept = PyObject_IsInstance(v, kept_types_.ptr());
  if (kept < 0) throw py::error_already_set();
  if (kept == 1) {
    key.append(value);
    return;
  }
  if (PyLong_Check(v) || PyFloat_Check(v)) {
    key.append(py::type::of(value));
    return;
  }
  if (PyTuple_CheckExact(v) || PyList_CheckExact(v)) {
    const py::tuple items = SequenceItems(value);
    key.append(py::make_tuple(py::type::of(value), items.size()));
    for (py::handle item : items) AuditWalk(key, item, batch, fallback);
    return;
  }
  if (PyDict_CheckExact(v)) {
    for (py::handle item : DictItems(value)) {
      const py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
      key.append(kv[0]);
      AuditWalk(key, kv[1], batch, fallback);
    }
    return;
  }
  fallback(key, value, batch);
}

py::tuple CallKeys::AuditKey(py::list key, py::handle args, py::handle kwargs, int64_t batch,
                             py::handle fallback) const {
  AuditWalk(key, args, batch, fallback);
  AuditWalk(key, kwargs, batch, fallback);
  return py::tuple(key);
}

// One flatten_inputs: where FlattenWalk appends, and what it hands back.
struct CallKeys::Flattening {
  py::handle flattening;
  py::list parts;
  py::list leaves;
  py::object leaf;  // the Leaf type
  int64_t batch = 0;
};

void CallKeys::FlattenWalk(Flattening& f, const ValuePath& path, py::handle value) const {
  const RecursionGuard guard(" while flattening a call's arguments");
  PyObject* v = value.ptr();
  // The order of _graphs._Flattening.walk. An exact tuple, list or dict is
  // never a dataclass or a state object.
  if (THPVariable_Check(v)) {
    const at::Tensor* t = PlainTensor(value);
    if (t == nullptr) {
      f.flattening.attr("walk")(value, path.Text());
      return;
    }
    // (whether it holds the rows, its shape without them, dtype, device)
    const bool rows = t->dim() >= 1 && t->size(0) == f.batch;
    const at::IntArrayRef sizes = rows ? t->sizes().slice(1) : t->sizes();
    py::tuple shape(sizes.size());
    for (size_t d = 0; d < sizes.size(); ++d) shape[d] = py::int_(sizes[d]);
    f.parts.append(py::make_tuple(rows, std::move(shape), DtypeOf(*t), DeviceOf(*t)));
    f.leaves.append(f.leaf(value, rows, path.Text(), false));
    return;
  }
  if (IsImmutable(value, immutable_types_)) {
    f.parts.append(py::make_tuple(py::type::of(value), value));
    return;
  }
  if (PyTuple_CheckExact(v) || PyList_CheckExact(v)) {
    const py::tuple items = SequenceItems(value);
    f.parts.append(py::make_tuple(py::type::of(value), items.size()));
    for (Py_ssize_t k = 0; k < static_cast<Py_ssize_t>(items.size()); ++k) {
      const ValuePath child{&path, nullptr, nullptr, k};
      FlattenWalk(f, child, items[k]);
    }
    return;
  }
  if (PyDict_CheckExact(v)) {
    const py::list items = DictItems(value);
    const py::tuple keys(py::reinterpret_borrow<py::object>(value));
    f.parts.append(py::make_tuple(py::type::of(value), keys));
    for (py::handle item : items) {
      const py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
      const ValuePath child{&path, nullptr, kv[0].ptr()};
      FlattenWalk(f, child, kv[1]);
    }
    return;
  }
  f.flattening.attr("walk")(value, path.Text());
}

void CallKeys::Flatten(py::handle flattening, py::tuple args, py::dict kwargs) const {
  Flattening f;
  f.flattening = flattening;
  f.parts = flattening.attr("parts");
  f.leaves = flattening.attr("leaves");
  f.leaf = flattening.attr("Leaf");
  f.batch = flattening.attr("batch").cast<int64_t>();
  for (size_t k = 0; k < args.size(); ++k) {
    const std::string name = "argument " + std::to_string(k);
    FlattenWalk(f, ValuePath{nullptr, &name}, args[k]);
  }
  for (py::handle item : DictItems(kwargs)) {
    const py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
    const std::string name = "argument " + py::str(kv[0]).cast<std::string>();
    FlattenWalk(f, ValuePath{nullptr, &name}, kv[1]);
  }
}

}  // namespace dynaflow
