// The split of one planned call's arguments into micro-batches
// (plugin/python/dynaflow/_split.py: split_call and _Splitter.parts) and the
// merge of their outputs (merge_outputs), walked in C++: the arguments a model passes to its layers are tensors in tuples,
// lists and dicts, and walking them in Python cost more than the forward of
// a small layer (docs/performance.md).
//
// Contract: the result is the one `_Splitter.parts` gives, value for value.
// C++ takes only the cases whose outcome it knows for certain:
// - an immutable value (None, bool, int, float, complex, str, bytes, or an
//   instance of `immutable_types`): the same object for every micro-batch;
// - a torch.Tensor or nn.Parameter (exact types), strided and not nested,
//   which either holds the batch's rows in dimension 0 (a view of each
//   micro-batch's rows, recorded in `split.row_views` as
//   {id(view): (tensor, micro-batch)}) or is shared (dimension 0 of 1, fewer
//   than 2 dimensions, or a name in `shared_names`; recorded by
//   `split.share(name, tensor)`, the same object for every micro-batch);
// - an exact tuple, list or dict: one of that type per micro-batch, of its
//   items' parts.
// Everything else (a refusal, an inference tensor that is shared, a state
// object, a dataclass, a namedtuple, any other type) is handed to
// `splitter.parts(name, value)`, the Python walker, with the name it would
// have built: so refusals keep their messages, and state objects their
// adapters.
//
// The GIL is held throughout (pybind11 calls in with it). What Python raises
// (a Refusal from the fallback, RecursionError past Python's recursion limit,
// as the Python walks raise it) propagates as pybind11::error_already_set.
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>

#include "plugin/torch/python_walk.h"

namespace dynaflow {

class CallSplitter {
 public:
  // `immutable_types`: the types besides Python's scalars that _is_immutable
  // accepts (enum.Enum, torch.dtype, torch.device, torch.Size, ellipsis);
  // `shared_names`: SHARED_TENSOR_NAMES.
  CallSplitter(pybind11::tuple immutable_types, pybind11::frozenset shared_names)
      : immutable_types_(std::move(immutable_types)), shared_names_(std::move(shared_names)) {}

  // (args of each micro-batch: a list of tuples, kwargs of each: a list of
  // dicts) of one call. `splitter` is the call's `_Splitter` (its `split`,
  // `batch` and `parts`); `names` names the positional arguments, as
  // `_positional_names` does.
  pybind11::tuple Split(pybind11::handle splitter, const std::vector<std::string>& names,
                        pybind11::tuple args, pybind11::dict kwargs) const;

  // The unsplit call's output from the micro-batches' `results`
  // (_split.merge_outputs), walked here where the outcome is certain: exact
  // tuples, lists and dicts alike in every micro-batch, None everywhere,
  // and exact tensors of each micro-batch's row count, none of them a row
  // view of an argument, concatenated by rows (at::cat, as torch.cat) once
  // per set of parts. Everything else, and the whole merge where `split`
  // has preallocated slices, goes to `fallback(split, parts, where,
  // view_owner, merged, False)` (_split._merge), which raises MergeError
  // with its message; `merged` is the one memo both walks share.
  pybind11::object Merge(pybind11::handle split, pybind11::list results,
                         pybind11::dict view_owner, pybind11::object fallback) const;

 private:
  using Path = ValuePath;
  struct Call;
  struct Merging;

  std::vector<pybind11::object> Parts(const Call& call, const Path& path,
                                      pybind11::handle value) const;
  std::vector<pybind11::object> TensorParts(const Call& call, const Path& path,
                                            pybind11::handle value) const;
  std::vector<pybind11::object> SequenceParts(const Call& call, const Path& path,
                                              pybind11::handle value, bool tuple) const;
  std::vector<pybind11::object> DictParts(const Call& call, const Path& path,
                                          pybind11::handle value) const;
  std::vector<pybind11::object> Fallback(const Call& call, const Path& path,
                                         pybind11::handle value) const;

  pybind11::object MergeParts(const Merging& m, const Path& path,
                              const std::vector<pybind11::handle>& parts) const;
  pybind11::object MergeTensors(const Merging& m, const Path& path,
                                const std::vector<pybind11::handle>& parts) const;
  pybind11::object MergeFallback(const Merging& m, const Path& path,
                                 const std::vector<pybind11::handle>& parts) const;

  pybind11::tuple immutable_types_;
  pybind11::frozenset shared_names_;
};

}  // namespace dynaflow
