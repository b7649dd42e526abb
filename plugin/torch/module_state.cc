#include "plugin/torch/module_state.h"

#include <algorithm>
#include <functional>
#include <map>
#include <utility>

#include <torch/csrc/autograd/python_variable.h>

#include "plugin/torch/python_walk.h"

namespace py = pybind11;

namespace dynaflow {
namespace {

// The attribute names read of every module, interned once (never freed: a
// static's destructor would run after the interpreter is gone).
struct Names {
  py::object dict = Interned("__dict__");
  py::object buffers = Interned("_buffers");
  py::object parameters = Interned("_parameters");
};

const Names& AttributeNames() {
  static const Names* const names = new Names();
  return *names;
}

// _split._MODIFIED.
constexpr const char* kModified =
    "is shared by the micro-batches and was modified in place: the split result would be wrong";

bool IsScalar(PyObject* v) {
  PyTypeObject* t = Py_TYPE(v);
  return v == Py_None || t == &PyBool_Type || t == &PyLong_Type || t == &PyFloat_Type ||
         t == &PyComplex_Type || t == &PyUnicode_Type || t == &PyBytes_Type;
}

bool Equal(PyObject* a, PyObject* b) {
  const int eq = PyObject_RichCompareBool(a, b, Py_EQ);
  if (eq < 0) throw py::error_already_set();
  return eq == 1;
}

std::vector<py::object> Items(py::handle iterable) {
  std::vector<py::object> items;
  for (py::handle item : iterable) items.push_back(py::reinterpret_borrow<py::object>(item));
  return items;
}

// dict.get(key): a borrowed value, or nullptr.
PyObject* Get(py::handle dict, py::handle key) {
  if (!PyDict_Check(dict.ptr())) return nullptr;
  PyObject* v = PyDict_GetItemWithError(dict.ptr(), key.ptr());
  if (v == nullptr && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

}  // namespace

bool ModuleState::Attribute::Same(const Attribute& o) const {
  if (type != o.type || kind != o.kind) return false;
  const auto same_addresses = [](const std::vector<py::object>& a,
                                 const std::vector<py::object>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                      [](const py::object& x, const py::object& y) { return x.ptr() == y.ptr(); });
  };
  switch (kind) {
    case kScalar:
      return Equal(value.ptr(), o.value.ptr());
    case kLength:
      return length == o.length;
    case kDict:
      if (length != o.length || keys.size() != o.keys.size()) return false;
      for (size_t k = 0; k < keys.size(); ++k) {
        if (!Equal(keys[k].ptr(), o.keys[k].ptr())) return false;
      }
      return same_addresses(entries, o.entries);
    case kList:
    case kSet:
      return length == o.length && same_addresses(entries, o.entries);
    case kIdentity:
      return value.ptr() == o.value.ptr();
  }
  return false;
}

ModuleState::ModuleState(const py::sequence& modules, py::frozenset tables, py::object unchanged)
    : tables_(std::move(tables)), unchanged_(std::move(unchanged)) {
  // Looked up once: a constructor per planned call.
  static PyObject* const ordered_dict =
      py::object(py::module_::import("collections").attr("OrderedDict")).release().ptr();
  ordered_dict_ = ordered_dict;
  const Names& n = AttributeNames();
  for (py::handle pair : modules) {
    const py::tuple path_module = py::reinterpret_borrow<py::tuple>(pair);
    Module m{path_module[0], path_module[1], attributes_.size(), 0};
    const py::object attributes = Attr(m.module, n.dict);
    std::vector<py::object> tensor_names;
    Take(attributes, &attributes_, &tensor_names);
    m.end = attributes_.size();
    const size_t owner = modules_.size();
    modules_.push_back(std::move(m));
    const py::dict tables_of[] = {Attr(modules_.back().module, n.buffers),
                                  Attr(modules_.back().module, n.parameters)};
    py::dict tensor_attributes;
    for (const py::object& name : tensor_names) tensor_attributes[name] = attributes[name];
    const std::pair<const char*, const py::dict*> kinds[] = {
        {"buffer", &tables_of[0]}, {"parameter", &tables_of[1]},
        {"attribute", &tensor_attributes}};
    for (const auto& [kind, table] : kinds) {
      for (py::handle item : DictItems(*table)) {
        const py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
        if (kv[1].is_none()) continue;
        Tensor t;
        t.owner = owner;
        t.kind = kind;
        t.name = kv[0];
        t.tensor = kv[1];
        if (THPVariable_Check(t.tensor.ptr())) {
          const at::Tensor& tensor = THPVariable_Unpack(t.tensor.ptr());
          if (!tensor.is_inference()) {
            t.versioned = true;
            t.version = tensor._version();
          } else if (std::string(kind) == "buffer") {
            t.unchanged = unchanged_(t.tensor);
          }
        }
        tensors_.push_back(std::move(t));
      }
    }
  }
}

void ModuleState::Take(const py::object& attributes, std::vector<Attribute>* out,
                       std::vector<py::object>* tensor_names) const {
  const auto take = [&](PyObject* name, PyObject* value) {
    out->push_back(TakeOne(name, value));
    // issubclass(type(value), torch.Tensor), as _python_state asks it.
    if (tensor_names != nullptr && out->back().kind == Attribute::kIdentity &&
        PyType_IsSubtype(Py_TYPE(value), reinterpret_cast<PyTypeObject*>(THPVariableClass))) {
      tensor_names->push_back(py::reinterpret_borrow<py::object>(name));
    }
  };
  if (!PyDict_CheckExact(attributes.ptr())) {
    for (py::handle item : DictItems(attributes)) {
      const py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
      take(kv[0].ptr(), kv[1].ptr());
    }
    return;
  }
  // Walked in place: taking an attribute runs no Python code (builtin
  // containers' sizes and items, a frozenset lookup of a str), so nothing
  // changes the dict meanwhile.
  Py_ssize_t pos = 0;
  PyObject *name, *value;
  while (PyDict_Next(attributes.ptr(), &pos, &name, &value)) take(name, value);
}

ModuleState::Attribute ModuleState::TakeOne(py::handle name, py::handle value) const {
  Attribute a;
  a.name = py::reinterpret_borrow<py::object>(name);
  PyObject* v = value.ptr();
  a.type = Py_TYPE(v);
  if (IsScalar(v)) {
    a.kind = Attribute::kScalar;
    a.value = py::reinterpret_borrow<py::object>(value);
    return a;
  }
  const bool dict = a.type == &PyDict_Type ||
                    reinterpret_cast<PyObject*>(a.type) == ordered_dict_;
  if (!dict && a.type != &PyList_Type && a.type != &PySet_Type) {
    a.kind = Attribute::kIdentity;
    a.value = py::reinterpret_borrow<py::object>(value);
    return a;
  }
  a.length = PyObject_Size(v);
  if (a.length < 0) throw py::error_already_set();
  if (a.length == 0 || tables_.contains(name)) {
    a.kind = Attribute::kLength;
    return a;
  }
  if (dict) {
    a.kind = Attribute::kDict;
    for (py::handle item : DictItems(value)) {
      const py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
      a.keys.push_back(kv[0]);
      a.entries.push_back(kv[1]);
    }
  } else {
    a.kind = a.type == &PyList_Type ? Attribute::kList : Attribute::kSet;
    a.entries = Items(value);
    if (a.kind == Attribute::kSet) {
      std::sort(a.entries.begin(), a.entries.end(), [](const py::object& x, const py::object& y) {
        return std::less<PyObject*>()(x.ptr(), y.ptr());
      });
    }
  }
  return a;
}

std::string ModuleState::Where(size_t module, const py::object& name) const {
  const std::string path = py::str(modules_[module].path);
  const std::string n = py::str(name);
  return path.empty() ? n : path + "." + n;
}

std::string ModuleState::FirstChange(size_t module, const std::vector<Attribute>& after) const {
  const Module& m = modules_[module];
  std::map<std::string, const Attribute*> before_by_name, after_by_name;
  std::vector<std::string> names;
  for (size_t k = m.first; k < m.end; ++k) {
    names.push_back(py::str(attributes_[k].name));
    before_by_name[names.back()] = &attributes_[k];
  }
  for (const Attribute& a : after) {
    names.push_back(py::str(a.name));
    after_by_name[names.back()] = &a;
  }
  for (const std::string& name : names) {
    const auto b = before_by_name.find(name);
    const auto a = after_by_name.find(name);
    if (b == before_by_name.end() || a == after_by_name.end() || !b->second->Same(*a->second)) {
      return name;
    }
  }
  return "";
}

std::string ModuleState::Check() const {
  const Names& n = AttributeNames();
  for (const Tensor& t : tensors_) {
    const Module& m = modules_[t.owner];
    const std::string kind = t.kind;
    const py::object table = Attr(m.module, kind == "buffer"      ? n.buffers
                                            : kind == "parameter" ? n.parameters
                                                                  : n.dict);
    if (Get(table, t.name) != t.tensor.ptr()) {
      return kind + " " + Where(t.owner, t.name) +
             " is shared by the micro-batches and was replaced: the split result would be wrong";
    }
    const bool modified = t.versioned
                              ? THPVariable_Unpack(t.tensor.ptr())._version() != t.version
                              : t.unchanged && !py::bool_(t.unchanged(t.tensor));
    if (modified) return kind + " " + Where(t.owner, t.name) + " " + kModified;
  }
  for (size_t i = 0; i < modules_.size(); ++i) {
    const Module& m = modules_[i];
    const py::object attributes = Attr(m.module, n.dict);
    if (TakenAlike(m, attributes.ptr())) continue;
    std::vector<Attribute> after;
    Take(attributes, &after, nullptr);
    bool same = after.size() == m.end - m.first;
    for (size_t k = 0; same && k < after.size(); ++k) {
      const Attribute& b = attributes_[m.first + k];
      same = Equal(b.name.ptr(), after[k].name.ptr()) && b.Same(after[k]);
    }
    if (same) continue;
    const std::string name = FirstChange(i, after);
    if (!name.empty()) {
      return "attribute " + Where(i, py::str(name)) +
             " of the module was changed by the call, once per micro-batch: the split result "
             "would not be the unsplit call's";
    }
  }
  return "";
}

bool ModuleState::TakenAlike(const Module& m, PyObject* attributes) const {
  if (!PyDict_CheckExact(attributes) ||
      PyDict_Size(attributes) != static_cast<Py_ssize_t>(m.end - m.first)) {
    return false;
  }
  // Nothing compared here runs Python code (str names, builtin scalars and
  // container sizes), so the dict cannot change under PyDict_Next.
  Py_ssize_t pos = 0;
  size_t k = m.first;
  PyObject *name, *value;
  while (PyDict_Next(attributes, &pos, &name, &value)) {
    const Attribute& b = attributes_[k++];
    if (b.name.ptr() != name &&
        !(PyUnicode_CheckExact(name) && PyUnicode_CheckExact(b.name.ptr()) &&
          PyUnicode_Compare(name, b.name.ptr()) == 0)) {
      return false;
    }
    if (Py_TYPE(value) != b.type) return false;
    switch (b.kind) {
      case Attribute::kScalar:
        if (!Equal(b.value.ptr(), value)) return false;
        break;
      case Attribute::kIdentity:
        if (b.value.ptr() != value) return false;
        break;
      case Attribute::kLength: {
        const Py_ssize_t n = PyObject_Size(value);
        if (n < 0) {
          PyErr_Clear();
          return false;
        }
        if (n != b.length) return false;
        break;
      }
      default:  // a container's entries: the full comparison's
        return false;
    }
  }
  return k == m.end;
}

size_t ModuleState::attributes() const { return attributes_.size(); }

}  // namespace dynaflow
