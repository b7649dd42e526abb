// What the C++ walks of a planned call's Python values share (call_split.h,
// call_keys.h, module_state.h): where a value sits in the call, named as the
// Python walks name it; Python's recursion limit; which values pass as they
// are; which tensors C++ reads as Python would; containers' items read
// once, so that nothing the walk then runs can change what it iterates; and
// attributes read by interned names.
#pragma once

#include <Python.h>

#include <string>

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

namespace dynaflow {

// Where a value sits in a call: an argument's name (or "output"), then an
// index of a sequence or a key of a dict per level. Its text ("name[0]['k']",
// a key by its repr) is built only when asked for.
struct ValuePath {
  const ValuePath* parent = nullptr;
  const std::string* name = nullptr;  // the argument's, at the top
  PyObject* key = nullptr;            // a dict's key, else the index below
  Py_ssize_t index = 0;
  std::string Text() const;
};

// Python's recursion limit held in a walk, as the Python walks hold it: a
// value nested too deep, or holding itself, raises RecursionError instead of
// overflowing the C stack.
class RecursionGuard {
 public:
  explicit RecursionGuard(const char* where) {
    if (Py_EnterRecursiveCall(where) != 0) throw pybind11::error_already_set();
  }
  ~RecursionGuard() { Py_LeaveRecursiveCall(); }
  RecursionGuard(const RecursionGuard&) = delete;
  RecursionGuard& operator=(const RecursionGuard&) = delete;
};

// _split._is_immutable: None, Ellipsis, an int, float, complex, str or bytes
// (bool is an int), or an instance of `immutable_types` (a tuple of types).
bool IsImmutable(pybind11::handle value, pybind11::handle immutable_types);

// The tensor of `value` when C++ reads it as Python would, else null: an
// exact torch.Tensor or nn.Parameter (a subclass may answer in Python),
// strided and not nested.
const at::Tensor* PlainTensor(pybind11::handle value);

// An exact tuple's or list's items: the tuple itself, a list's copied (the
// Python a fallback runs may change the list).
pybind11::tuple SequenceItems(pybind11::handle sequence);

// A dict's (key, value) tuples, as a list; a subclass's in its own order (an
// OrderedDict moved to its end keeps its storage's order).
pybind11::list DictItems(pybind11::handle dict);

// An interned str: an attribute name looked up by its cached hash and found
// by identity. A name built from a C string on every lookup (pybind11's
// attr("name")) is hashed anew each time: on a 421-module unit that alone
// made a walk slower than the same walk in Python.
pybind11::object Interned(const char* name);

// getattr(value, name), pybind11::error_already_set where it raises.
pybind11::object Attr(pybind11::handle value, const pybind11::object& name);

}  // namespace dynaflow
