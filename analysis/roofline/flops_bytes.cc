#include "analysis/roofline/flops_bytes.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

namespace dynaflow {
namespace {

// ---------------------------------------------------------------------------
// Parsing the recorded inputs without allocating.

constexpr int kMaxArgs = 24;
constexpr int kMaxDims = 8;

struct Arg {
  int ndim = -1;  // -1: not a tensor (or unparsable); 0: a 0-d tensor shape "[]"
  int64_t dims[kMaxDims] = {};
  double numel = 0;  // product of dims; the sum over the list for a tensor list
  bool list = false;
  int elem = 0;  // bytes per element from input_types, 0 when not a tensor
  bool fp8 = false;
  bool floating = false;
  bool dbl = false;

  int64_t dim(int i) const {  // Python-style index, 0 when out of range
    if (i < 0) i += ndim;
    return i >= 0 && i < ndim ? dims[i] : 0;
  }
  // Product of all dims but the last `keep` ones.
  double Leading(int keep) const {
    double p = 1;
    for (int i = 0; i < ndim - keep; ++i) p *= static_cast<double>(dims[i]);
    return p;
  }
  bool tensor() const { return ndim >= 1 || list; }
  double Bytes(int fallback_elem) const { return numel * (elem > 0 ? elem : fallback_elem); }
};

struct Inputs {
  int n = 0;
  std::array<Arg, kMaxArgs> a;
  const Arg& operator[](int i) const {
    static const Arg kNone;
    return i >= 0 && i < n ? a[i] : kNone;
  }
};

class Cursor {
 public:
  explicit Cursor(std::string_view s) : s_(s) {}
  bool Eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  char Peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  bool Number(int64_t* v) {
    bool neg = Eat('-');
    if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) return false;
    int64_t x = 0;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
      if (x < (int64_t{1} << 56)) x = x * 10 + (s_[i_] - '0');
      ++i_;
    }
    *v = neg ? -x : x;
    return true;
  }
  // Skips one JSON value of any kind (for shapes we cannot use).
  bool SkipValue() {
    int depth = 0;
    bool in_string = false;
    for (; i_ < s_.size(); ++i_) {
      char c = s_[i_];
      if (in_string) {
        if (c == '\\') {
          ++i_;
        } else if (c == '"') {
          in_string = false;
        }
        continue;
      }
      if (c == '"') {
        in_string = true;
      } else if (c == '[' || c == '{') {
        ++depth;
      } else if (c == ']' || c == '}') {
        if (depth == 0) return true;
        if (--depth == 0) {
          ++i_;
          return true;
        }
      } else if (c == ',' && depth == 0) {
        return true;
      }
    }
    return depth == 0;
  }
  std::string_view String() {  // after the opening quote was seen
    size_t start = i_;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') ++i_;
      ++i_;
    }
    std::string_view out = s_.substr(start, std::min(i_, s_.size()) - start);
    if (i_ < s_.size()) ++i_;
    return out;
  }

 private:
  std::string_view s_;
  size_t i_ = 0;
};

// One shape: [d0,d1,...] or a list of shapes [[..],[..]].
bool ParseShape(Cursor& c, Arg* a) {
  if (!c.Eat('[')) return c.SkipValue();
  if (c.Eat(']')) {
    a->ndim = 0;
    a->numel = 1;
    return true;
  }
  if (c.Peek() == '[') {  // a tensor list
    a->list = true;
    a->ndim = -1;
    do {
      Arg inner;
      if (!ParseShape(c, &inner)) return false;
      if (inner.ndim >= 0) a->numel += inner.numel;
    } while (c.Eat(','));
    return c.Eat(']');
  }
  a->ndim = 0;
  a->numel = 1;
  do {
    int64_t v = 0;
    if (!c.Number(&v)) return false;
    if (a->ndim < kMaxDims) a->dims[a->ndim++] = v;
    a->numel *= static_cast<double>(std::max<int64_t>(v, 0));
  } while (c.Eat(','));
  return c.Eat(']');
}

bool ParseInputs(std::string_view shapes, std::string_view types, Inputs* in) {
  Cursor c(shapes);
  if (!c.Eat('[')) return false;
  if (!c.Eat(']')) {
    do {
      Arg a;
      if (!ParseShape(c, &a)) return false;
      if (in->n < kMaxArgs) in->a[in->n++] = a;
    } while (c.Eat(','));
    if (!c.Eat(']')) return false;
  }
  Cursor t(types);
  if (t.Eat('[') && !t.Eat(']')) {
    int i = 0;
    do {
      if (t.Eat('"')) {
        std::string_view dtype = t.String();
        if (i < in->n) {
          Arg& a = in->a[i];
          a.elem = ElementBytes(dtype);
          a.fp8 = dtype.find("Float8") != std::string_view::npos;
          a.dbl = dtype == "double";
          a.floating = a.fp8 || a.dbl || dtype == "float" || dtype.find("Half") != std::string_view::npos ||
                       dtype.find("BFloat16") != std::string_view::npos;
          // A "[]" shape with a dtype is a 0-d tensor; without one it is not a tensor.
          if (a.elem == 0 && !a.list && a.ndim == 0) a.ndim = -1;
        }
      } else {
        t.SkipValue();
      }
      ++i;
    } while (t.Eat(','));
    for (; i < in->n; ++i) {
      if (in->a[i].ndim == 0) in->a[i].ndim = -1;
    }
  } else {
    for (int i = 0; i < in->n; ++i) {
      if (in->a[i].ndim == 0) in->a[i].ndim = -1;
    }
  }
  return true;
}

