#include "plugin/torch/module_snapshot.h"

#include <stdexcept>
#include <string>
#include <unordered_set>

#include <torch/csrc/autograd/python_variable.h>

namespace dynaflow {
namespace py = pybind11;

namespace {

// What a walk throws when a container's size changes while it is walked.
std::runtime_error Changed() {
  return std::runtime_error("a container of the modules changed while it was compared");
}

// on_size(len(container)), then f(item) for each item of `container`, in
// iteration order, with a reference held on the item while f runs (f may
// run Python code that changes the container).
template <typename OnSize, typename F>
void ForEachItem(PyObject* container, OnSize&& on_size, F&& f) {
  py::object keep = py::reinterpret_borrow<py::object>(container);
  if (PyTuple_CheckExact(container)) {  // immutable: its items live as long as it
    const Py_ssize_t n = PyTuple_GET_SIZE(container);
    on_size(n);
    for (Py_ssize_t i = 0; i < n; ++i) f(PyTuple_GET_ITEM(container, i));
    return;
  }
  if (PyList_CheckExact(container)) {
    const Py_ssize_t n = PyList_GET_SIZE(container);
    on_size(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (PyList_GET_SIZE(container) != n) throw Changed();
      py::object item = py::reinterpret_borrow<py::object>(PyList_GET_ITEM(container, i));
      f(item.ptr());
    }
    return;
  }
  const Py_ssize_t n = PyObject_Size(container);
  if (n < 0) throw py::error_already_set();
  on_size(n);
  py::object it = py::reinterpret_steal<py::object>(PyObject_GetIter(container));
  if (!it) throw py::error_already_set();
  Py_ssize_t seen = 0;
  while (PyObject* raw = PyIter_Next(it.ptr())) {
    py::object item = py::reinterpret_steal<py::object>(raw);
    if (++seen > n) throw Changed();
    f(item.ptr());
  }
  if (PyErr_Occurred()) throw py::error_already_set();
  if (seen != n) throw Changed();
}

// on_size(len(mapping)), then f(key, value) for each entry, in its iteration
// order, with references held on both while f runs.
template <typename OnSize, typename F>
void ForEachEntry(PyObject* mapping, OnSize&& on_size, F&& f) {
  if (PyDict_CheckExact(mapping)) {
    py::object keep = py::reinterpret_borrow<py::object>(mapping);
    const Py_ssize_t n = PyDict_GET_SIZE(mapping);
    on_size(n);
    Py_ssize_t pos = 0, seen = 0;
    PyObject *k, *v;
    while (PyDict_Next(mapping, &pos, &k, &v)) {
      py::object key = py::reinterpret_borrow<py::object>(k);
      py::object value = py::reinterpret_borrow<py::object>(v);
      if (++seen > n) throw Changed();
      f(key.ptr(), value.ptr());
      if (PyDict_GET_SIZE(mapping) != n) throw Changed();
    }
    if (seen != n) throw Changed();
    return;
  }
  // A dict subclass (an OrderedDict keeps its own order) or another mapping.
  py::object items =
      py::reinterpret_steal<py::object>(PyObject_CallMethod(mapping, "items", nullptr));
  if (!items) throw py::error_already_set();
  ForEachItem(items.ptr(), on_size, [&](PyObject* pair) {
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
  void Count(Py_ssize_t n) override { s_->counts_.push_back(n); }

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
  void Count(Py_ssize_t n) override {
    same_ = same_ && counts_ < s_.counts_.size() && s_.counts_[counts_] == n;
    ++counts_;
  }
  bool same() const {
    return same_ && objects_ == s_.objects_.size() && tensors_ == s_.addresses_.size() &&
           counts_ == s_.counts_.size();
  }

 private:
  const ModuleSnapshot& s_;
  bool same_ = true;
  size_t objects_ = 0, tensors_ = 0, counts_ = 0;
};

ModuleSnapshot::ModuleSnapshot(const py::sequence& modules, TypeKinds* kinds, py::object tables)
    : kinds_(kinds), tables_(std::move(tables)) {
  if (!PyAnySet_Check(tables_.ptr())) throw std::invalid_argument("tables must be a set");
  modules_ = ModulesOf(modules);
  Recorder record(this);
  Walk(&record);
}

bool ModuleSnapshot::Same(const py::sequence& modules) const {
  const std::vector<py::object> now = ModulesOf(modules);
  if (now.size() != modules_.size()) return false;
  for (size_t i = 0; i < now.size(); ++i) {
    if (now[i].ptr() != modules_[i].ptr()) return false;
  }
  Comparer compare(*this);
  Walk(&compare);
  return compare.same();
}

// The modules of (path, module) pairs.
std::vector<py::object> ModuleSnapshot::ModulesOf(const py::sequence& pairs) {
  std::vector<py::object> out;
  out.reserve(pairs.size());
  for (py::handle item : pairs) {
    py::object pair = py::reinterpret_borrow<py::object>(item);
    if (!PyTuple_Check(pair.ptr()) || PyTuple_GET_SIZE(pair.ptr()) != 2) {
      throw std::invalid_argument("modules must be (path, module) pairs");
    }
    out.push_back(py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(pair.ptr(), 1)));
  }
  return out;
}

void ModuleSnapshot::Walk(Visitor* visit) const {
  std::unordered_set<PyObject*> seen;  // objects whose fields were walked
  std::vector<py::object> alive;       // what `seen` points to
  auto size = [visit](Py_ssize_t n) { visit->Count(n); };
  for (const py::object& m : modules_) {
    py::object attributes = Attribute(m.ptr(), "__dict__");
    for (const char* table : {"_parameters", "_buffers"}) {
      py::object tensors = Attribute(m.ptr(), table);
      ForEachEntry(tensors.ptr(), size, [&](PyObject*, PyObject* t) {
        if (t != Py_None) visit->Tensor(AddressOf(t));
      });
    }
    ForEachEntry(attributes.ptr(), size, [&](PyObject* name, PyObject* v) {
      visit->Object(name);  // one added or deleted shows
      visit->Object(v);
      const TypeKinds::Kind kind = kinds_->Of(v);
      if (kind == TypeKinds::kIdentity) return;
      const int table = PySet_Contains(tables_.ptr(), name);
      if (table < 0) throw py::error_already_set();
      if (table) return;
      if (kind == TypeKinds::kContainer) {
        if (PyDict_Check(v)) {
          ForEachEntry(v, size, [&](PyObject*, PyObject* x) { visit->Object(x); });
        } else {
          ForEachItem(v, size, [&](PyObject* x) { visit->Object(x); });
        }
      } else if (kind == TypeKinds::kTensor) {
        visit->Tensor(AddressOf(v));
      } else if (seen.insert(v).second) {
        alive.push_back(py::reinterpret_borrow<py::object>(v));
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
  auto size = [visit](Py_ssize_t n) { visit->Count(n); };
  if (PyDict_Check(v)) {
    ForEachEntry(v, size, entry);
  } else if (kinds_->Of(v) == TypeKinds::kContainer) {
    ForEachItem(v, size, item);
  } else {
    py::object fields = Attribute(v, "__dict__");
    ForEachEntry(fields.ptr(), size, entry);
  }
}

ModuleSnapshot::Address ModuleSnapshot::AddressOf(PyObject* tensor) {
  if (!THPVariable_Check(tensor)) {
    throw std::invalid_argument(std::string("a tensor was expected, not a ") +
                                Py_TYPE(tensor)->tp_name);
  }
  const at::Tensor& t = THPVariable_Unpack(tensor);
  Address a;
  // A strided tensor without storage (a fake or functional one) has no data
  // pointer to move; a tensor without strides (sparse, nested) throws
  // c10::Error below: no snapshot is made of its modules.
  if (t.has_storage()) a.data = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  a.dtype = static_cast<int64_t>(t.scalar_type());
  a.sizes.assign(t.sizes().begin(), t.sizes().end());
  a.strides.assign(t.strides().begin(), t.strides().end());
  return a;
}

}  // namespace dynaflow
