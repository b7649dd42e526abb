#include "plugin/torch/call_split.h"

#include <algorithm>
#include <stdexcept>

#include <ATen/ATen.h>

#include <torch/csrc/autograd/python_variable.h>

namespace py = pybind11;

namespace dynaflow {

// One call's split: what Parts reads and writes besides the value.
struct CallSplitter::Call {
  py::handle splitter;  // the _Splitter (its `parts` is the fallback)
  py::object row_views;  // split.row_views
  py::object share;      // split.share
  int64_t batch = 0;
  std::vector<std::pair<int64_t, int64_t>> rows;  // (first row, count) per micro-batch

  size_t n() const { return rows.size(); }
};

std::vector<py::object> CallSplitter::Parts(const Call& call, const Path& path,
                                            py::handle value) const {
  const RecursionGuard guard(" while splitting a call's arguments");
  // The order of _Splitter.parts. A state object or a dataclass is never an
  // exact tuple, list or dict, so taking those here changes no outcome.
  if (IsImmutable(value, immutable_types_)) {
    return std::vector<py::object>(call.n(), py::reinterpret_borrow<py::object>(value));
  }
  if (THPVariable_CheckExact(value.ptr())) return TensorParts(call, path, value);
  if (PyTuple_CheckExact(value.ptr())) return SequenceParts(call, path, value, true);
  if (PyList_CheckExact(value.ptr())) return SequenceParts(call, path, value, false);
  if (PyDict_CheckExact(value.ptr())) return DictParts(call, path, value);
  return Fallback(call, path, value);
}

std::vector<py::object> CallSplitter::TensorParts(const Call& call, const Path& path,
                                                  py::handle value) const {
  const at::Tensor* plain = PlainTensor(value);
  if (plain == nullptr) return Fallback(call, path, value);
  const at::Tensor& t = *plain;
  // Only an argument's own name can end in "position_ids" or be a shared
  // name: a nested one ends in "]".
  bool shared_name = false;
  if (path.parent == nullptr) {
    const std::string& name = *path.name;
    static const std::string kPositions = "position_ids";
    if (t.dim() == 3 && name.size() >= kPositions.size() &&
        name.compare(name.size() - kPositions.size(), kPositions.size(), kPositions) == 0) {
      return Fallback(call, path, value);
    }
    shared_name = shared_names_.contains(py::str(name));
  }
  const int64_t first = t.dim() >= 1 ? t.size(0) : -1;
  const bool per_row = first == call.batch && !shared_name;
  if (per_row && (t.dim() == 1 && call.batch > 1)) return Fallback(call, path, value);
  std::vector<py::object> parts;
  parts.reserve(call.n());
  if (per_row) {
    for (size_t i = 0; i < call.n(); ++i) {
      const auto [begin, count] = call.rows[i];
      py::object view =
          py::reinterpret_steal<py::object>(THPVariable_Wrap(t.narrow(0, begin, count)));
      if (!view) throw py::error_already_set();
      call.row_views[py::int_(reinterpret_cast<uintptr_t>(view.ptr()))] =
          py::make_tuple(value, static_cast<int64_t>(i));
      parts.push_back(std::move(view));
    }
    return parts;
  }
  if (t.dim() >= 2 && first != 1 && first != call.batch && !shared_name) {
    return Fallback(call, path, value);  // refused there, with its message
  }
  // A shared inference tensor is refused while its stream is captured into
  // a CUDA graph, which Python asks torch.
  if (t.is_inference() && t.is_cuda()) return Fallback(call, path, value);
  call.share(path.Text(), value);
  return std::vector<py::object>(call.n(), py::reinterpret_borrow<py::object>(value));
}

std::vector<py::object> CallSplitter::SequenceParts(const Call& call, const Path& path,
                                                    py::handle value, bool tuple) const {
  const py::tuple items = SequenceItems(value);
  const Py_ssize_t size = items.size();
  std::vector<std::vector<py::object>> item_parts;
  item_parts.reserve(size);
  for (Py_ssize_t k = 0; k < size; ++k) {
    const Path child{&path, nullptr, nullptr, k};
    item_parts.push_back(Parts(call, child, items[k]));
  }
  std::vector<py::object> parts;
  parts.reserve(call.n());
  for (size_t i = 0; i < call.n(); ++i) {
    if (tuple) {
      py::tuple out(size);
      for (Py_ssize_t k = 0; k < size; ++k) out[k] = item_parts[k][i];
      parts.push_back(std::move(out));
    } else {
      py::list out(size);
      for (Py_ssize_t k = 0; k < size; ++k) out[k] = item_parts[k][i];
      parts.push_back(std::move(out));
    }
  }
  return parts;
}

std::vector<py::object> CallSplitter::DictParts(const Call& call, const Path& path,
                                                py::handle value) const {
  const py::list items = DictItems(value);
  std::vector<std::pair<py::object, std::vector<py::object>>> item_parts;
  item_parts.reserve(items.size());
  for (py::handle item : items) {
    const py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
    const Path child{&path, nullptr, kv[0].ptr()};
    item_parts.emplace_back(kv[0], Parts(call, child, kv[1]));
  }
  std::vector<py::object> parts;
  parts.reserve(call.n());
  for (size_t i = 0; i < call.n(); ++i) {
    py::dict out;
    for (const auto& [key, values] : item_parts) out[key] = values[i];
    parts.push_back(std::move(out));
  }
  return parts;
}

std::vector<py::object> CallSplitter::Fallback(const Call& call, const Path& path,
                                               py::handle value) const {
  const py::list got = call.splitter.attr("parts")(path.Text(), value);
  if (got.size() != call.n()) {
    throw std::runtime_error("split: the Python walker gave " + std::to_string(got.size()) +
                             " parts for " + path.Text() + ", not " + std::to_string(call.n()));
  }
  std::vector<py::object> parts;
  parts.reserve(call.n());
  for (py::handle p : got) parts.push_back(py::reinterpret_borrow<py::object>(p));
  return parts;
}

py::tuple CallSplitter::Split(py::handle splitter, const std::vector<std::string>& names,
                              py::tuple args, py::dict kwargs) const {
  if (names.size() != args.size()) {
    throw std::invalid_argument("split: " + std::to_string(names.size()) + " names for " +
                                std::to_string(args.size()) + " positional arguments");
  }
  Call call;
  call.splitter = splitter;
  const py::object split = splitter.attr("split");
  call.row_views = split.attr("row_views");
  call.share = split.attr("share");
  call.batch = splitter.attr("batch").cast<int64_t>();
  const std::vector<int64_t> bounds = split.attr("bounds").cast<std::vector<int64_t>>();
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    call.rows.emplace_back(bounds[i], bounds[i + 1] - bounds[i]);
  }