// ---------------------------------------------------------------------------
// Names.

std::string_view BaseName(std::string_view name) {
  size_t p = name.rfind("::");
  if (p != std::string_view::npos) name = name.substr(p + 2);
  return name;
}

bool OneOf(std::string_view s, std::initializer_list<std::string_view> names) {
  for (std::string_view n : names) {
    if (s == n) return true;
  }
  return false;
}

Precision PrecisionOf(const Arg& a, bool conv) {
  if (a.fp8) return Precision::kFp8;
  if (a.elem == 2 && a.floating) return Precision::kHalf;
  if (a.dbl) return Precision::kFp64;
  if (a.elem == 4 && a.floating) return conv ? Precision::kTf32 : Precision::kFp32;
  if (a.elem > 0) return Precision::kInteger;
  return Precision::kUnknown;
}

// The elements of the largest tensor input: the operator's "main" tensor.
const Arg* Largest(const Inputs& in) {
  const Arg* best = nullptr;
  for (int i = 0; i < in.n; ++i) {
    if (in.a[i].tensor() && (best == nullptr || in.a[i].numel > best->numel)) best = &in.a[i];
  }
  return best;
}

double SumTensorBytes(const Inputs& in, int fallback_elem) {
  double b = 0;
  for (int i = 0; i < in.n; ++i) {
    if (in.a[i].tensor()) b += in.a[i].Bytes(fallback_elem);
  }
  return b;
}

// ---------------------------------------------------------------------------
// Per-kind estimates. Each returns false when the shapes do not fit.

bool Gemm(double batch, double m, double n, double k, int elem, OpCost* c) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return false;
  c->kind = OpKind::kMatmul;
  c->flops = 2.0 * batch * m * n * k;
  c->bytes = static_cast<double>(elem) * batch * (m * k + k * n + m * n);
  c->tokens = batch * m;
  return true;
}

bool Matmul(std::string_view base, const Inputs& in, OpCost* c) {
  const int e = in[0].elem > 0 ? in[0].elem : 2;
  if (base == "mm" || base == "_scaled_mm") {
    const Arg &a = in[0], &b = in[1];
    if (a.ndim != 2 || b.ndim != 2) return false;
    if (!Gemm(1, a.dims[0], b.dims[1], a.dims[1], e, c)) return false;
    c->bytes = a.Bytes(e) + b.Bytes(e) + static_cast<double>(a.dims[0]) * b.dims[1] * e;
    c->weight_bytes = b.Bytes(e);
    c->tokens = static_cast<double>(a.dims[0]);
    return true;
  }
  if (base == "addmm") {
    const Arg &bias = in[0], &a = in[1], &b = in[2];
    if (a.ndim != 2 || b.ndim != 2) return false;
    if (!Gemm(1, a.dims[0], b.dims[1], a.dims[1], e, c)) return false;
    const double mn = static_cast<double>(a.dims[0]) * b.dims[1];
    c->flops += mn;
    c->bytes = a.Bytes(e) + b.Bytes(e) + mn * e + (bias.tensor() ? bias.Bytes(e) : 0);
    c->weight_bytes = b.Bytes(e) + (bias.tensor() && bias.ndim == 1 ? bias.Bytes(e) : 0);
    c->tokens = static_cast<double>(a.dims[0]);
    return true;
  }
  if (base == "linear") {
    const Arg &x = in[0], &w = in[1], &bias = in[2];
    if (x.ndim < 1 || w.ndim != 2) return false;
    const double m = x.Leading(1);
    if (!Gemm(1, m, w.dims[0], w.dims[1], e, c)) return false;
    c->bytes = x.Bytes(e) + w.Bytes(e) + m * w.dims[0] * e;
    c->weight_bytes = w.Bytes(e);
    if (bias.tensor()) {
      c->flops += m * w.dims[0];
      c->bytes += bias.Bytes(e);
      c->weight_bytes += bias.Bytes(e);
    }
    c->tokens = m;
    return true;
  }
  if (base == "matmul") {
    const Arg &a = in[0], &b = in[1];
    if (a.ndim < 1 || b.ndim < 1) return false;
    if (b.ndim <= 2) {  // x @ W: a linear layer without bias
      const double m = a.ndim == 1 ? 1 : a.Leading(1);
      const double k = static_cast<double>(a.dim(-1));
      const double n = b.ndim == 1 ? 1 : static_cast<double>(b.dims[1]);
      if (!Gemm(1, m, n, k, e, c)) return false;
      c->weight_bytes = b.Bytes(e);
      c->tokens = m;
      return true;
    }
    const double batch = std::max(a.Leading(2), b.Leading(2));
    return Gemm(batch, static_cast<double>(a.dim(-2)), static_cast<double>(b.dim(-1)),
                static_cast<double>(a.dim(-1)), e, c);
  }
  if (base == "bmm") {
    const Arg &a = in[0], &b = in[1];
    if (a.ndim != 3 || b.ndim != 3) return false;
    return Gemm(a.dims[0], a.dims[1], b.dims[2], a.dims[2], e, c);
  }
  if (base == "baddbmm") {
    const Arg &a = in[1], &b = in[2];
    if (a.ndim != 3 || b.ndim != 3) return false;
    if (!Gemm(a.dims[0], a.dims[1], b.dims[2], a.dims[2], e, c)) return false;
    const double bmn = static_cast<double>(a.dims[0]) * a.dims[1] * b.dims[2];
    c->flops += bmn;
    c->bytes += in[0].tensor() ? in[0].Bytes(e) : 0;
    return true;
  }
  return false;
}

