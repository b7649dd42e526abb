"""Proves, operator by operator, that a module call keeps the rows of its
batch apart: the condition under which running it once per micro-batch and
stacking the results gives the unsplit call's result.

`RowAudit` is a torch dispatch mode run around one unsplit call (the first
of its kind, `audit_key`: that call runs the original way, so nothing runs
split before the proof). Each tensor that holds rows is tagged with where
they are: (dimension, inner), the dimension whose index is row * inner + j,
with the rows outermost (a batch flattened with its tokens, [rows x tokens,
hidden], has inner = tokens). The inputs' per-row tensors (those `_split`
would cut, and the rows of the state objects it splits) start tagged (0, 1);
parameters, buffers and tensors made inside the call start untagged: the
same for every row.

Every operator on a tagged tensor must have a rule below that says where
the rows go; one without a rule, or one that combines rows (a reduction,
softmax, matmul contraction or index over the rows' dimension, an untagged
tensor paired element by element with the rows that is not the same for
each of them such as `arange(batch)`) ends the proof with one line naming
the operator and the Python line that called it. A value reduced over the
rows may only be read on the host by the guards of `_ROW_GUARDS`, reviewed
to choose between forms that give each row the same result. Modules that
implement transformers' experts interface are taken whole (`_is_experts`).

What the proof covers is the path this call took: a forward whose
operators depend on its inputs' values beyond what `audit_key`
distinguishes is not covered. The batch size passed to an operator on the
rows as a number ends the proof (`check_numbers`); derived from it in
Python first (`1 / x.shape[0]`), it is not seen. Nor are reads of a
tensor's bytes that bypass torch's dispatcher (`tolist()`, `numpy()`) or
kernels launched outside it (an extension's own). torch.compile'd code runs
eagerly under the audit (`_split.watching`), so its operators are seen.
"""

import dataclasses
import enum
import functools
import os
import sys
import weakref

from ._split import _immutable_types, _replay_module, state_adapter


class _Mixed(Exception):
    """The operator combines rows, or has no rule that says it does not."""


# Host reads of values reduced over the rows, reviewed, each seen on the
# transformers models of tests/hf_apply_test.py (and BERT's encoder): the
# first three pick between two forms of an attention mask that give every
# row the same result (no mask, or a mask that masks nothing in that row:
# no padding, no packed sequences), so micro-batches that pick differently
# still compute each row as the unsplit call does; the last only decides
# whether to print a warning about padding.
_ROW_GUARDS = frozenset({
    ("transformers.masking_utils", "_ignore_causal_mask_sdpa"),
    ("transformers.masking_utils", "_ignore_bidirectional_mask_sdpa"),
    ("transformers.masking_utils", "find_packed_sequence_indices"),
    ("transformers.modeling_utils", "warn_if_padding_and_no_attention_mask"),
})

# Schema types of an operator's value arguments (a Python number passed
# for a Tensor argument is a wrapped scalar), as opposed to sizes and dims.
_VALUE_TYPES = frozenset({"Tensor", "number", "Optional[number]"})

REDUCED = "reduced"  # tag of a value reduced over the rows
CUT = "cut"  # tag of a slice of part of the rows of a tensor rows were written into


def _is_experts(module):
    """Whether `module` is a transformers mixture-of-experts experts module
    (its class decorated by transformers.integrations.moe's
    use_experts_implementation): forward(hidden_states, top_k_index,
    top_k_weights) computes each token's output from its own hidden state,
    the experts its router picked and their weights, whichever kernel the
    config selects. Taken whole: its loop over the experts the batch hits
    reads the batch on the host, which no operator rule can prove."""
    forward = type(module).forward
    return getattr(forward, "__globals__", {}).get("__name__") == "transformers.integrations.moe" \
        and getattr(forward, "__name__", "") == "forward"


def _reason(error):
    """Why an operator ends the proof: its rule's reason, or the error that
    kept the audit from following it (an argument form no rule expects)."""
    if isinstance(error, _Mixed):
        return str(error)
    return f"could not be followed by the audit ({type(error).__name__}: {str(error)[:200]})"


def _outside(frame):
    """Whether `frame` runs code outside torch and dynaflow."""
    module = frame.f_globals.get("__name__", "")
    return module.partition(".")[0] not in ("torch", "dynaflow")


def _caller():
    """The first Python frame outside torch and dynaflow (the model's code
    that called the operator), or None."""
    frame = sys._getframe(1)
    while frame is not None and not _outside(frame):
        frame = frame.f_back
    return frame


def _where():
    """The model's line that called the operator: file:line function."""
    frame = _caller()
    if frame is None:
        return "?"
    name = os.path.basename(frame.f_code.co_filename)
    return f"{name}:{frame.f_lineno} {frame.f_code.co_name}"


def _guard_caller():
    """(module, function) of the model's code that called the operator."""
    frame = _caller()
    return (frame.f_globals.get("__name__", ""), frame.f_code.co_name) if frame else ("", "")


def audit_key(module, args, kwargs, batch):
    """What a call's operators may depend on besides its values: the
    module's mode, grad, inference mode and autocast, and the structure of
    its arguments (types, flags, tensors' dtypes, devices, ranks and which of
    their dimensions past the rows are 1: a prefill and a decode step of a
    decoder differ, two decode steps do not), and its config's use_cache (a
    Hugging Face model builds a cache when a call does not say). Calls with
    the same key take the path the audited one took: so that a split takes
    its tensors alike too (cut into rows, shared, or refused), the key says
    whether each one's first dimension is the call's `batch` rows, 1, or
    another size (the row count itself is no part of it). The arguments are
    walked in C++ where the replay module is loaded (plugin/torch/
    call_keys.h, the same key), else by _walk_into."""
    import torch

    key = [module.training, torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
           tuple(d for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)),
           getattr(getattr(module, "config", None), "use_cache", None)]
    native = native_keys()
    if native is not None:
        return native.audit_key(key, args, kwargs, batch, _walk_into)
    _walk_into(key, args, batch)
    _walk_into(key, kwargs, batch)
    return tuple(key)


def _walk_into(key, v, batch):
    """audit_key's walk of value `v`, appended to the list `key`."""
    import torch

    if isinstance(v, torch.Tensor):
        first = v.shape[0] if v.dim() else None
        rows = _ROWS if first == batch else _ONE_ROW if first == 1 else _OTHER_ROWS
        key.append((v.dtype, v.device.type, v.dim(), tuple(s == 1 for s in v.shape[1:]), rows))
    elif v is None or isinstance(v, (bool, str) + _kept_types()):
        key.append(v)
    elif isinstance(v, (int, float)):
        key.append(type(v))
    elif isinstance(v, (tuple, list)):
        key.append((type(v), len(v)))
        for x in v:
            _walk_into(key, x, batch)
    elif isinstance(v, dict):
        for k, x in v.items():
            key.append(k)
            _walk_into(key, x, batch)
    elif (adapter := state_adapter(v)) is not None:
        key.append((type(v), adapter.audit_key(v)))
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
        for f in dataclasses.fields(v):
            key.append(f.name)
            _walk_into(key, getattr(v, f.name), batch)
    else:
        key.append(type(v))