  std::vector<std::vector<py::object>> arg_parts;
  arg_parts.reserve(args.size());
  for (size_t k = 0; k < args.size(); ++k) {
    const Path top{nullptr, &names[k]};
    arg_parts.push_back(Parts(call, top, args[k]));
  }
  const py::list kwarg_items = DictItems(kwargs);
  std::vector<std::pair<py::object, std::vector<py::object>>> kwarg_parts;
  kwarg_parts.reserve(kwarg_items.size());
  for (py::handle item : kwarg_items) {
    const py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
    const std::string name = py::str(kv[0]);
    const Path top{nullptr, &name};
    kwarg_parts.emplace_back(kv[0], Parts(call, top, kv[1]));
  }

  py::list args_out, kwargs_out;
  for (size_t i = 0; i < call.n(); ++i) {
    py::tuple a(args.size());
    for (size_t k = 0; k < args.size(); ++k) a[k] = arg_parts[k][i];
    args_out.append(std::move(a));
    py::dict kw;
    for (const auto& [key, values] : kwarg_parts) kw[key] = values[i];
    kwargs_out.append(std::move(kw));
  }
  return py::make_tuple(args_out, kwargs_out);
}

// One merge: what MergeParts reads besides the parts.
struct CallSplitter::Merging {
  py::handle split;
  py::object row_views;  // split.row_views
  py::dict view_owner;
  py::dict merged;       // (ids of the parts) -> their merged tensor
  py::object fallback;   // _split._merge
  bool slices = false;   // split.slices is set: its tensors are merged there
  std::vector<int64_t> counts;  // rows per micro-batch
};

py::object CallSplitter::Merge(py::handle split, py::list results, py::dict view_owner,
                               py::object fallback) const {
  Merging m;
  m.split = split;
  m.row_views = split.attr("row_views");
  m.view_owner = std::move(view_owner);
  m.fallback = std::move(fallback);
  m.slices = !split.attr("slices").is_none();
  const std::vector<int64_t> bounds = split.attr("bounds").cast<std::vector<int64_t>>();
  for (size_t i = 0; i + 1 < bounds.size(); ++i) m.counts.push_back(bounds[i + 1] - bounds[i]);
  if (results.size() != m.counts.size()) {
    throw std::invalid_argument("merge: " + std::to_string(results.size()) + " results for " +
                                std::to_string(m.counts.size()) + " micro-batches");
  }
  std::vector<py::handle> parts(results.begin(), results.end());
  const std::string output = "output";
  return MergeParts(m, Path{nullptr, &output}, parts);
}

