// Operator inputs as compact JSON in the PyTorch profiler's (Kineto's)
// conventions, the trace store's operators.input_shapes / input_types:
//   tensor       [d0,d1,...]            "float", "c10::BFloat16", ... (dtype name)
//   tensor list  [[...],[...]]          "TensorList"
//   scalar       []                     "Scalar"      (int, float, bool, complex)
//   scalar list  []                     "ScalarList"  (int, float, bool lists)
//   other        []                     ""            (None, strings, devices, ...)
// e.g. aten::addmm(bias, x, w.t(), beta=1, alpha=1) gives
//   [[4],[2,8],[8,4],[],[]]   and   ["float","float","float","Scalar","Scalar"].
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <string>

namespace dynaflow {

struct EncodedInputs {
  std::string shapes;
  std::string types;
};

// Never throws on odd tensors: one whose sizes cannot be read here (nested,
// symbolic) encodes as [] with its dtype.
EncodedInputs EncodeInputs(c10::ArrayRef<const c10::IValue> inputs);

}  // namespace dynaflow
