#include "plugin/torch/input_encoding.h"

#include <charconv>

namespace dynaflow {
namespace {

void AppendInt(int64_t v, std::string* out) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, res.ptr);
}

// Nested tensors have no sizes() and symbolic ones throw on it.
bool HasConcreteSizes(const at::Tensor& t) {
  return !t.is_nested() && !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

void AppendSizes(const at::Tensor& t, std::string* out) {
  out->push_back('[');
  if (t.defined() && HasConcreteSizes(t)) {
    bool first = true;
    for (int64_t d : t.sizes()) {
      if (!first) out->push_back(',');
      first = false;
      AppendInt(d, out);
    }
  }
  out->push_back(']');
}

// Dtype names carry no characters that need escaping in JSON.
void AppendQuoted(std::string_view s, std::string* out) {
  out->push_back('"');
  out->append(s);
  out->push_back('"');
}

bool IsScalarList(const c10::IValue& v) {
  return v.isIntList() || v.isDoubleList() || v.isBoolList();
}

// A list of tensors, possibly with Nones (Tensor?[] of aten::index).
bool IsTensorList(const c10::IValue& v) {
  if (v.isTensorList()) return true;
  if (!v.isList()) return false;
  for (const c10::IValue& e : v.toListRef()) {
    if (!e.isTensor() && !e.isNone()) return false;
  }
  return !v.toListRef().empty();
}

void AppendInput(const c10::IValue& v, std::string* shapes, std::string* types) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    AppendSizes(t, shapes);
    AppendQuoted(t.defined() ? std::string_view(t.dtype().name()) : std::string_view(), types);
  } else if (IsTensorList(v)) {
    shapes->push_back('[');
    bool first = true;
    for (const c10::IValue& e : v.toListRef()) {
      if (!first) shapes->push_back(',');
      first = false;
      if (e.isTensor()) {
        AppendSizes(e.toTensor(), shapes);
      } else {
        shapes->append("[]");
      }
    }
    shapes->push_back(']');
    AppendQuoted("TensorList", types);
  } else {
    shapes->append("[]");
    AppendQuoted(v.isScalar() ? "Scalar" : IsScalarList(v) ? "ScalarList" : "", types);
  }
}

}  // namespace

EncodedInputs EncodeInputs(c10::ArrayRef<const c10::IValue> inputs) {
  EncodedInputs out;
  out.shapes.push_back('[');
  out.types.push_back('[');
  bool first = true;
  for (const c10::IValue& v : inputs) {
    if (!first) {
      out.shapes.push_back(',');
      out.types.push_back(',');
    }
    first = false;
    AppendInput(v, &out.shapes, &out.types);
  }
  out.shapes.push_back(']');
  out.types.push_back(']');
  return out;
}

}  // namespace dynaflow