// Argument `index` of Kineto's "Concrete Inputs" (["","","[2, 2]","1"]): the
// recorded string, empty when not recorded.
std::string_view ConcreteValue(std::string_view concrete, int index) {
  Cursor c(concrete);
  if (!c.Eat('[')) return {};
  for (int i = 0; i < index; ++i) {
    if (!c.SkipValue() || !c.Eat(',')) return {};
  }
  return c.Eat('"') ? c.String() : std::string_view();
}

// An int list "[2, 2]" or an int "2" at argument `index`. Returns the number
// of values read (0: not recorded).
int ConcreteInts(std::string_view concrete, int index, int64_t* out, int max) {
  Cursor v(ConcreteValue(concrete, index));
  const bool list = v.Eat('[');
  int n = 0;
  do {
    while (v.Eat(' ')) {
    }
    int64_t x = 0;
    if (!v.Number(&x)) return n;
    if (n < max) out[n++] = x;
  } while (list && v.Eat(','));
  return n;
}

// Whether element `element` of the bool list at argument `index` ("[True,
// True, False]") was recorded as False.
bool ConcreteFalse(std::string_view concrete, int index, int element) {
  const std::string_view value = ConcreteValue(concrete, index);
  int seen = 0;
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] == 'T' || value[i] == 'F') {
      if (seen++ == element) return value[i] == 'F';
      while (i < value.size() && value[i] != ',') ++i;
    }
  }
  return false;
}

// Positions of stride, padding and dilation in a convolution's arguments, -1
// where the schema has none. aten::convolution(input, weight, bias, stride,
// padding, dilation, transposed, output_padding, groups); conv2d(input, weight,
// bias, stride, padding, dilation, groups); cudnn_convolution(self, weight,
// padding, stride, dilation, groups, ...); miopen_convolution(self, weight,
// bias, padding, stride, dilation, groups, ...).
struct ConvArgPositions {
  int stride = -1, padding = -1, dilation = -1;
};

ConvArgPositions ForwardConvArgs(std::string_view base) {
  if (base.rfind("cudnn_convolution", 0) == 0) return {3, 2, 4};
  if (base.rfind("miopen_convolution", 0) == 0) return {4, 3, 5};
  return {3, 4, 5};
}

// Output spatial size along dimension `i` (0-based among spatial dims) of a
// forward convolution: floor((in + 2p - d(k-1) - 1) / s) + 1 with the recorded
// stride, padding and dilation. Unrecorded, stride 1 with "same" padding is
// assumed (out = in): exact for most layers, an overestimate for strided ones.
double ConvOutputSize(int64_t in, int64_t k, int i, std::string_view concrete, ConvArgPositions pos) {
  int64_t stride[kMaxDims], padding[kMaxDims], dilation[kMaxDims];
  const int ns = pos.stride >= 0 ? ConcreteInts(concrete, pos.stride, stride, kMaxDims) : 0;
  const int np = pos.padding >= 0 ? ConcreteInts(concrete, pos.padding, padding, kMaxDims) : 0;
  const int nd = pos.dilation >= 0 ? ConcreteInts(concrete, pos.dilation, dilation, kMaxDims) : 0;
  // conv2d's padding may be the string "valid" (none) or "same".
  const bool valid = pos.padding >= 0 && ConcreteValue(concrete, pos.padding) == "valid";
  const int64_t s = ns > 0 ? stride[std::min(i, ns - 1)] : 1;
  if (s <= 0 || (ns == 0 && np == 0 && !valid)) return static_cast<double>(in);
  if (np == 0 && !valid) return static_cast<double>((in + s - 1) / s);  // "same" padding, strided
  const int64_t p = valid ? 0 : padding[std::min(i, np - 1)];
  const int64_t d = nd > 0 ? dilation[std::min(i, nd - 1)] : 1;
  const int64_t out = (in + 2 * p - d * (k - 1) - 1) / s + 1;
  return static_cast<double>(std::max<int64_t>(out, 0));
}

// FLOPs of one pass of a convolution: 2 x output elements x (C_in / groups) x
// kernel volume, from the output grad (or output) `y` [N, C_out, spatial...]
// and the weight `w` [C_out, C_in/groups, kernel...]. Groups need no argument:
// the weight's second dimension already is C_in / groups.
double ConvPassFlops(double y_numel, const Arg& w) {
  double kernel = 1;
  for (int i = 2; i < w.ndim; ++i) kernel *= static_cast<double>(w.dims[i]);
  return 2.0 * y_numel * static_cast<double>(w.dims[1]) * kernel;
}

// Elements of a [N, C, spatial...] tensor with `channels` channels in place of C.
double WithChannels(const Arg& t, double channels) {
  return t.dims[1] > 0 ? t.numel / static_cast<double>(t.dims[1]) * channels : 0;
}

// The output shape the trace showed elsewhere (OpContext::output_shape), if it
// fits input `x` and weight `w`: same rank, batch and output channels.
bool KnownOutput(std::string_view output_shape, const Arg& x, const Arg& w, Arg* y) {
  Cursor c(output_shape);
  if (output_shape.empty() || !ParseShape(c, y)) return false;
  return y->ndim == x.ndim && y->dims[0] == x.dims[0] && y->dims[1] == w.dims[0];
}

