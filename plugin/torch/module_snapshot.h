// What a CUDA graph of a planned call assumes of its unit's modules
// (plugin/python/dynaflow/_graphs.py), taken after the warm-up and again after
// the capture, and compared at every replay: a graph replays what the modules
// were, so one whose modules changed is dropped and captured again.
//
// Compared, in one walk of the modules:
// - the modules themselves, by identity and order;
// - every attribute of each module (`vars(module)`): its name and its value,
//   by identity; the values of a container attribute (list, dict, set,
//   tuple, ...: a hook table, a list the forward reads) by identity too,
//   except for nn.Module's own tables (`tables`: parameters, buffers,
//   submodules, hooks), which are compared as objects only;
// - what an object kept as an attribute holds (a config), once per object:
//   kDepth levels of its field names and values, of dicts' keys and values
//   and of containers' items;
// - the memory of the modules' tensors (parameters, buffers and tensor
//   attributes: data pointer, dtype, shape and strides), since a `.data`
//   swap moves it without rebinding. An in-place write to a weight needs no
//   new graph: the graph reads that memory.
// The number of entries of every container walked (the modules' attribute
// tables, their tensor tables, containers, fields) is compared too, so that
// the walk reads as one structure: an entry moved from the end of one
// container to the start of the next is a change.
// Every object compared by identity is kept alive by the snapshot, so no
// other object can take a freed one's address; the walk holds a reference to
// whatever it is looking at, as the Python code it calls (kind_of, an
// object's __getattribute__, another thread given the GIL) may change
// anything. A container whose size changes while it is walked throws
// (std::runtime_error): a snapshot cannot be made of it, or it is not the same.
//
// The GIL is held throughout (pybind11 calls in with it).
#pragma once

#include <Python.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include <pybind11/pybind11.h>

namespace dynaflow {

// How a value is compared, by its type alone: `kind_of` (a Python callable,
// type -> Kind) is asked once per type and the answer kept, with the type,
// for the life of this object.
class TypeKinds {
 public:
  enum Kind { kIdentity = 0, kContainer = 1, kTensor = 2, kFields = 3 };

  explicit TypeKinds(pybind11::object kind_of) : kind_of_(std::move(kind_of)) {}
  // Throws pybind11::error_already_set when kind_of raises, or
  // std::invalid_argument when it answers something other than a Kind.
  Kind Of(PyObject* value);

 private:
  pybind11::object kind_of_;
  std::unordered_map<PyTypeObject*, Kind> kinds_;
  std::vector<pybind11::object> types_;  // keeps the keys alive
};

class ModuleSnapshot {
 public:
  // How deep the fields of an object kept as an attribute are compared.
  static constexpr int kDepth = 3;

  // `modules`: the unit's (path, module) pairs, as check_module returns
  // them; `tables`: a set of attribute names. Throws what Python raised
  // (pybind11::error_already_set) when the walk fails.
  ModuleSnapshot(const pybind11::sequence& modules, TypeKinds* kinds, pybind11::object tables);

  // Whether `modules` (same form) are the snapshot's modules, unchanged.
  bool Same(const pybind11::sequence& modules) const;

  // How many objects and tensors the snapshot compares (for tests).
  size_t objects() const { return objects_.size(); }
  size_t tensors() const { return addresses_.size(); }

 private:
  struct Address {
    uintptr_t data = 0;
    int64_t dtype = 0;
    std::vector<int64_t> sizes, strides;
    bool operator==(const Address&) const = default;
  };
  // What a walk sees, in order: told each object compared by identity and
  // each tensor compared by memory.
  class Visitor {
   public:
    virtual ~Visitor() = default;
    virtual void Object(PyObject* o) = 0;
    virtual void Tensor(const Address& a) = 0;
    virtual void Count(Py_ssize_t n) = 0;  // a container's size, before its entries
  };
  class Recorder;
  class Comparer;

  void Walk(Visitor* visit) const;
  void WalkFields(PyObject* v, int depth, Visitor* visit) const;
  static Address AddressOf(PyObject* tensor);
  static std::vector<pybind11::object> ModulesOf(const pybind11::sequence& pairs);

  TypeKinds* kinds_;  // outlives the snapshot (the caller keeps it)
  pybind11::object tables_;
  std::vector<pybind11::object> modules_;
  std::vector<pybind11::object> objects_;
  std::vector<Address> addresses_;
  std::vector<Py_ssize_t> counts_;
};

}  // namespace dynaflow