# What a tensor's first dimension is in audit_key (call_keys.h's values).
_OTHER_ROWS, _ROWS, _ONE_ROW = 0, 1, 2


@functools.cache
def _kept_types():
    """What audit_key keeps as itself besides None, bool and str."""
    import torch

    return (enum.Enum, torch.dtype, torch.device)


@functools.cache
def native_keys():
    """The C++ walks of audit_key and _graphs.flatten_inputs (plugin/torch/
    call_keys.h), or None without the replay module."""
    module = _replay_module()
    return None if module is None else module.CallKeys(_immutable_types(), _kept_types())


def make_audit(batch):
    """A RowAudit for a call of `batch` rows (a class made on first use:
    torch is imported lazily)."""
    return _audit_class()(batch)


@functools.cache
def _audit_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.weak import WeakIdKeyDictionary

    aten = torch.ops.aten
    # Operators whose result, or its shape, is computed from their inputs'
    # values on the host (torch.equal, nonzero, masked_select, ...).
    data_dependent = {torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape}

    class RowAudit(TorchDispatchMode):
        # Higher-order operators (flex_attention, cond) come here too, as
        # refusals: unhandled, torch raises into the program.
        supports_higher_order_operators = True

        def __init__(self, batch):
            super().__init__()
            self.batch = batch
            self.tags = WeakIdKeyDictionary()
            # Tensors a factory made in the call (zeros, empty, ...) and the
            # slices taken of them -> a weak reference to the tensor the
            # factory made: rows may be written into them, and then all of
            # them hold rows. Weak: the audit keeps no tensor alive.
            self.fresh = WeakIdKeyDictionary()
            self.slices = WeakIdKeyDictionary()  # factory's tensor -> [weak refs to its slices]
            self.origin = WeakIdKeyDictionary()  # value reduced over the rows -> by what
            self.mixed = None    # the first reason the proof failed
            self.whole = 0       # depth inside a module taken whole
            self.whole_in = None  # the rows' place in its tokens
            # The process groups of the torch.distributed collectives the
            # call issued (note_collective), each once, in order; None for
            # one whose group could not be told.
            self.groups = []

        # Tags ----------------------------------------------------------
        def tag_rows(self, t):
            """Input tensor `t` holds the batch's rows in dimension 0."""
            if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == self.batch:
                self.tags[t] = (0, 1)

        def tag_of(self, t):
            return self.tags.get(t) if isinstance(t, torch.Tensor) else None

        def check_result(self, values, where):
            """After the call: every tensor of `values` (outputs, the state
            objects' tensors) holds its rows in dimension 0, as the merge
            stacks them, or none that differ between rows."""
            for t in values:
                try:
                    self._check_one(t, where)
                except Exception as e:  # noqa: BLE001 - the call's result stands
                    self.fail(f"{where} {_reason(e)}")

        def _check_one(self, t, where):
            tag = self.tag_of(t)
            if tag == CUT:
                self.fail(f"{where} returns part of the rows of a tensor rows were written into")
            elif tag == REDUCED:
                self.fail(f"{where} returns a value reduced over the rows (by "
                          f"{self.origin.get(t, '?')})")
            elif tag is not None and tag[0] != 0:
                self.fail(f"{where} returns its rows in dimension {tag[0]}: the merge "
                          f"stacks dimension 0")
            elif tag is None and t.dim() >= 1 and t.shape[0] == self.batch:
                self.require_uniform(t, 0, 1)

        def note_reduced(self, func, args, kwargs, out):
            """Remembers where each value reduced over the rows came from."""
            made = [o for o in _flatten([out]) if self.tag_of(o) == REDUCED]
            if not made:
                return
            inputs = [self.origin.get(t) for t in _flatten([args, list(kwargs.values())])
                      if isinstance(t, torch.Tensor) and t in self.origin]
            where = inputs[0] if inputs else f"{func.name()} at {_where()}"
            for o in made:
                self.origin[o] = where

        def fail(self, why):
            if self.mixed is None:
                self.mixed = why

        # Modules taken whole -------------------------------------------
        def watch(self, module):
            """Hooks the modules of `module` taken whole; returns the handles."""
            handles = []
            for m in module.modules():
                if _is_experts(m):
                    handles.append(m.register_forward_pre_hook(self._enter_whole,
                                                               with_kwargs=True))
                    handles.append(m.register_forward_hook(self._leave_whole,
                                                           with_kwargs=True, always_call=True))
            return handles

        def _enter_whole(self, module, args, kwargs):
            values = list(args) + [kwargs.get(k) for k in
                                   ("hidden_states", "top_k_index", "top_k_weights") if k in kwargs]
            tags = {self.tag_of(v) for v in values[:3]}
            if len(values) < 3 or len(tags) != 1 or None in tags or REDUCED in tags or \
                    next(iter(tags))[0] != 0:
                self.fail(f"{type(module).__name__} (experts) gets its tokens "
                          f"with rows in different places {sorted(map(str, tags))}")
            self.whole_in = self.tag_of(values[0]) if values else None
            self.whole += 1

        def _leave_whole(self, module, args, kwargs, output):
            self.whole -= 1
            tag = self.whole_in
            if isinstance(output, torch.Tensor) and tag is not None and tag != REDUCED:
                self.tags[output] = tag
            else:
                self.fail(f"{type(module).__name__} (experts) returns a "
                          f"{type(output).__name__}")

        def note_collective(self, func, args, kwargs):
            """Keeps the process group of collective `func`: a c10d operator
            takes it as its first object, a functional collective by name,
            its last string (an operator with neither, wait_tensor, has no
            group)."""
            import torch.distributed as dist

            c10d = func.namespace == "c10d"
            found = [a for a in args if isinstance(a, torch.ScriptObject if c10d else str)]
            if not c10d and "group_name" in kwargs:
                found.append(kwargs["group_name"])
            if not found:
                return
            try:
                group = dist.ProcessGroup.unbox(found[0]) if c10d else \
                    dist.distributed_c10d._resolve_process_group(found[-1])
            except Exception:  # noqa: BLE001 - an operator of another form: group unknown
                group = None
            if all(g is not group and not (g is not None and g == group) for g in self.groups):
                self.groups.append(group)

        # Dispatch --------------------------------------------------------
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if getattr(func, "namespace", "") in ("c10d", "_c10d_functional"):
                self.note_collective(func, args, kwargs)
            if self.whole or self.mixed is not None:
                return func(*args, **kwargs)
            if isinstance(func, torch._ops.HigherOrderOperator):
                # Its body runs outside this mode (popped while it handles one).
                self.fail(f"{func.name()} is a higher-order operator, whose body the audit "
                          f"does not follow (at {_where()})")
                return func(*args, **kwargs)
            try:
                tag_out = self.rule(func, args, kwargs)
            except Exception as e:  # noqa: BLE001 - the call runs on, the proof fails
                self.fail(f"{func.name()} {_reason(e)} (at {_where()})")
                return func(*args, **kwargs)
            out = func(*args, **kwargs)
            if tag_out is not None:
                try:
                    tag_out(out)
                    self.note_reduced(func, args, kwargs, out)
                except Exception as e:  # noqa: BLE001
                    self.fail(f"{func.name()} {_reason(e)} (at {_where()})")
            return out

        def rule(self, func, args, kwargs):
            """Checks the operator against its rule before it runs; returns
            what tags its outputs (None: all untagged), or raises _Mixed."""
            flat = [a for a in _flatten(args) if isinstance(a, torch.Tensor)] + \
                [a for a in _flatten(kwargs.values()) if isinstance(a, torch.Tensor)]
            tags = [self.tag_of(t) for t in flat]
            if all(t is None for t in tags):
                name = func.overloadpacket.__name__
                if name in _FACTORIES:
                    return self.set_fresh
                root = self.root_of(args[0]) if args else None
                if name in ("slice", "narrow", "detach", "alias") and root is not None:
                    return self.slice_fresh(root)
                for t in flat:  # another view of it would hold rows unseen
                    self.unfresh(t)
                return None
            if CUT in tags:
                raise _Mixed("reads part of the rows' dimension of a tensor rows were "
                             "written into")
            self.check_numbers(func, args, kwargs)
            if any(x.alias_info is not None and x.alias_info.is_write and x.kwarg_only
                   for x in func._schema.arguments):
                raise _Mixed("writes into an out= tensor, which the audit does not follow")
            name = func.overloadpacket.__name__
            if REDUCED in tags and name not in _LIST_COLLECTIVES:
                return self.reduced_rule(func, args, kwargs, tags)
            handler = _RULES.get(name)
            if handler is not None:
                return handler(self, func, args, kwargs)
            if data_dependent & set(func.tags) or func is aten.where.default:
                raise _Mixed("computes from its inputs' values what it returns or its shape "
                             "(a value that depends on every row)")
            if torch.Tag.pointwise in func.tags or name in _BROADCASTING:
                return self.broadcast(func, args, kwargs)
            raise _Mixed("has no rule proving that it keeps rows apart")

        def check_numbers(self, func, args, kwargs):
            """Raises _Mixed when an operator on the rows takes the batch size
            as a value (`x / x.shape[0]`): split, each micro-batch would pass
            its own row count. Sizes and dimensions are not values; nor is an
            exponent (`pow(2)` at batch 2 is a square)."""
            schema = func._schema.arguments
            named = list(zip(schema, args)) + \
                [(a, kwargs[a.name]) for a in schema if a.name in kwargs]
            for arg, value in named:
                if type(value) is int and value == self.batch and arg.name != "exponent" and \
                        str(arg.type) in _VALUE_TYPES:
                    raise _Mixed(f"takes the batch size ({value}) as a number: split, each "
                                 f"micro-batch would pass its own row count")

        def reduced_rule(self, func, args, kwargs, tags):
            """A value reduced over the rows goes on only into values
            reduced over the rows, and is read on the host only by a guard
            of _ROW_GUARDS."""
            if any(t is not None and t != REDUCED for t in tags):
                raise _Mixed("combines a value reduced over the rows with the rows")
            written = self.written(func, args, kwargs)
            if written is not None and self.tag_of(written) != REDUCED and \
                    written not in self.fresh:
                raise _Mixed("writes a value reduced over the rows into a tensor made "
                             "before the call")
            if func in (aten._local_scalar_dense.default, aten.is_nonzero.default,
                        aten.item.default) or data_dependent & set(func.tags):
                if _guard_caller() not in _ROW_GUARDS:
                    raise _Mixed(f"reads on the host a value reduced over the rows (by "
                                 f"{self.origin.get(args[0], '?')})")
                if func in (aten._local_scalar_dense.default, aten.is_nonzero.default,
                            aten.item.default):
                    return None
            if written is not None and written in self.fresh:
                return lambda out: self.fill_fresh(written, REDUCED)
            return self.set_all(REDUCED)

        def root_of(self, t):
            ref = self.fresh.get(t) if isinstance(t, torch.Tensor) else None
            return ref() if ref is not None else None

        def writable(self, t, tag):
            """Whether rows (at `tag`) may be written into untagged `t`: a
            tensor made in the call by a factory, or a slice of one that
            keeps the rows' dimension whole."""
            root = self.root_of(t)
            return root is not None and t.dim() == root.dim() and \
                t.shape[tag[0]] == root.shape[tag[0]]

        def family(self, t):
            root = self.root_of(t)
            if root is None:
                return [t]
            return [root] + [v for v in (r() for r in self.slices.get(root, [])) if v is not None]

        def unfresh(self, t):
            for v in self.family(t):
                self.fresh.pop(v, None)
                self.slices.pop(v, None)

        def fill_fresh(self, t, tag):
            """Rows (or a value reduced over them) written into fresh `t`:
            it, the tensor it slices and its other slices hold them; a
            slice that keeps only part of the rows' dimension is cut."""
            family = self.family(t)
            self.unfresh(t)
            root = family[0]
            for v in family:
                whole = tag == REDUCED or (v.dim() == root.dim() and
                                           v.shape[tag[0]] == root.shape[tag[0]])
                self.tags[v] = tag if whole else CUT

        # Output taggers ------------------------------------------------
        def set_fresh(self, out):
            if isinstance(out, torch.Tensor):
                self.fresh[out] = weakref.ref(out)

        def slice_fresh(self, root):
            def tag_out(out):
                self.fresh[out] = weakref.ref(root)
                self.slices.setdefault(root, []).append(weakref.ref(out))
            return tag_out

        def set_all(self, tag):
            def tag_out(out):
                for o in _flatten([out]):
                    if isinstance(o, torch.Tensor):
                        self.tags[o] = tag
            return tag_out

        def set_each(self, tagger):
            """tagger(output tensor) -> tag or None, for each output."""
            def tag_out(out):
                for o in _flatten([out]):
                    if isinstance(o, torch.Tensor):
                        tag = tagger(o)
                        if tag is not None:
                            self.tags[o] = tag
                        else:
                            self.tags.pop(o, None)
            return tag_out

        def written(self, func, args, kwargs):
            """The tensor an in-place operator writes (its first argument), or
            None (out= arguments are refused in `rule`)."""
            schema = func._schema
            if schema.arguments and schema.arguments[0].alias_info is not None and \
                    schema.arguments[0].alias_info.is_write:
                return args[0]
            return None

        # Rules -----------------------------------------------------------
        def require_uniform(self, t, dim, inner):
            """Untagged `t` is paired, along `dim`, with rows of `inner`
            elements each: it must be the same for every row."""
            size = t.shape[dim]
            if size == 1:
                return
            if size != self.batch * inner:
                raise _Mixed(f"pairs rows with a tensor of {size} elements in their dimension")
            from ._split import _capture_underway

            if t.is_cuda and _capture_underway():
                raise _Mixed("pairs rows with a tensor made in the call, which cannot be "
                             "compared while a CUDA graph is captured")
            blocks = t.unflatten(dim, (self.batch, inner))
            first = blocks.narrow(dim, 0, 1)
            if not bool((blocks == first).all()):
                raise _Mixed(f"pairs rows with a tensor of {size} elements made in the call "
                             f"that differs between rows (such as arange(batch))")

        def broadcast(self, func, args, kwargs):
            """Element-wise operators (broadcasting): the rows of every
            tagged input must land in the same output dimension."""
            tensors = [a for a in _flatten([args, list(kwargs.values())])
                       if isinstance(a, torch.Tensor)]
            ndim = max(t.dim() for t in tensors)
            target = None
            for t in tensors:
                tag = self.tag_of(t)
                if tag is None:
                    continue
                where = (tag[0] + ndim - t.dim(), tag[1])
                if target is not None and where != target:
                    raise _Mixed(f"meets rows in dimensions {target[0]} and {where[0]}")
                target = where
            written = self.written(func, args, kwargs)
            if written is not None and written.dim() != ndim:
                raise _Mixed("writes rows into a tensor of another shape")
            # Its other views, or its owner (a parameter, a buffer), would
            # hold rows and not be known to.
            if written is not None and self.tag_of(written) is None and \
                    not self.writable(written, target):
                raise _Mixed("writes rows into a tensor that does not hold rows")
            overwritten = written if func.overloadpacket.__name__ in _OVERWRITE else None
            for t in tensors:
                if self.tag_of(t) is None and t is not overwritten:
                    k = target[0] - (ndim - t.dim())
                    if k >= 0:
                        self.require_uniform(t, k, target[1])
            if written is not None and self.tag_of(written) is None:
                return lambda out: self.fill_fresh(written, target)
            return self.set_all(target)

        def reduce(self, func, args, kwargs, dims, keepdim):
            """Reduction over `dims` (None: all) of args[0]."""
            t = args[0]
            tag = self.tag_of(t)
            if tag is None:
                return self.refuse_other_tags(func, args, kwargs)
            if dims is None or len(dims) == 0:
                dims = list(range(t.dim()))
            dims = sorted(d % max(t.dim(), 1) for d in dims)
            if tag[0] in dims:
                return self.set_all(REDUCED)
            if keepdim:
                return self.set_all(tag)
            d = tag[0] - sum(1 for k in dims if k < tag[0])
            return self.set_all((d, tag[1]))

        def refuse_other_tags(self, func, args, kwargs):
            raise _Mixed("takes rows in an argument it has no rule for")

        def along(self, func, args, kwargs, dim):
            """Same-shaped result computed along `dim` (softmax, cumsum,
            sort, topk): the rows' dimension must not be it."""
            tag = self.tag_of(args[0])
            if tag is None:
                return self.refuse_other_tags(func, args, kwargs)
            if dim % args[0].dim() == tag[0]:
                raise _Mixed(f"computes along dimension {tag[0]}, where the rows are")
            return self.set_all(tag)

    _RULES.update(_rule_table(torch, RowAudit))
    return RowAudit


