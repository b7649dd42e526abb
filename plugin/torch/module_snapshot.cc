#include "plugin/torch/module_snapshot.h"

#include <stdexcept>
#include <string>
#include <unordered_set>

#include <torch/csrc/autograd/python_variable.h>

namespace dynaflow {
namespace py = pybind11;

namespace {

// f(item) for each item of `container`, in iteration order; f borrows it.
template <typename F>
void ForEachItem(PyObject* container, F&& f) {
  if (PyList_CheckExact(container) || PyTuple_CheckExact(container)) {
    // A sequence that does not change while walked: the walk runs no code of
    // the program's (kind_of answers from types).
    py::object keep = py::reinterpret_borrow<py::object>(container);
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(container);
    PyObject** items = PySequence_Fast_ITEMS(container);
    for (Py_ssize_t i = 0; i < n; ++i) f(items[i]);
    return;
  }
  py::object it = py::reinterpret_steal<py::object>(PyObject_GetIter(container));
  if (!it) throw py::error_already_set();
  while (PyObject* raw = PyIter_Next(it.ptr())) {
    py::object item = py::reinterpret_steal<py::object>(raw);
    f(item.ptr());
  }
  if (PyErr_Occurred()) throw py::error_already_set();
}

// f(key, value) for each entry of a mapping, in its iteration order.
template <typename F>
void ForEachEntry(PyObject* mapping, F&& f) {
  if (PyDict_CheckExact(mapping)) {
    py::object keep = py::reinterpret_borrow<py::object>(mapping);
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(mapping, &pos, &key, &value)) f(key, value);
    return;
  }
  // A dict subclass (an OrderedDict keeps its own order) or another mapping.
  py::object items =
      py::reinterpret_steal<py::object>(PyObject_CallMethod(mapping, "items", nullptr));
  if (!items) throw py::error_already_set();
  ForEachItem(items.ptr(), [&](PyObject* pair) {
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
      throw std::invalid_argument("a mapping's items() gave something other than pairs");
    }
    f(PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1));
  });
}

py::object Attribute(PyObject* o, const char* name) {
  py::object v = py::reinterpret_steal<py::object>(PyObject_GetAttrString(o, name));
  if (!v) throw py::error_already_set();
  return v;
}

}  // namespace

TypeKinds::Kind TypeKinds::Of(PyObject* value) {
  PyTypeObject* type = Py_TYPE(value);
  auto it = kinds_.find(type);
  if (it != kinds_.end()) return it->second;
  py::object t = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(type));
  const int kind = kind_of_(t).cast<int>();
  if (kind < kIdentity || kind > kFields) {
    throw std::invalid_argument("kind_of(" + std::string(type->tp_name) + ") gave " +
                                std::to_string(kind) + ", not a kind (0 to 3)");
  }
  types_.push_back(std::move(t));
  return kinds_[type] = static_cast<Kind>(kind);
}

// Keeps what the walk sees.
class ModuleSnapshot::Recorder : public ModuleSnapshot::Visitor {
 public:
  explicit Recorder(ModuleSnapshot* s) : s_(s) {}
  void Object(PyObject* o) override {
    s_->objects_.push_back(py::reinterpret_borrow<py::object>(o));
  }
  void Tensor(const Address& a) override { s_->addresses_.push_back(a); }

 private:
  ModuleSnapshot* s_;
};

// Compares what the walk sees with what a Recorder kept.
class ModuleSnapshot::Comparer : public ModuleSnapshot::Visitor {
 public:
  explicit Comparer(const ModuleSnapshot& s) : s_(s) {}
  void Object(PyObject* o) override {
    same_ = same_ && objects_ < s_.objects_.size() && s_.objects_[objects_].ptr() == o;
    ++objects_;
  }
  void Tensor(const Address& a) override {
    same_ = same_ && tensors_ < s_.addresses_.size() && s_.addresses_[tensors_] == a;
    ++tensors_;
  }
  bool same() const {
    return same_ && objects_ == s_.objects_.size() && tensors_ == s_.addresses_.size();
  }

 private:
  const ModuleSnapshot& s_;
  bool same_ = true;
  size_t objects_ = 0, tensors_ = 0;
};