bool ConvolutionForward(std::string_view base, const Inputs& in, const OpContext& ctx, OpCost* c) {
  const Arg &x = in[0], &w = in[1];
  if (x.ndim < 3 || w.ndim != x.ndim) return false;
  const std::string_view concrete = ctx.concrete_inputs;
  const int e = x.elem > 0 ? x.elem : 2;
  // Transposed: the weight is [C_in, C_out/groups, kernel...] and each input
  // element is scattered over the kernel, so x plays the output's role in
  // ConvPassFlops; the output is taken at the input's spatial size.
  const bool transposed = ContainsIgnoringCase(base, "transpose");
  double out_elems = 0;
  Arg y;
  if (!transposed && KnownOutput(ctx.output_shape, x, w, &y)) {
    out_elems = y.numel;
  } else if (transposed) {
    out_elems = WithChannels(x, static_cast<double>(w.dims[1]));
  } else {
    const ConvArgPositions pos = ForwardConvArgs(base);
    out_elems = static_cast<double>(x.dims[0]) * static_cast<double>(w.dims[0]);
    for (int i = 2; i < x.ndim; ++i) out_elems *= ConvOutputSize(x.dims[i], w.dims[i], i - 2, concrete, pos);
  }
  const double flops = ConvPassFlops(transposed ? x.numel : out_elems, w);
  if (flops <= 0) return false;
  c->flops = flops;
  c->bytes = x.Bytes(e) + w.Bytes(e) + out_elems * e;
  c->weight_bytes = w.Bytes(e);
  c->tokens = static_cast<double>(x.dims[0]);
  c->precision = PrecisionOf(x, true);
  return true;
}

// The weight of a convolution backward: its own weight argument, or for
// cudnn_convolution_backward_weight (whose weight_size int list the profiler
// does not record) the enclosing convolution backward's weight tensor.
bool BackwardWeight(std::string_view base, const Inputs& in, const OpContext& ctx, Arg* w) {
  if (base == "cudnn_convolution_backward_weight" || base == "miopen_convolution_backward_weight") {
    // (weight_size, grad_output, self, padding, stride, dilation, groups, ...)
    int64_t dims[kMaxDims];
    const int n = ConcreteInts(ctx.concrete_inputs, 0, dims, kMaxDims);
    if (n == in[1].ndim) {
      w->ndim = n;
      w->numel = 1;
      for (int i = 0; i < n; ++i) {
        w->dims[i] = dims[i];
        w->numel *= static_cast<double>(dims[i]);
      }
      w->elem = in[1].elem;
      return true;
    }
    const std::string_view parent = BaseName(ctx.parent_name);
    Inputs p;
    if (ctx.parent_shapes.empty() || !ParseInputs(ctx.parent_shapes, "", &p)) return false;
    // cudnn_convolution_backward(self, grad_output, weight, ...) and
    // convolution_backward(grad_output, input, weight, ...) both hold it third.
    if (parent != "cudnn_convolution_backward" && parent != "convolution_backward" &&
        parent != "miopen_convolution_backward") {
      return false;
    }
    *w = p[2];
    w->elem = in[1].elem;
    return w->ndim == in[1].ndim;
  }
  // cudnn_convolution_backward_input(self_size, grad_output, weight, ...),
  // cudnn_convolution_backward(self, grad_output, weight, ...),
  // convolution_backward(grad_output, input, weight, ...).
  *w = in[2];
  return w->ndim >= 3;
}

// Backward: the data gradient (dy, w -> dx) and the weight gradient (dy, x ->
// dw) each cost one forward pass; output_mask, when recorded, drops the ones
// not computed (the first layer has no data gradient).
bool ConvolutionBackward(std::string_view base, const Inputs& in, const OpContext& ctx, OpCost* c) {
  const bool input_part = base.ends_with("backward_input");
  const bool weight_part = base.ends_with("backward_weight");
  // grad_output and input positions by schema (see BackwardWeight).
  const bool cudnn_order = base.rfind("cudnn_", 0) == 0 || base.rfind("miopen_", 0) == 0;
  const Arg& dy = cudnn_order ? in[1] : in[0];
  const Arg& x = cudnn_order ? (weight_part ? in[2] : in[0]) : in[1];
  Arg w;
  if (dy.ndim < 3 || !BackwardWeight(base, in, ctx, &w) || w.ndim != dy.ndim) return false;
  const int e = dy.elem > 0 ? dy.elem : 2;
  const double pass = ConvPassFlops(dy.numel, w);
  if (pass <= 0) return false;
  // output_mask is argument 10 of both convolution_backward and
  // cudnn_convolution_backward.
  constexpr int kOutputMask = 10;
  const bool data = !weight_part && !ConcreteFalse(ctx.concrete_inputs, kOutputMask, 0);
  const bool weight = !input_part && !ConcreteFalse(ctx.concrete_inputs, kOutputMask, 1);
  // dx has the input's size: the input itself, or (backward_input, whose input
  // is an unrecorded size) C_in = w[1] channels (groups 1) at the output's
  // spatial size, a lower bound.
  const double dx = x.ndim == dy.ndim ? x.Bytes(e) : WithChannels(dy, static_cast<double>(w.dims[1])) * e;
  c->flops = (data ? pass : 0) + (weight ? pass : 0);
  c->bytes = (data ? dy.Bytes(e) + w.Bytes(e) + dx : 0) + (weight ? dy.Bytes(e) + dx + w.Bytes(e) : 0);
  c->weight_bytes = (data ? w.Bytes(e) : 0) + (weight ? w.Bytes(e) : 0);
  c->tokens = static_cast<double>(dy.dims[0]);
  c->precision = PrecisionOf(dy, true);
  return c->flops > 0;
}

