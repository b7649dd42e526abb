"""A/B of an eager planned call's per-call work in C++ (the replay module:
plugin/torch/call_split.h, module_state.h) against the same work in Python
(_split._Splitter, _split._merge, _split.ModuleState), in one run,
alternating:
  1. split_call + merge_outputs alone, on the arguments a transformers decoder
     layer gets (hidden states, a (cos, sin) tuple, a mask, cache_position,
     with and without a DynamicCache of 2 layers), and on one tensor;
  2. the unit's module state taken and checked (CallSplit.share_buffers and
     check_shared_unmodified), and the unit's modules checked
     (_split.check_module against call_guards.h's UnitWalk), on a 32-layer
     transformers Llama (421 modules);
  3. the whole planned call split in 2 (bench/apply_overhead.py's Net and
     HfLikeNet, and its 418-module Deep stack), through the runtime;
  4. the keys of a call (plugin/torch/call_keys.h against _rows._walk_into
     and _graphs._Flattening): audit_key + flatten_inputs on the decoder
     layer's arguments, and a planned call of such a layer replayed from a
     graph by a backend that only copies (graph_call_cost.NullGraphs: the
     host's work per replayed call, without the graph launch a GPU adds),
     with torch's global settings read for its key (_graphs._global_modes
     against call_guards.h's GlobalModes).

    DYNAFLOW_REPLAY_EXT=build/plugin/torch/_dynaflow_replay.so \\
      .venv/bin/python bench/eager_call_ab.py build/plugin/apply/libdynaflow_apply.so
"""

import os
import statistics
import sys
import time
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "plugin", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import apply_overhead  # noqa: E402
import graph_call_cost  # noqa: E402
from dynaflow import _apply, _graphs, _rows, _split  # noqa: E402

RUNS = 7
SPLIT_CALLS = 2000
MODEL_CALLS = 1000
STATE_CALLS = 50  # of the 421-module state, and of the Deep stack


STATE = "Llama 421 modules: state taken + checked"
CHECKED = "Llama 421 modules: check_module"
KEYS = "audit_key + flatten_inputs"
REPLAYED = "decoder layer, replayed"


def decoder_layer_arguments(cache):
    x = torch.randn(8, 8)
    kwargs = {"attention_mask": torch.ones(8, 1, 1, 17, dtype=torch.bool),
              "position_embeddings": (torch.ones(8, 1, 4), torch.zeros(8, 1, 4)),
              "cache_position": torch.tensor([16]), "use_cache": True}
    if cache:
        from transformers import DynamicCache

        kwargs["past_key_values"] = DynamicCache()
        for layer in range(2):
            kwargs["past_key_values"].update(torch.randn(8, 2, 16, 4),
                                             torch.randn(8, 2, 16, 4), layer)
    return (x,), kwargs


def split_and_merge_us(args, kwargs):
    outputs = [torch.zeros(4, 8), torch.zeros(4, 8)]
    t = time.perf_counter()
    for _ in range(SPLIT_CALLS):
        s = _split.split_call("layer", None, args, kwargs, 8, [0, 4, 8])
        _split.merge_outputs(s, outputs, s.states)
    return (time.perf_counter() - t) / SPLIT_CALLS * 1e6


def keys_us(args, kwargs):
    m = torch.nn.Linear(8, 8)
    t = time.perf_counter()
    for _ in range(SPLIT_CALLS):
        _rows.audit_key(m, args, kwargs, 8)
        _graphs.flatten_inputs(args, kwargs, 8)
    return (time.perf_counter() - t) / SPLIT_CALLS * 1e6