_RULES = {}

# Operators that make a tensor from sizes and values only.
_FACTORIES = frozenset({"zeros", "ones", "empty", "full", "empty_strided", "new_zeros",
                        "new_ones", "new_empty", "new_full", "new_empty_strided", "empty_like",
                        "zeros_like", "ones_like", "full_like"})

# In-place operators whose result does not read what they overwrite.
_OVERWRITE = frozenset({"copy_", "fill_", "zero_", "uniform_", "normal_", "bernoulli_"})

# Broadcasting operators torch does not tag pointwise.
_BROADCASTING = frozenset({"where", "masked_fill", "masked_fill_", "copy_", "copy", "lerp",
                           "dropout", "feature_dropout", "alpha_dropout", "__and__", "__or__",
                           "__xor__", "__iand__", "__ior__", "__ixor__",
                           "lerp_", "clamp", "clamp_", "clamp_min", "clamp_max", "clamp_min_",
                           "clamp_max_", "_to_copy", "clone", "alias", "detach", "lift_fresh",
                           "lift_fresh_copy", "fill_", "fill", "zero_", "native_dropout",
                           "bernoulli", "bernoulli_", "uniform_", "normal_", "_conj",
                           "_neg_view", "resolve_conj", "resolve_neg",
                           "logical_not", "bitwise_not", "polar", "complex"})


