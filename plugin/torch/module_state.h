// What a split call must leave as it found it in its unit's modules
// (plugin/python/dynaflow/_split.py: ModuleState, whose contract this keeps),
// taken before every eager planned call and checked after it, in C++: on a
// 421-module decoder stack the Python walk cost milliseconds per call
// (docs/performance.md).
//
// Every micro-batch runs the same modules, so what the call writes there is
// written once per micro-batch. Taken, per module of `modules` ((path,
// module) pairs, as check_module returns them), in one walk of `vars(module)`:
// - each attribute's name, exact type and value: the value itself for a
//   scalar type (None, bool, int, float, complex, str, bytes; compared with
//   `==`, an object always equal to itself), the entries of a dict, list, set
//   or OrderedDict (exact types; dict keys by `==` and values by identity,
//   list items by identity and order, set items by identity; nn.Module's own
//   tables, `tables`, by length only), the object itself for anything else
//   (compared by identity, and kept alive meanwhile, so that no other object
//   can take its address);
// - its tensors: buffers, parameters and tensor attributes, each checked
//   still bound to the module and unmodified in place (its version counter;
//   an inference tensor has none: an inference buffer is compared by bytes
//   through `unchanged`, _split.Unchanged, and any other only by binding).
// Check() returns the first change as the message _split.ModuleState raises
// (MergeError), or "" when there is none; an attribute deleted and set again
// to the same value (only the order changed) is no change.
//
// The GIL is held throughout (pybind11 calls in with it). What Python raises
// while the modules are read propagates as pybind11::error_already_set.
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

namespace dynaflow {

class ModuleState {
 public:
  ModuleState(const pybind11::sequence& modules, pybind11::frozenset tables,
              pybind11::object unchanged);

  std::string Check() const;

  // How many attributes and tensors are compared (for tests).
  size_t attributes() const;
  size_t tensors() const { return tensors_.size(); }

 private:
  // One attribute as taken: its name, exact type, and what is compared.
  struct Attribute {
    enum Kind { kScalar, kLength, kDict, kList, kSet, kIdentity };
    pybind11::object name;
    PyTypeObject* type = nullptr;
    Kind kind = kIdentity;
    pybind11::object value;                 // kScalar: the value; kIdentity: the object
    Py_ssize_t length = 0;                  // containers
    std::vector<pybind11::object> keys;     // kDict
    std::vector<pybind11::object> entries;  // kDict values, kList items, kSet items (by address)
    bool Same(const Attribute& other) const;
  };
  struct Tensor {
    size_t owner = 0;
    const char* kind = "";  // "buffer", "parameter", "attribute"
    pybind11::object name;
    pybind11::object tensor;
    bool versioned = false;
    int64_t version = 0;
    pybind11::object unchanged;  // an inference buffer's _split.Unchanged
  };
  struct Module {
    pybind11::object path;
    pybind11::object module;
    size_t first = 0, end = 0;  // its attributes in attributes_
  };

  void Take(const pybind11::object& attributes, std::vector<Attribute>* out,
            std::vector<pybind11::object>* tensor_names) const;
  Attribute TakeOne(pybind11::handle name, pybind11::handle value) const;
  std::string Where(size_t module, const pybind11::object& name) const;
  std::string FirstChange(size_t module, const std::vector<Attribute>& after) const;
  // Whether a module's attributes are certainly as taken, compared in place
  // without taking them again (scalars, identities, sizes); false leaves it
  // to the full comparison, which also names the change.
  bool TakenAlike(const Module& m, PyObject* attributes) const;

  pybind11::frozenset tables_;
  pybind11::object unchanged_;
  PyObject* ordered_dict_;  // collections.OrderedDict, kept for the process
  std::vector<Module> modules_;
  std::vector<Attribute> attributes_;
  std::vector<Tensor> tensors_;
};

}  // namespace dynaflow