bool Convolution(std::string_view base, const Inputs& in, const OpContext& ctx, OpCost* c) {
  c->kind = OpKind::kConvolution;
  return ContainsIgnoringCase(base, "backward") ? ConvolutionBackward(base, in, ctx, c)
                                                 : ConvolutionForward(base, in, ctx, c);
}

// Variable-length layout: q [total_q, H, D], k and v [total_k, H_kv, D]. With
// cu_seqlens (the first 1-D integer tensor after v, B + 1 offsets) the FLOPs
// of B sequences of equal length, total_q x total_k / B per head: a lower
// bound, since sum(sq_i x sk_i) >= total_q x total_k / B when the lengths
// agree as in self-attention. Without it (paged decode: the KV context is a
// cache the inputs do not describe) only the bytes of the listed tensors.
bool VarlenAttention(const Inputs& in, int qi, bool backward, OpCost* c) {
  const Arg &q = in[qi], &k = in[qi + 1], &v = in[qi + 2];
  const int e = q.elem > 0 ? q.elem : 2;
  const double tq = static_cast<double>(q.dims[0]);
  const double tk = static_cast<double>(k.dims[0]);
  c->tokens = tq;
  const double d = static_cast<double>(q.dims[2]);
  const double dv = v.ndim == 3 ? static_cast<double>(v.dims[2]) : d;
  const double qo = tq * static_cast<double>(q.dims[1]) * (d + dv) * e;
  const double kv = tk * static_cast<double>(k.dims[1]) * (d + dv) * e;
  c->bytes = backward ? 2.0 * (qo + kv) + qo : qo + kv;
  const Arg* cu_seqlens = nullptr;
  for (int i = qi + 3; i < in.n && cu_seqlens == nullptr; ++i) {
    const Arg& a = in.a[i];
    if (a.ndim == 1 && !a.floating && a.elem >= 4 && a.dims[0] >= 2) cu_seqlens = &a;
  }
  if (cu_seqlens == nullptr) return true;
  const double sequences = static_cast<double>(cu_seqlens->dims[0] - 1);
  double fwd = 2.0 * static_cast<double>(q.dims[1]) * tq * tk / sequences * (d + dv);
  if (tq == tk) fwd *= 0.5;  // causal, as for Attention's dense layouts
  c->flops = backward ? 2.5 * fwd : fwd;
  c->decode = tq <= 16 * sequences && tk > 4 * tq;
  return true;
}

// q, k in layout [B, H, S, D] ("bhsd") or [B, S, H, D] ("bshd").
bool Attention(std::string_view base, const Inputs& in, OpCost* c) {
  const bool backward = ContainsIgnoringCase(base, "backward");
  // aten::_scaled_dot_product_* take [B, H, S, D]; the kernels' own entry
  // points (_flash_attention_forward, _efficient_attention_forward, flash_attn)
  // take [B, S, H, D].
  const bool bshd = !ContainsIgnoringCase(base, "scaled_dot_product") &&
                    (ContainsIgnoringCase(base, "flash_attention") || ContainsIgnoringCase(base, "efficient_attention") ||
                     ContainsIgnoringCase(base, "flash_attn"));
  // Backward ops take grad_out first: (dout, q, k, v, out, ...).
  const int qi = backward ? 1 : 0;
  const Arg &q = in[qi], &k = in[qi + 1], &v = in[qi + 2];
  c->kind = OpKind::kAttention;
  c->precision = PrecisionOf(q, false);
  const int e = q.elem > 0 ? q.elem : 2;
  if (q.ndim == 3 && k.ndim == 3) return VarlenAttention(in, qi, backward, c);
  if (q.ndim != 4 || k.ndim != 4) return false;
  double b, h, sq, d, hkv, skv;
  if (bshd) {
    b = q.dims[0], sq = q.dims[1], h = q.dims[2], d = q.dims[3];
    skv = k.dims[1], hkv = k.dims[2];
  } else {
    b = q.dims[0], h = q.dims[1], sq = q.dims[2], d = q.dims[3];
    hkv = k.dims[1], skv = k.dims[2];
  }
  const double dv = v.ndim == 4 ? static_cast<double>(v.dims[3]) : d;
  // Two GEMMs (QK^T and PV); causal masking (assumed when the query and key
  // lengths agree, as in training and prefill of decoders) halves them.
  double fwd = 2.0 * b * h * sq * skv * (d + dv);
  if (sq == skv && sq > 1) fwd *= 0.5;
  const double qo = b * h * sq * (d + dv) * e;
  const double kv = b * hkv * skv * (d + dv) * e;
  c->flops = backward ? 2.5 * fwd : fwd;
  c->bytes = backward ? 2.0 * (qo + kv) + qo : qo + kv;
  c->tokens = b * sq;
  c->decode = sq <= 16 && skv > 4 * sq;
  return fwd > 0;
}