# Batch norms whose argument 5 says training (statistics of the whole batch).
_BATCH_NORMS = frozenset({"native_batch_norm", "batch_norm", "cudnn_batch_norm",
                          "miopen_batch_norm"})


def _flatten(values):
    out = []
    stack = [values]
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple)):
            stack.extend(reversed(v))
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
        else:
            out.append(v)
    return out


def _dims(value):
    if value is None:
        return None
    return [value] if isinstance(value, int) else list(value)


def _rule_table(torch, cls):
    """{aten overload packet name: rule(audit, func, args, kwargs)}."""
    rules = {}

    def add(names, fn):
        for n in names.split():
            rules[n] = fn

    def like(a, func, args, kwargs):  # zeros_like(rows): rows, the same in each
        return a.set_all(a.tag_of(args[0]))

    add("zeros_like ones_like empty_like full_like rand_like randn_like randint_like", like)

    def untagged_factory(a, func, args, kwargs):  # new_zeros(rows, size): size given
        return a.set_fresh

    add("new_zeros new_ones new_empty new_full new_empty_strided", untagged_factory)

    def reduction(a, func, args, kwargs):
        if func._schema.overload_name == "other":  # max(a, b): element-wise
            return a.broadcast(func, args, kwargs)
        schema_args = [x.name for x in func._schema.arguments]
        values = dict(zip(schema_args, args))
        values.update(kwargs)
        dims = values.get("dim")
        return a.reduce(func, args, kwargs, _dims(dims), bool(values.get("keepdim", False)))

    add("sum mean amax amin max min argmax argmin var std var_mean std_mean norm "
        "linalg_vector_norm prod logsumexp any all nansum count_nonzero aminmax", reduction)

    def along_dim(a, func, args, kwargs):
        schema_args = [x.name for x in func._schema.arguments]
        values = dict(zip(schema_args, args))
        values.update(kwargs)
        return a.along(func, args, kwargs, values.get("dim", -1))

    add("_softmax _safe_softmax _log_softmax softmax log_softmax cumsum cumsum_ cumprod topk "
        "sort argsort cummax cummin _softmax_backward_data", along_dim)

    def views(a, func, args, kwargs):
        return a.set_all(_view_tag(a, func, args, kwargs))

    add("view _unsafe_view reshape expand permute transpose t unsqueeze squeeze slice select "
        "narrow split split_with_sizes unbind chunk movedim unflatten flatten view_as "
        "reshape_as expand_as swapaxes swapdims mT mH numpy_T", views)

    def each_view(a, func, args, kwargs):
        tag = _view_tag(a, func, args, kwargs)
        return a.set_all(tag)

    def cat(a, func, args, kwargs):
        tensors = [t for t in args[0] if not (t.dim() == 1 and t.numel() == 0)]
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        ndim = tensors[0].dim()
        dim %= ndim
        tags = {a.tag_of(t) for t in tensors} - {None}
        if len(tags) != 1:
            raise _Mixed("joins rows held in different places")
        tag = tags.pop()
        if tag == REDUCED:
            return a.set_all(REDUCED)
        if dim == tag[0]:
            raise _Mixed(f"joins along dimension {dim}, where the rows are")
        for t in tensors:
            if a.tag_of(t) is None:
                a.require_uniform(t, tag[0], tag[1])
        return a.set_all(tag)

    add("cat", cat)

    def stack(a, func, args, kwargs):
        tensors = args[0]
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        dim %= tensors[0].dim() + 1
        tags = {a.tag_of(t) for t in tensors}
        if len(tags) != 1 or None in tags:
            raise _Mixed("stacks rows with values that are not rows")
        tag = tags.pop()
        return a.set_all((tag[0] + (dim <= tag[0]), tag[1]))

    add("stack", stack)

    def mm(a, func, args, kwargs):
        m1, m2 = (args[1], args[2]) if func.overloadpacket.__name__ in ("addmm", "addmm_") \
            else (args[0], args[1])
        t1, t2 = a.tag_of(m1), a.tag_of(m2)
        if t1 is not None and t2 is not None:
            raise _Mixed("multiplies rows by rows")
        if t1 is not None and t1[0] != 0 or t2 is not None and t2[0] != 1:
            raise _Mixed("contracts over the dimension of the rows")
        tag = t1 if t1 is not None else t2
        if func.overloadpacket.__name__ in ("addmm", "addmm_"):
            bias = args[0]
            tb = a.tag_of(bias)
            if tb is not None and (tb[0] + 2 - bias.dim(), tb[1]) != tag:
                raise _Mixed("adds rows held in another place")
            if tb is None and bias.dim() - 2 + tag[0] >= 0:
                a.require_uniform(bias, tag[0] - (2 - bias.dim()), tag[1])
        return a.set_all(tag)

    add("mm addmm", mm)

    def bmm(a, func, args, kwargs):
        """[n, m, k] x [n, k, p] -> [n, m, p]: rows in n (both sides alike,
        or one side with the other the same for every row), in m or in p."""
        base = func.overloadpacket.__name__ == "baddbmm"
        b1, b2 = (args[1], args[2]) if base else (args[0], args[1])
        t1, t2 = a.tag_of(b1), a.tag_of(b2)
        if t1 is not None and t1[0] == 2 or t2 is not None and t2[0] == 1:
            raise _Mixed("contracts over the dimension of the rows")
        where = {t for t in (t1, t2) if t is not None}
        if len(where) != 1 or (t1 is not None and t2 is not None and t1[0] != 0):
            raise _Mixed("multiplies rows by rows")
        out = where.pop()
        if out[0] == 0:
            for t in (b1, b2):
                if a.tag_of(t) is None:
                    a.require_uniform(t, 0, out[1])
        if base:  # the added input broadcasts against [n, m, p]
            added = args[0]
            ta = a.tag_of(added)
            if ta is not None and (ta[0] + 3 - added.dim(), ta[1]) != out:
                raise _Mixed("adds rows held in another place")
            k = out[0] - (3 - added.dim())
            if ta is None and k >= 0:
                a.require_uniform(added, k, out[1])
        return a.set_all(out)

    add("bmm baddbmm", bmm)

    def attention(a, func, args, kwargs):
        """Scaled dot-product attention kernels: query, key, value
        [..., tokens, head_dim], rows in a leading dimension; the mask
        broadcasts against [..., query tokens, key tokens]."""
        q, k, v = args[0], args[1], args[2]
        tags = [a.tag_of(t) for t in (q, k, v)]
        if len(set(tags)) != 1 or tags[0] is None or tags[0][0] >= q.dim() - 2:
            raise _Mixed("gets query, key and value with rows in different places")
        tag = tags[0]
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 and
                          isinstance(args[3], torch.Tensor) else None)
        if isinstance(mask, torch.Tensor):
            tm = a.tag_of(mask)
            if tm is not None and (tm[0] + q.dim() - mask.dim(), tm[1]) != tag:
                raise _Mixed("gets a mask with rows in another place")
            if tm is None and tag[0] - (q.dim() - mask.dim()) >= 0:
                a.require_uniform(mask, tag[0] - (q.dim() - mask.dim()), tag[1])
        return a.set_each(lambda o: tag if o.dim() > tag[0] and o.dim() >= 2 else None)

    add("_scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_efficient_attention "
        "_scaled_dot_product_flash_attention _scaled_dot_product_cudnn_attention "
        "_flash_attention_forward _efficient_attention_forward scaled_dot_product_attention",
        attention)

    def embedding(a, func, args, kwargs):
        weight, indices = args[0], args[1]
        if a.tag_of(weight) is not None:
            raise _Mixed("looks rows up in a table of rows")
        return a.set_all(a.tag_of(indices))

    add("embedding", embedding)

    def index_select(a, func, args, kwargs):
        """t.index_select(dim, index), index one-dimensional: rows of t off
        `dim` by an index that holds none; or a table that holds none (a
        sinusoidal position table) looked up by an index that holds rows
        (per-row positions), as `embedding` does."""
        t, dim, index = args[0], args[1] % max(args[0].dim(), 1), args[2]
        tag, ti = a.tag_of(t), a.tag_of(index)
        if tag is None:
            return a.set_all((dim, ti[1]))
        if ti is not None:
            raise _Mixed("selects from rows by indices that hold rows")
        if dim == tag[0]:
            raise _Mixed("selects along the dimension of the rows")
        return a.set_all(tag)

    add("index_select", index_select)

    def index(a, func, args, kwargs):
        """Advanced indexing t[i0, i1, ...] of rows with indices that do
        not hold rows, off the rows' dimension, or on it with the identity
        (`arange(batch)`, transformers' padding masks); or an untagged table
        looked up with indices that hold rows (`cos[position_ids]`)."""
        t, indices = args[0], list(args[1])
        tag = a.tag_of(t)
        positions = [k for k, i in enumerate(indices) if i is not None]
        if any(indices[k].dtype == torch.bool for k in positions):
            raise _Mixed("indexes with a boolean mask, which packs the rows it keeps")
        shape = torch.broadcast_shapes(*[indices[k].shape for k in positions])
        adjacent = positions == list(range(positions[0], positions[-1] + 1))
        first = positions[0] if adjacent else 0
        if tag is not None and tag[0] not in positions:
            if any(a.tag_of(indices[k]) is not None for k in positions):
                raise _Mixed("indexes rows with indices that hold rows")
            before = sum(1 for k in positions if k < tag[0])
            d = tag[0] - before + (len(shape) if (not adjacent or tag[0] > positions[0]) else 0)
            return a.set_all((d, tag[1]))
        rows = {}  # broadcast dimension -> inner, of every index that carries rows
        for k in positions:
            i = indices[k]
            ti = a.tag_of(i)
            if ti is not None:
                rows[ti[0] + len(shape) - i.dim()] = ti[1]
        if tag is not None:  # indexed on the rows' dimension: only by the identity
            e = None if a.tag_of(indices[tag[0]]) is not None else \
                _row_identity(indices[tag[0]], a.batch, tag[1])
            if e is None:
                raise _Mixed("indexes the dimension of the rows with other than "
                             "arange(batch)")
            rows.setdefault(e + len(shape) - indices[tag[0]].dim(), 1)
        if len(rows) != 1 or (tag is not None and set(rows.values()) != {1}):
            raise _Mixed("indexes with rows held in different places")
        d, inner = next(iter(rows.items()))
        for k in positions:
            i = indices[k]
            if a.tag_of(i) is None and not (tag is not None and k == tag[0]):
                if d - (len(shape) - i.dim()) >= 0:
                    a.require_uniform(i, d - (len(shape) - i.dim()), inner)
        return a.set_all((first + d, inner))

    add("index", index)

    def index_put(a, func, args, kwargs):
        """t[i0, i1, ...] = values, into rows, at indices that do not hold
        rows, off the rows' dimension; `values` broadcast like the indexed
        part of t, holding its rows in the same place or the same for every
        row."""
        t, indices, values = args[0], list(args[1]), args[2]
        tag = a.tag_of(t)
        positions = [k for k, i in enumerate(indices) if i is not None]
        if tag is None or tag[0] in positions or \
                any(a.tag_of(indices[k]) is not None or indices[k].dtype == torch.bool
                    for k in positions):
            raise _Mixed("writes at positions that differ between rows, or into "
                         "the dimension of the rows")
        shape = torch.broadcast_shapes(*[indices[k].shape for k in positions])
        adjacent = positions == list(range(positions[0], positions[-1] + 1))
        before = sum(1 for k in positions if k < tag[0])
        d = tag[0] - before + (len(shape) if (not adjacent or tag[0] > positions[0]) else 0)
        ndim = t.dim() - len(positions) + len(shape)
        tv = a.tag_of(values)
        if tv is not None and (tv[0] + ndim - values.dim(), tv[1]) != (d, tag[1]):
            raise _Mixed("writes rows into the rows of another place")
        if tv is None and d - (ndim - values.dim()) >= 0:
            a.require_uniform(values, d - (ndim - values.dim()), tag[1])
        return a.set_all(tag)

    add("index_put index_put_ _index_put_impl_", index_put)

    def gather(a, func, args, kwargs):
        """gather(t, dim, index): out[..., i, ...] = t[..., index[..., i, ...],
        ...] along `dim`; off `dim`, t is read at the index's own positions.
        The rows off `dim`, in the same place in both, or in one of them with
        the other the same for every row (GPT-J's position table, repeated
        per row, gathered by per-row positions)."""
        t, index = args[0], args[2]
        dim = args[1] % t.dim()
        tag, ti = a.tag_of(t), a.tag_of(index)
        rows = ti if ti is not None else tag
        if tag is not None and ti is not None and tag != ti:
            raise _Mixed("gathers from rows by indices that hold rows in another place")
        if rows[0] == dim:
            raise _Mixed("gathers along the dimension of the rows")
        if t.shape[rows[0]] != index.shape[rows[0]]:
            raise _Mixed("gathers from a tensor of another size in the dimension of the rows")
        for x in (t, index):
            if a.tag_of(x) is None:
                a.require_uniform(x, rows[0], rows[1])
        return a.set_all(rows)

    add("gather", gather)

    def index_write(a, func, args, kwargs):
        """index_copy_ / index_add_ / scatter(_add) into rows, along another
        dimension, of values whose rows are in the same place."""
        t, dim = args[0], args[1] % args[0].dim()
        source = args[3] if len(args) > 3 else kwargs.get("source", kwargs.get("src"))
        tag = a.tag_of(t)
        ts = a.tag_of(source) if isinstance(source, torch.Tensor) else None
        index_tag = a.tag_of(args[2])
        if tag is None and ts is not None and dim != ts[0] and a.writable(t, ts):
            if func.overloadpacket.__name__.startswith("scatter") and index_tag != ts:
                raise _Mixed("scatters with an index that does not hold the rows")
            if not func.overloadpacket.__name__.startswith("scatter") and index_tag is not None:
                raise _Mixed("writes at positions that differ between rows")
            return lambda out: a.fill_fresh(t, ts)  # a tensor made in the call
        if tag is None or dim == tag[0] or (ts is not None and ts != tag):
            raise _Mixed("writes along, or across, the dimension of the rows")
        if func.overloadpacket.__name__.startswith("scatter"):
            if index_tag != tag:
                raise _Mixed("scatters with an index that does not hold the rows")
        elif index_tag is not None:
            raise _Mixed("writes at positions that differ between rows")
        if isinstance(source, torch.Tensor) and ts is None:
            a.require_uniform(source, tag[0], tag[1])
        return a.set_all(tag)

    add("index_copy index_copy_ index_add index_add_ scatter scatter_ scatter_add "
        "scatter_add_", index_write)

    def norm_last(a, func, args, kwargs):
        """layer_norm / rms_norm over the last len(normalized_shape)
        dimensions (weights untagged): rows must be in a dimension before."""
        t, normalized = args[0], args[1]
        tag = a.tag_of(t)
        if tag is None or any(a.tag_of(w) is not None for w in args[2:4]
                              if isinstance(w, torch.Tensor)):
            raise _Mixed("normalises with weights that hold rows")
        if tag[0] >= t.dim() - len(normalized):
            raise _Mixed(f"normalises over dimension {tag[0]}, where the rows are")
        return a.set_each(lambda o: tag if o.dim() == t.dim() else None)

    add("native_layer_norm _fused_rms_norm layer_norm rms_norm", norm_last)

    def linear(a, func, args, kwargs):
        """linear(input, weight, bias): rows in a dimension of input other
        than its features."""
        x = args[0]
        tag = a.tag_of(x)
        if tag is None or tag[0] == x.dim() - 1 or \
                any(a.tag_of(w) is not None for w in args[1:] if isinstance(w, torch.Tensor)):
            raise _Mixed("contracts over the dimension of the rows")
        return a.set_all(tag)

    add("linear", linear)

    def matmul(a, func, args, kwargs):
        """matmul([..., n, k], [..., k, m]) -> [..., n, m], leading
        dimensions broadcast: rows in n, in m or in a leading dimension
        (both sides alike, or one with the other the same for every row)."""
        x, y = args[0], args[1]
        if x.dim() < 2 or y.dim() < 2:
            raise _Mixed("multiplies a vector by rows")
        ndim = max(x.dim(), y.dim())
        places = set()
        for t, side in ((x, 0), (y, 1)):
            tag = a.tag_of(t)
            if tag is None:
                continue
            d = tag[0] + ndim - t.dim()
            if (side == 0 and d == ndim - 1) or (side == 1 and d == ndim - 2):
                raise _Mixed("contracts over the dimension of the rows")
            places.add((d, tag[1]))
        if len(places) != 1:
            raise _Mixed("multiplies rows by rows")
        d, inner = places.pop()
        if a.tag_of(x) is not None and a.tag_of(y) is not None and d >= ndim - 2:
            raise _Mixed("multiplies rows by rows")
        for t in (x, y):
            k = d - (ndim - t.dim())
            if a.tag_of(t) is None and 0 <= k < t.dim() - 2:
                a.require_uniform(t, k, inner)
        return a.set_all((d, inner))

    add("matmul", matmul)

    def solve_triangular(a, func, args, kwargs):
        """linalg_solve_triangular(A [..., n, n], B [..., n, k]): one system
        per index of the leading dimensions (broadcast): rows in a leading
        dimension, in the same place in both or in one with the other the
        same for every row (Qwen3-Next's chunked delta rule)."""
        systems, rhs = args[0], args[1]
        ndim = max(systems.dim(), rhs.dim())
        places = {(tag[0] + ndim - x.dim(), tag[1]) for x in (systems, rhs)
                  if (tag := a.tag_of(x)) is not None}
        if len(places) != 1:
            raise _Mixed("solves with rows held in different places")
        d, inner = places.pop()
        if d >= ndim - 2:
            raise _Mixed("solves across the dimension of the rows")
        for x in (systems, rhs):
            k = d - (ndim - x.dim())
            if a.tag_of(x) is None and k >= 0:
                a.require_uniform(x, k, inner)
        return a.set_all((d, inner))

    add("linalg_solve_triangular", solve_triangular)

    def repeat_interleave(a, func, args, kwargs):
        t = args[0]
        tag = a.tag_of(t)
        dim = args[2] if len(args) > 2 else kwargs.get("dim")
        if tag is None or dim is None or dim % t.dim() == tag[0] or \
                isinstance(args[1], torch.Tensor) and a.tag_of(args[1]) is not None:
            raise _Mixed("repeats along the dimension of the rows")
        return a.set_all(tag)

    add("repeat_interleave", repeat_interleave)

    def before_last(count, why):
        """A rule for operators that act on the last count(args)
        dimensions of args[0], each slice of the others on its own: the
        rows must be in one of the others."""
        def rule(a, func, args, kwargs):
            t = args[0]
            tag = a.tag_of(t)
            if tag is None or tag[0] >= t.dim() - count(args):
                raise _Mixed(why)
            return a.set_all(tag)
        return rule

    add("constant_pad_nd pad", before_last(lambda args: len(args[1]) // 2,
                                           "pads the dimension of the rows"))
    add("tril triu tril_ triu_", before_last(lambda args: 2,
                                             "masks across the dimension of the rows"))

    def same(a, func, args, kwargs):
        """Conversions of args[0] (to another tensor's dtype or device: of
        that tensor only its dtype and device are read)."""
        tag = a.tag_of(args[0])
        if tag is None:
            raise _Mixed("takes rows in an argument it has no rule for")
        return a.set_all(tag)

    add("to type_as contiguous", same)

    def per_sample(a, func, args, kwargs):
        """Operators that compute each sample of dimension 0 on its own:
        convolutions, group norm, batch norm with running statistics
        (inference); the weights must not hold rows."""
        tag = a.tag_of(args[0])
        if tag is None or tag[0] != 0 or any(a.tag_of(w) is not None for w in args[1:]
                                             if isinstance(w, torch.Tensor)):
            raise _Mixed("takes its samples other than in dimension 0")
        if func.overloadpacket.__name__ in _BATCH_NORMS and args[5]:
            raise _Mixed("normalises by the statistics of the whole batch (training)")
        rows = args[0].shape[0]
        return a.set_each(lambda o: tag if o.dim() >= 1 and o.shape[0] == rows else None)

    add("convolution native_group_norm native_batch_norm _native_batch_norm_legit_no_training "
        "cudnn_batch_norm miopen_batch_norm group_norm batch_norm conv1d conv2d conv3d",
        per_sample)

    def flip(a, func, args, kwargs):
        t = args[0]
        tag = a.tag_of(t)
        if tag is None or tag[0] in [k % t.dim() for k in _dims(args[1])]:
            raise _Mixed("reverses the order of the rows")
        return a.set_all(tag)

    add("flip", flip)

    def repeat(a, func, args, kwargs):
        """repeat(sizes): new leading dimensions, the rows' one repeated once."""
        t, sizes = args[0], list(args[1])
        tag = a.tag_of(t)
        d = None if tag is None else tag[0] + len(sizes) - t.dim()
        if tag is None or sizes[d] != 1:
            raise _Mixed("repeats the rows")
        return a.set_all((d, tag[1]))

    add("repeat", repeat)

    def roll(a, func, args, kwargs):
        t = args[0]
        tag = a.tag_of(t)
        dims = _dims(args[2] if len(args) > 2 else kwargs.get("dims", ()))
        if tag is None or not dims or tag[0] in [k % t.dim() for k in dims]:
            raise _Mixed("rolls along the dimension of the rows")
        return a.set_all(tag)

    add("roll", roll)

    def one_hot(a, func, args, kwargs):
        return a.set_all(a.tag_of(args[0]))

    add("one_hot", one_hot)

    def complex_views(a, func, args, kwargs):
        """view_as_complex takes the last dimension (real and imaginary
        parts, 2) into the dtype; view_as_real gives it back."""
        t = args[0]
        tag = a.tag_of(t)
        kept = t.dim() - (func.overloadpacket.__name__ == "view_as_complex")
        if tag is None or tag[0] >= kept:
            raise _Mixed("takes the dimension of the rows as a complex number's parts")
        return a.set_all(tag)

    add("view_as_complex view_as_real", complex_views)

    def c10d_same(a, func, args, kwargs):
        """A tensor-parallel all-reduce: each element summed with the same
        element of the other ranks, row by row."""
        return a.set_all(next(a.tag_of(t) for t in _flatten(args) if a.tag_of(t) is not None))

    add("all_reduce all_reduce_ allreduce_ wait_tensor", c10d_same)

    def c10d_lists(a, func, args, kwargs):
        """A list all-gather (each output one rank's copy of the input) or a
        list reduce-scatter (the output the sum over the ranks of this rank's
        input chunk), as tensor-parallel layers gather a column-parallel
        output and scatter a row-parallel sum: row by row, when every input
        holds its rows (or a value reduced over them) in the same place.
        The outputs, args[0], are written in place: each must hold the rows
        there already, or be made in the call (a factory's tensor, or a
        slice of one that keeps the rows' dimension whole), whose views then
        hold them too, as for any write (a buffer's chunks, written as one
        tensor, lay the ranks' rows one after another). (The tensor forms
        do that in dimension 0: they have no rule.)"""
        inputs, outputs = list(_flatten([args[1]])), list(_flatten([args[0]]))
        tags = {a.tag_of(t) for t in inputs}
        if len(tags) != 1 or None in tags:
            raise _Mixed("takes tensors whose rows lie in different places, or in some of them "
                         "only")
        tag = tags.pop()
        if any(o.shape != inputs[0].shape for o in outputs):
            raise _Mixed("writes into tensors of another shape than its inputs'")
        fresh = []
        for o in outputs:
            if a.tag_of(o) == tag:
                continue
            if a.tag_of(o) is not None or not (o in a.fresh if tag == REDUCED else
                                               a.writable(o, tag)):
                raise _Mixed("writes rows into a tensor that does not hold rows, or holds "
                             "them elsewhere")
            fresh.append(o)

        def tag_out(_out):
            for o in fresh:
                a.fill_fresh(o, tag)
        return tag_out

    add(" ".join(_LIST_COLLECTIVES), c10d_lists)
    return rules