ModuleSnapshot::ModuleSnapshot(const py::sequence& modules, TypeKinds* kinds, py::object tables)
    : kinds_(kinds), tables_(std::move(tables)) {
  if (!PyAnySet_Check(tables_.ptr())) throw std::invalid_argument("tables must be a set");
  for (PyObject* m : ModulesOf(modules)) modules_.push_back(py::reinterpret_borrow<py::object>(m));
  Recorder record(this);
  Walk(&record);
}

bool ModuleSnapshot::Same(const py::sequence& modules) const {
  const std::vector<PyObject*> now = ModulesOf(modules);
  if (now.size() != modules_.size()) return false;
  for (size_t i = 0; i < now.size(); ++i) {
    if (now[i] != modules_[i].ptr()) return false;
  }
  Comparer compare(*this);
  Walk(&compare);
  return compare.same();
}

// The modules of (path, module) pairs, borrowed from `pairs`.
std::vector<PyObject*> ModuleSnapshot::ModulesOf(const py::sequence& pairs) {
  std::vector<PyObject*> out;
  out.reserve(pairs.size());
  for (py::handle pair : pairs) {
    if (!PyTuple_Check(pair.ptr()) || PyTuple_GET_SIZE(pair.ptr()) != 2) {
      throw std::invalid_argument("modules must be (path, module) pairs");
    }
    out.push_back(PyTuple_GET_ITEM(pair.ptr(), 1));
  }
  return out;
}

void ModuleSnapshot::Walk(Visitor* visit) const {
  std::unordered_set<PyObject*> seen;  // objects whose fields were walked
  for (const py::object& m : modules_) {
    py::object attributes = Attribute(m.ptr(), "__dict__");
    for (const char* table : {"_parameters", "_buffers"}) {
      py::object tensors = Attribute(m.ptr(), table);
      ForEachEntry(tensors.ptr(), [&](PyObject*, PyObject* t) {
        if (t != Py_None) visit->Tensor(AddressOf(t));
      });
    }
    ForEachEntry(attributes.ptr(), [&](PyObject* name, PyObject* v) {
      visit->Object(name);  // one added or deleted shows
      visit->Object(v);
      const TypeKinds::Kind kind = kinds_->Of(v);
      if (kind == TypeKinds::kIdentity) return;
      const int table = PySet_Contains(tables_.ptr(), name);
      if (table < 0) throw py::error_already_set();
      if (table) return;
      if (kind == TypeKinds::kContainer) {
        if (PyDict_Check(v)) {
          ForEachEntry(v, [&](PyObject*, PyObject* x) { visit->Object(x); });
        } else {
          ForEachItem(v, [&](PyObject* x) { visit->Object(x); });
        }
      } else if (kind == TypeKinds::kTensor) {
        visit->Tensor(AddressOf(v));
      } else if (seen.insert(v).second) {
        WalkFields(v, kDepth, visit);
      }
    });
  }
}

// What `v` holds, `depth` levels down: a dict's keys and values, a
// container's items, another object's field names and values.
void ModuleSnapshot::WalkFields(PyObject* v, int depth, Visitor* visit) const {
  auto item = [&](PyObject* x) {
    visit->Object(x);
    if (depth > 1) {
      const TypeKinds::Kind kind = kinds_->Of(x);
      if (kind == TypeKinds::kContainer || kind == TypeKinds::kFields) {
        WalkFields(x, depth - 1, visit);
      }
    }
  };
  auto entry = [&](PyObject* key, PyObject* x) {
    visit->Object(key);
    item(x);
  };
  if (PyDict_Check(v)) {
    ForEachEntry(v, entry);
  } else if (kinds_->Of(v) == TypeKinds::kContainer) {
    ForEachItem(v, item);
  } else {
    py::object fields = Attribute(v, "__dict__");
    ForEachEntry(fields.ptr(), entry);
  }
}

ModuleSnapshot::Address ModuleSnapshot::AddressOf(PyObject* tensor) {
  if (!THPVariable_Check(tensor)) {
    throw std::invalid_argument(std::string("a tensor was expected, not a ") +
                                Py_TYPE(tensor)->tp_name);
  }
  const at::Tensor& t = THPVariable_Unpack(tensor);
  Address a;
  // A tensor with no storage (sparse, nested) has no data pointer to move.
  if (t.has_storage()) a.data = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  a.dtype = static_cast<int64_t>(t.scalar_type());
  a.sizes.assign(t.sizes().begin(), t.sizes().end());
  a.strides.assign(t.strides().begin(), t.strides().end());
  return a;
}

}  // namespace dynaflow