bool Elementwise(std::string_view base, const Inputs& in, OpCost* c) {
  const Arg* big = Largest(in);
  if (big == nullptr) return false;
  const int e = big->elem > 0 ? big->elem : 2;
  c->kind = OpKind::kElementwise;
  c->precision = PrecisionOf(*big, false);
  if (base == "fill_" || base == "zero_" || base == "zeros_like" || base == "ones_like" ||
      base == "full") {
    c->bytes = big->Bytes(e);
    return true;
  }
  if (base == "index_copy_" || base == "index_put_" || base == "_unsafe_index_put" ||
      base == "index_add_" || base == "scatter_" || base == "index_copy") {
    // Only the source rows move: read the source, write as many into self.
    const Arg* src = nullptr;
    for (int i = in.n - 1; i >= 1 && src == nullptr; --i) {
      if (in.a[i].tensor() && in.a[i].floating) src = &in.a[i];
    }
    if (src == nullptr) return false;
    c->bytes = 2.0 * src->Bytes(e);
    return true;
  }
  double input_bytes = SumTensorBytes(in, e);
  if (base == "copy_" || base == "cat" || base == "stack" || base == "_cat") {
    // copy_(dst, src): dst is written, src read. cat: the list is read and
    // written once more.
    c->bytes = base == "copy_" ? input_bytes : 2.0 * input_bytes;
    return true;
  }
  const bool transcendental = ContainsIgnoringCase(base, "silu") || ContainsIgnoringCase(base, "gelu") ||
                              ContainsIgnoringCase(base, "exp") || ContainsIgnoringCase(base, "log") ||
                              ContainsIgnoringCase(base, "tanh") || ContainsIgnoringCase(base, "sigmoid") ||
                              ContainsIgnoringCase(base, "erf") || ContainsIgnoringCase(base, "softplus");
  c->flops = big->numel * (transcendental ? 4.0 : 1.0);
  c->bytes = input_bytes + big->Bytes(e);  // inputs read, the broadcast result written
  return true;
}

bool Normalization(std::string_view base, const Inputs& in, OpCost* c) {
  const Arg* big = Largest(in);
  if (big == nullptr) return false;
  const int e = big->elem > 0 ? big->elem : 2;
  const double n = big->numel;
  double params = 0;  // weights, biases, running statistics
  int activations = 0;  // tensors of the activation's size among the inputs
  for (int i = 0; i < in.n; ++i) {
    if (!in.a[i].tensor()) continue;
    if (in.a[i].numel == n) {
      ++activations;
    } else {
      params += in.a[i].Bytes(e);
    }
  }
  const bool backward = ContainsIgnoringCase(base, "backward");
  c->kind = OpKind::kNormalization;
  c->precision = PrecisionOf(*big, false);
  // Forward reads x (and a residual for the fused add variants) and writes y
  // (and the updated residual): 2 passes per activation-sized input. Backward
  // reads x and dy and writes dx: 3 passes, parameters read and their
  // gradients written.
  const double passes = backward ? 3.0 : std::max(2.0, 2.0 * activations);
  c->bytes = passes * n * e + (backward ? 2.0 : 1.0) * params;
  c->flops = (backward ? 8.0 : 5.0) * n;
  c->weight_bytes = params;
  return true;
}

bool Softmax(std::string_view base, const Inputs& in, OpCost* c) {
  const Arg* big = Largest(in);
  if (big == nullptr) return false;
  const int e = big->elem > 0 ? big->elem : 2;
  const bool backward = ContainsIgnoringCase(base, "backward");
  c->kind = OpKind::kSoftmax;
  c->precision = PrecisionOf(*big, false);
  c->bytes = (backward ? 3.0 : 2.0) * big->numel * e;
  c->flops = 5.0 * big->numel;
  return true;
}

bool Embedding(std::string_view base, const Inputs& in, OpCost* c) {
  c->kind = OpKind::kEmbedding;
  if (ContainsIgnoringCase(base, "backward")) {
    const Arg& grad = in[0];
    if (!grad.tensor()) return false;
    const int e = grad.elem > 0 ? grad.elem : 2;
    c->bytes = 2.0 * grad.Bytes(e);
    c->tokens = grad.Leading(1);
    return true;
  }
  // embedding(weight [V, H], indices [...]); index_select(self [V, H], dim, index [T]).
  const Arg& table = in[0];
  const Arg* index = nullptr;
  for (int i = 1; i < in.n && index == nullptr; ++i) {
    if (in.a[i].tensor()) index = &in.a[i];
  }
  if (table.ndim != 2 || index == nullptr) return false;
  const int e = table.elem > 0 ? table.elem : 2;
  const double rows = index->numel;
  c->bytes = 2.0 * rows * table.dims[1] * e + index->Bytes(8);
  c->tokens = rows;
  c->precision = PrecisionOf(table, false);
  return true;
}

bool Reduction(const Inputs& in, OpCost* c) {
  const Arg* big = Largest(in);
  if (big == nullptr) return false;
  const int e = big->elem > 0 ? big->elem : 2;
  c->kind = OpKind::kReduction;
  c->precision = PrecisionOf(*big, false);
  c->bytes = big->Bytes(e);
  c->flops = big->numel;
  return true;
}

bool Communication(const Inputs& in, OpCost* c) {
  c->kind = OpKind::kCommunication;
  double bytes = 0;
  double numel = 0;
  for (int i = 0; i < in.n; ++i) {
    if (!in.a[i].tensor()) continue;
    // Collectives usually take one tensor (or a list); the message is the largest.
    if (in.a[i].numel > numel) {
      numel = in.a[i].numel;
      bytes = in.a[i].Bytes(2);  // a tensor list has no dtype: bf16 assumed
    }
  }
  c->bytes = bytes;
  c->flops = numel;  // the reduction's additions
  return bytes > 0;
}