# The list forms of all-gather and reduce-scatter (c10d_lists), which also
# take values reduced over the rows.
_LIST_COLLECTIVES = ("allgather_", "reduce_scatter_")


def _row_identity(index, batch, inner):
    """The dimension along which untagged integer `index` is arange(batch)
    (the same along every other dimension), or None."""
    import torch

    from ._split import _capture_underway

    if index.dtype == torch.bool or inner != 1 or (index.is_cuda and _capture_underway()):
        return None  # (its bytes cannot be read while a CUDA graph is captured)
    big = [k for k, s in enumerate(index.shape) if s != 1]
    if len(big) != 1 or index.shape[big[0]] != batch:
        return None
    ids = torch.arange(batch, device=index.device, dtype=index.dtype)
    return big[0] if torch.equal(index.flatten(), ids) else None


def _view_tag(a, func, args, kwargs):
    """Where the rows of args[0] are in the view `func` makes of it."""
    t = args[0]
    tag = a.tag_of(t)
    if tag is None:
        raise _Mixed("takes rows in an argument it has no rule for")
    d, inner = tag
    name = func.overloadpacket.__name__
    n = t.dim()
    if name in ("view", "_unsafe_view", "reshape", "unflatten", "flatten", "view_as",
                "reshape_as"):
        if name in ("view_as", "reshape_as") and a.tag_of(args[1]) is not None:
            raise _Mixed("takes its shape from rows")  # only args[1]'s shape is read
        shape = list(args[1].shape) if name in ("view_as", "reshape_as") else \
            _view_shape(func, args, kwargs, t)
        return _reshape_tag(list(t.shape), d, inner, shape, a.batch)
    if name in ("expand", "expand_as"):
        size = args[1].shape if name == "expand_as" else args[1]
        return (d + len(size) - n, inner)
    if name == "movedim":
        return (_moved(n, _dims(args[1]), _dims(args[2])).index(d), inner)
    if name in ("swapaxes", "swapdims"):
        i, j = args[1] % n, args[2] % n
        return ((j if d == i else i if d == j else d), inner)
    if name == "permute":
        dims = [x % n for x in args[1]]
        return (dims.index(d), inner)
    if name == "transpose":
        i, j = args[1] % n, args[2] % n
        return ((j if d == i else i if d == j else d), inner)
    if name == "t":
        return ((1 - d) if n == 2 else d, inner)
    if name in ("mT", "mH"):  # the last two dimensions swapped
        return ((n - 3 - d) % n if d >= n - 2 else d, inner)
    if name == "numpy_T":  # every dimension reversed
        return (n - 1 - d, inner)
    if name == "unsqueeze":
        k = args[1] % (n + 1)
        return (d + (k <= d), inner)
    if name == "squeeze":
        dims = range(n) if len(args) < 2 else _dims(args[1])
        gone = [k % n for k in dims if t.shape[k % n] == 1]
        return (d - sum(1 for k in gone if k < d), inner)
    if name in ("slice", "narrow"):
        dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % n
        if dim != d:
            return tag
        size = t.shape[d]
        if name == "narrow":
            whole = args[2] == 0 and args[3] == size
        else:
            start, end = (list(args[2:4]) + [None, None])[:2]
            step = args[4] if len(args) > 4 else kwargs.get("step", 1)
            whole = (start or 0) == 0 and (end is None or end >= size) and step == 1
        if whole:
            return tag
        raise _Mixed(f"takes part of dimension {d}, where the rows are")
    if name == "select":
        dim = args[1] % n
        if dim == d:
            raise _Mixed(f"picks one row (dimension {d})")
        return (d - (dim < d), inner)
    if name in ("split", "split_with_sizes", "chunk"):
        dim = (args[2] if len(args) > 2 else kwargs.get("dim", 0)) % n
        if dim == d:
            raise _Mixed(f"cuts dimension {d}, where the rows are")
        return tag
    if name == "unbind":
        dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % n
        if dim == d:
            raise _Mixed(f"takes the rows apart one by one (dimension {d})")
        return (d - (dim < d), inner)
    raise _Mixed("has no rule proving that it keeps rows apart")