class ReplayedNet(torch.nn.Module):
    """Calls its layer with a decoder layer's arguments, without a cache
    (which a DynamicCache's growth would keep from replaying)."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([apply_overhead.HfLikeLayer()])

    def forward(self, x):
        rows = x.shape[0]
        return self.blocks[0](x, attention_mask=torch.ones(rows, 1, 1, 17, dtype=torch.bool),
                              position_embeddings=(torch.ones(rows, 1, 4),
                                                   torch.zeros(rows, 1, 4)),
                              cache_position=torch.tensor([16]), use_cache=True)


def llama_modules():
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=32,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    return list(LlamaModel(config).named_modules())


def module_state_us(modules):
    s = _split.CallSplit([0, 4, 8])
    t = time.perf_counter()
    for _ in range(STATE_CALLS):
        s.share_buffers(modules)
        s.check_shared_unmodified()
    return (time.perf_counter() - t) / STATE_CALLS * 1e6


def check_module_us(model):
    t = time.perf_counter()
    for _ in range(STATE_CALLS):
        _split.check_module("LlamaModel", model)
    return (time.perf_counter() - t) / STATE_CALLS * 1e6


def main():
    torch.set_num_threads(1)
    lib = sys.argv[1]
    native = _split._native_splitter()
    if native is None:
        sys.exit("no replay module: set DYNAFLOW_REPLAY_EXT to build/plugin/torch/_dynaflow_replay.so")
    state = _split._native_module_state()
    variants = {"C++": (lambda: native, lambda: state), "Python": (lambda: None, lambda: None)}
    walk, modes = _split._native_unit_walk(), _graphs._native_global_modes()
    llama = llama_modules()
    walks = {"decoder layer, no cache": decoder_layer_arguments(False),
             "decoder layer + DynamicCache": decoder_layer_arguments(True),
             "one tensor": ((torch.randn(8, 8),), {})}
    hf_plan = apply_overhead.plan(2, False)
    hf_plan["partition_rules"][0]["modules"] = ["HfLikeNet.blocks.*"]
    models = {"Net, split 2": _apply.apply(apply_overhead.Net(), apply_overhead.plan(2, False),
                                           runtime_lib=lib),
              "HfLikeNet, split 2": _apply.apply(apply_overhead.HfLikeNet(), hf_plan,
                                                 runtime_lib=lib)}
    deep_plan = apply_overhead.stack_plan(False)
    deep_plan["partition_rules"][0]["modules"] = ["Deep"]
    models["Deep (418 modules), split 2"] = _apply.apply(apply_overhead.Deep(), deep_plan,
                                                         runtime_lib=lib)
    replay_plan = apply_overhead.plan(2, False)
    replay_plan["partition_rules"][0]["modules"] = ["ReplayedNet.blocks.*"]
    replayed = _apply.apply(ReplayedNet(), replay_plan, runtime_lib=lib)
    replayed._dynaflow_applier.graph_backend = graph_call_cost.NullGraphs()
    models[REPLAYED] = replayed
    keyer = _rows.native_keys()
    x = torch.randn(8, 8)
    samples = {}
    with torch.inference_mode():
        for _ in range(RUNS):
            for variant, (walker, checker) in variants.items():
                cpp = variant == "C++"
                keys = keyer if cpp else None
                with mock.patch.object(_split, "_native_splitter", walker), \
                        mock.patch.object(_split, "_native_module_state", checker), \
                        mock.patch.object(_split, "_native_unit_walk",
                                          lambda c=cpp: walk if c else None), \
                        mock.patch.object(_graphs, "_native_global_modes",
                                          lambda c=cpp: modes if c else None), \
                        mock.patch.object(_rows, "native_keys", lambda: keys), \
                        mock.patch.object(_graphs, "native_keys", lambda: keys):
                    samples.setdefault((KEYS, variant), []).append(
                        keys_us(*walks["decoder layer, no cache"]))
                    for name, (args, kwargs) in walks.items():
                        samples.setdefault((name, variant), []).append(
                            split_and_merge_us(args, kwargs))
                    samples.setdefault((STATE, variant), []).append(module_state_us(llama))
                    samples.setdefault((CHECKED, variant), []).append(
                        check_module_us(llama[0][1]))
                    for name, model in models.items():
                        calls = STATE_CALLS if name.startswith("Deep") else MODEL_CALLS
                        samples.setdefault((name, variant), []).append(
                            apply_overhead.per_call_us(model, x, calls))
    print(f"median of {RUNS} runs, us per call (split_call + merge_outputs alone: "
          f"{SPLIT_CALLS} calls; module state and Deep: {STATE_CALLS}; other whole planned "
          f"calls: {MODEL_CALLS})")
    replays = replayed._dynaflow_applier.report.graph_replays
    if replays == 0:
        sys.exit(f"{REPLAYED}: no call was replayed")
    for name in list(walks) + [STATE, CHECKED, KEYS] + list(models):
        c, p = statistics.median(samples[(name, "C++")]), statistics.median(samples[(name, "Python")])
        print(f"  {name:30s} C++ {c:8.1f}  Python {p:8.1f}  Python / C++ {p / c:.2f}x")


if __name__ == "__main__":
    main()