bool IsCommunicationOp(std::string_view name) {
  if (name.rfind("c10d::", 0) == 0 || name.rfind("nccl:", 0) == 0 ||
      name == "record_param_comms") {
    return true;
  }
  return ContainsAny(name, {"all_reduce", "allreduce", "all_gather", "allgather",
                            "reduce_scatter", "all_to_all", "alltoall"});
}

// Dense optimizer steps, which touch every parameter they are given. Sparse
// ones fused into an embedding lookup (fbgemm's split_embedding_codegen_
// lookup_rowwise_adagrad...) touch only the rows their indices name, which
// the shapes do not tell: not costed.
bool IsOptimizerOp(std::string_view name) {
  return ContainsAny(name, {"adam", "_foreach_", "optimizer", "sgd", "lamb", "adagrad",
                            "rmsprop"}) &&
         !ContainsAny(name, {"embedding", "lookup"});
}

}  // namespace

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kUnknown: return "unknown";
    case OpKind::kMatmul: return "matmul";
    case OpKind::kConvolution: return "convolution";
    case OpKind::kAttention: return "attention";
    case OpKind::kElementwise: return "elementwise";
    case OpKind::kNormalization: return "normalization";
    case OpKind::kSoftmax: return "softmax";
    case OpKind::kEmbedding: return "embedding";
    case OpKind::kReduction: return "reduction";
    case OpKind::kCommunication: return "communication";
    case OpKind::kOptimizer: return "optimizer";
  }
  return "unknown";
}

int ElementBytes(std::string_view t) {
  if (t.empty() || t == "Scalar" || t == "ScalarList" || t == "TensorList" || t == "GenericList" ||
      t == "None" || t == "Device" || t == "Layout") {
    return 0;
  }
  if (t.find("Float8") != std::string_view::npos) return 1;
  if (t.find("BFloat16") != std::string_view::npos || t.find("Half") != std::string_view::npos ||
      t == "short int" || t == "short" || t == "int16") {
    return 2;
  }
  if (t.find("complex<double>") != std::string_view::npos) return 16;
  if (t.find("complex") != std::string_view::npos) return 8;
  if (t == "double" || t == "long int" || t == "long" || t == "int64" || t == "long long" ||
      t == "unsigned long") {
    return 8;
  }
  if (t == "float" || t == "int" || t == "unsigned int" || t == "int32") return 4;
  if (t == "bool" || t == "unsigned char" || t == "signed char" || t == "char" ||
      t.find("QInt8") != std::string_view::npos || t.find("QUInt8") != std::string_view::npos) {
    return 1;
  }
  return 0;
}

OpCost EstimateOpCost(std::string_view name, std::string_view shapes, std::string_view types,
                      const OpContext& context) {
  OpCost c;
  const std::string_view base = BaseName(name);
  if (IsCommunicationOp(name)) {
    c.kind = OpKind::kCommunication;
  } else if (IsOptimizerOp(base)) {
    c.kind = OpKind::kOptimizer;
  }
  Inputs in;
  const bool parsed = !shapes.empty() && ParseInputs(shapes, types, &in);
  if (!parsed) {
    // The kind from the name alone still helps the classification.
    if (c.kind == OpKind::kUnknown) {
      if (OneOf(base, {"mm", "addmm", "linear", "matmul", "bmm", "baddbmm", "_scaled_mm"})) {
        c.kind = OpKind::kMatmul;
      } else if (ContainsIgnoringCase(base, "conv")) {
        c.kind = OpKind::kConvolution;
      } else if (ContainsIgnoringCase(base, "attention") || ContainsIgnoringCase(base, "flash_attn")) {
        c.kind = OpKind::kAttention;
      }
    }
    return c;
  }
  if (c.kind == OpKind::kCommunication) {
    if (!Communication(in, &c)) c = OpCost{OpKind::kCommunication};
    return c;
  }
  if (c.kind == OpKind::kOptimizer) {
    c.bytes = 4.0 * SumTensorBytes(in, 4);  // parameters, gradients and two moments
    return c;
  }
  bool ok = false;
  if (OneOf(base, {"mm", "addmm", "linear", "matmul", "bmm", "baddbmm", "_scaled_mm"})) {
    ok = Matmul(base, in, &c);
    if (ok) c.precision = PrecisionOf(in[base == "addmm" || base == "baddbmm" ? 1 : 0], false);
    if (!ok) c.kind = OpKind::kMatmul;
  } else if (ContainsIgnoringCase(base, "conv") && !ContainsIgnoringCase(base, "convert")) {
    ok = Convolution(base, in, context, &c);
    if (!ok) c.kind = OpKind::kConvolution;
  } else if (ContainsIgnoringCase(base, "attention") || ContainsIgnoringCase(base, "flash_attn")) {
    ok = Attention(base, in, &c);
    if (!ok) c = OpCost{OpKind::kAttention};
  } else if (ContainsIgnoringCase(base, "softmax")) {
    ok = Softmax(base, in, &c);
  } else if (ContainsIgnoringCase(base, "norm") && !OneOf(base, {"norm", "linalg_vector_norm", "_foreach_norm",
                                                      "renorm", "normal_"})) {
    ok = Normalization(base, in, &c);
  } else if (OneOf(base, {"embedding", "index_select", "embedding_dense_backward",
                          "embedding_backward"})) {
    ok = Embedding(base, in, &c);
  } else if (OneOf(base, {"sum", "mean", "max", "min", "amax", "amin", "argmax", "argmin", "norm",
                          "linalg_vector_norm", "var", "std", "var_mean", "std_mean", "nll_loss",
                          "nll_loss_forward", "nll_loss2d_forward", "cross_entropy_loss",
                          "mse_loss", "topk", "sort", "cumsum", "logsumexp", "any", "all", "prod",
                          "count_nonzero", "nll_loss_backward"})) {
    ok = Reduction(in, &c);
  } else if (OneOf(base, {"add", "add_", "sub", "sub_", "rsub", "mul", "mul_", "div", "div_",
                          "neg", "exp", "exp_", "log", "log_", "pow", "rsqrt", "sqrt", "sigmoid",
                          "tanh", "relu", "relu_", "gelu", "silu", "silu_", "silu_backward",
                          "gelu_backward", "threshold_backward", "sigmoid_backward",
                          "tanh_backward", "where", "masked_fill", "masked_fill_", "clamp",
                          "clamp_", "copy_", "_to_copy", "clone", "contiguous", "fill_", "zero_",
                          "cat", "_cat", "stack", "index_copy_", "index_copy", "index_put_",
                          "_unsafe_index_put", "index_add_", "scatter_", "slice_backward",
                          "select_backward", "dropout", "native_dropout",
                          "native_dropout_backward", "abs", "maximum", "minimum", "erf", "cos",
                          "sin", "reciprocal", "rotary_embedding", "addcmul", "addcmul_",
                          "addcdiv", "addcdiv_", "lerp", "lerp_", "silu_and_mul", "gelu_and_mul",
                          "static_scaled_fp8_quant", "scaled_fp8_quant",
                          "dynamic_scaled_fp8_quant", "hardtanh", "leaky_relu", "elu",
                          "softplus", "zeros_like", "ones_like", "full", "bitwise_and",
                          "bitwise_or", "eq", "ne", "gt", "lt", "ge", "le", "logical_not",
                          "sign", "floor", "ceil", "round", "_softmax_backward_data"})) {
    ok = Elementwise(base, in, &c);
  }
  if (!ok && c.kind != OpKind::kMatmul && c.kind != OpKind::kConvolution &&
      c.kind != OpKind::kAttention) {
    c = OpCost{};
  }
  return c;
}