def _moved(n, source, destination):
    """The permutation movedim(source, destination) applies to n dimensions:
    output dimension k holds input dimension perm[k]."""
    source = [k % n for k in source]
    destination = [k % n for k in destination]
    perm = [None] * n
    for src, dst in zip(source, destination):
        perm[dst] = src
    rest = iter(k for k in range(n) if k not in source)
    return [p if p is not None else next(rest) for p in perm]


def _view_shape(func, args, kwargs, t):
    name = func.overloadpacket.__name__
    if name == "unflatten":
        dim, sizes = args[1] % t.dim(), list(args[2])
        shape = list(t.shape[:dim]) + sizes + list(t.shape[dim + 1:])
    elif name == "flatten":
        start = (args[1] if len(args) > 1 else 0) % t.dim()
        end = (args[2] if len(args) > 2 else -1) % t.dim()
        merged = 1
        for s in t.shape[start:end + 1]:
            merged *= s
        shape = list(t.shape[:start]) + [merged] + list(t.shape[end + 1:])
    else:
        shape = list(args[1])
    if -1 in shape:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        shape[shape.index(-1)] = t.numel() // known if known else 0
    return shape


def _reshape_tag(shape, d, inner, out, batch):
    """Rows at dimension d of `shape` (row * inner + j, rows outermost):
    where they are after a reshape to `out`, or _Mixed when the reshape cuts
    them. The rows stay apart when some output dimension starts at the same
    element stride as the rows' dimension (the product of the dimensions
    before it is the same) and is a whole number of rows."""
    prefix = 1
    for s in shape[:d]:
        prefix *= s
    running = 1
    for k, s in enumerate(out):
        if running == prefix and s != 1:
            if s % batch:
                raise _Mixed(f"reshapes the rows' dimension {d} into one of {s} elements")
            # inner of the new dimension: the elements per row inside it.
            return (k, s // batch)
        running *= s
        if running > prefix:
            break
    raise _Mixed(f"reshapes the rows' dimension {d} across dimensions")