py::object CallSplitter::MergeParts(const Merging& m, const Path& path,
                                    const std::vector<py::handle>& parts) const {
  const RecursionGuard guard(" while merging a call's outputs");
  PyObject* first = parts[0].ptr();
  PyTypeObject* type = Py_TYPE(first);
  const bool alike = std::all_of(parts.begin(), parts.end(),
                                 [&](py::handle p) { return Py_TYPE(p.ptr()) == type; });
  if (!alike || m.view_owner.contains(py::int_(reinterpret_cast<uintptr_t>(first)))) {
    return MergeFallback(m, path, parts);
  }
  if (first == Py_None && std::all_of(parts.begin(), parts.end(),
                                      [](py::handle p) { return p.is_none(); })) {
    return py::none();
  }
  if (THPVariable_CheckExact(first)) return MergeTensors(m, path, parts);
  if (type == &PyTuple_Type || type == &PyList_Type) {
    const Py_ssize_t size = Py_SIZE(first);
    for (py::handle p : parts) {
      if (Py_SIZE(p.ptr()) != size) return MergeFallback(m, path, parts);
    }
    // Items are read through the sequence protocol: a list may change size
    // while Python runs in a fallback, which then raises IndexError.
    std::vector<py::object> items;
    for (Py_ssize_t k = 0; k < size; ++k) {
      std::vector<py::handle> item_parts;
      std::vector<py::object> keep;
      for (py::handle p : parts) {
        keep.push_back(py::reinterpret_borrow<py::sequence>(p)[k]);
        item_parts.push_back(keep.back());
      }
      const Path child{&path, nullptr, nullptr, k};
      items.push_back(MergeParts(m, child, item_parts));
    }
    if (type == &PyTuple_Type) {
      py::tuple out(size);
      for (Py_ssize_t k = 0; k < size; ++k) out[k] = items[k];
      return out;
    }
    py::list out(size);
    for (Py_ssize_t k = 0; k < size; ++k) out[k] = items[k];
    return out;
  }
  if (type == &PyDict_Type) {
    const py::dict head = py::reinterpret_borrow<py::dict>(first);
    const py::list keys = head.attr("keys")();
    for (py::handle p : parts) {
      if (!head.attr("keys")().equal(py::reinterpret_borrow<py::dict>(p).attr("keys")())) {
        return MergeFallback(m, path, parts);
      }
    }
    py::dict out;
    for (py::handle key : keys) {
      std::vector<py::handle> item_parts;
      std::vector<py::object> keep;
      for (py::handle p : parts) {
        keep.push_back(py::reinterpret_borrow<py::dict>(p)[key]);
        item_parts.push_back(keep.back());
      }
      const Path child{&path, nullptr, key.ptr()};
      out[key] = MergeParts(m, child, item_parts);
    }
    return out;
  }
  return MergeFallback(m, path, parts);
}

py::object CallSplitter::MergeTensors(const Merging& m, const Path& path,
                                      const std::vector<py::handle>& parts) const {
  py::tuple key(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    key[i] = py::int_(reinterpret_cast<uintptr_t>(parts[i].ptr()));
  }
  if (m.merged.contains(key)) return m.merged[key];
  // An argument's own rows returned (an in-place update), a wrong row count
  // (a MergeError with its message), or slices: Python's.
  if (m.slices || m.row_views.contains(key[0])) return MergeFallback(m, path, parts);
  std::vector<at::Tensor> tensors;
  tensors.reserve(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    const at::Tensor& t = THPVariable_Unpack(parts[i].ptr());
    if (t.dim() < 1 || t.size(0) != m.counts[i]) return MergeFallback(m, path, parts);
    tensors.push_back(t);
  }
  py::object whole = py::reinterpret_steal<py::object>(THPVariable_Wrap(at::cat(tensors, 0)));
  if (!whole) throw py::error_already_set();
  m.merged[key] = whole;
  return whole;
}

py::object CallSplitter::MergeFallback(const Merging& m, const Path& path,
                                       const std::vector<py::handle>& parts) const {
  py::list list;
  for (py::handle p : parts) list.append(p);
  return m.fallback(m.split, list, path.Text(), m.view_owner, m.merged, false);
}

}  // namespace dynaflow