namespace {

// The top-level elements of a compact JSON array, up to `max`.
int SplitTopLevel(std::string_view array, std::string_view* out, int max) {
  if (array.size() < 2 || array.front() != '[') return 0;
  int n = 0, depth = 0;
  size_t begin = 1;
  for (size_t i = 1; i < array.size(); ++i) {
    const char ch = array[i];
    if (ch == '[') ++depth;
    if (ch == ']' && depth-- == 0) {
      if (i > begin && n < max) out[n++] = array.substr(begin, i - begin);
      break;
    }
    if (ch == ',' && depth == 0) {
      if (n < max) out[n++] = array.substr(begin, i - begin);
      begin = i + 1;
    }
  }
  return n;
}

bool IsTensorShape(std::string_view s) { return s.size() > 2 && s.front() == '[' && s[1] != '['; }

}  // namespace

bool ConvolutionOutputFromBackward(std::string_view name, std::string_view shapes,
                                   std::string* forward_inputs, std::string* output) {
  const std::string_view base = BaseName(name);
  // convolution_backward(grad_output, input, weight, ...);
  // cudnn_/miopen_convolution_backward(self, grad_output, weight, ...).
  int dy, x;
  if (base == "convolution_backward") {
    dy = 0, x = 1;
  } else if (base == "cudnn_convolution_backward" || base == "miopen_convolution_backward") {
    dy = 1, x = 0;
  } else {
    return false;
  }
  std::string_view a[3];
  if (SplitTopLevel(shapes, a, 3) < 3 || !IsTensorShape(a[dy]) || !IsTensorShape(a[x]) ||
      !IsTensorShape(a[2])) {
    return false;
  }
  *forward_inputs = "[" + std::string(a[x]) + "," + std::string(a[2]) + "]";
  *output = std::string(a[dy]);
  return true;
}

bool ConvolutionForwardInputs(std::string_view name, std::string_view shapes, std::string* forward_inputs) {
  const std::string_view base = BaseName(name);
  if (!ContainsIgnoringCase(base, "conv") || ContainsIgnoringCase(base, "backward") ||
      ContainsIgnoringCase(base, "transpose") || ContainsIgnoringCase(base, "convert")) {
    return false;
  }
  std::string_view a[2];
  if (SplitTopLevel(shapes, a, 2) < 2 || !IsTensorShape(a[0]) || !IsTensorShape(a[1])) return false;
  *forward_inputs = "[" + std::string(a[0]) + "," + std::string(a[1]) + "]";
  return true;
}

bool ContainsIgnoringCase(std::string_view s, std::string_view needle) {
  if (needle.empty()) return true;
  if (needle.size() > s.size()) return false;
  const char first = needle[0];
  const char first_upper = static_cast<char>(std::toupper(static_cast<unsigned char>(first)));
  for (size_t i = 0; i + needle.size() <= s.size(); ++i) {
    if (s[i] != first && s[i] != first_upper) continue;
    size_t j = 1;
    while (j < needle.size() &&
           std::tolower(static_cast<unsigned char>(s[i + j])) == needle[j]) {
      ++j;
    }
    if (j == needle.size()) return true;
  }
  return false;
}

bool ContainsAny(std::string_view s, std::initializer_list<std::string_view> needles) {
  for (std::string_view needle : needles) {
    if (ContainsIgnoringCase(s, needle)) return true;
  }
  return false;
}

}  // namespace dynaflow
