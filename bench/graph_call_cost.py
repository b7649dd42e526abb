"""What a planned call replayed from a CUDA graph (`dynaflow._graphs`) costs
on the host, against the same call run eagerly through the runtime, on the
CPU, in one run: the original forward; the planned call split in 2, eager
(the runtime's workers, the merge); and the same call replayed, with a
graph backend whose replay launches nothing (`NullGraphs`), timed inside
the planned forwards (nothing of the units' work runs there then), so what
is measured is the Python of a replayed call: the policy lookup, the hook check
and audit key, the graph key, the modules compared with the capture's,
copying the arguments into the static inputs, and cloning the outputs out.
On CUDA a replay adds the graph launch (cudaGraphLaunch, a few
microseconds) to this and removes every micro-batch's Python. Three
modules: a Linear(8, 8) on 8 rows; a layer called with a transformers
decoder layer's arguments without a cache (a (cos, sin) tuple, a mask,
position ids, cache_position); and a tiny transformers Llama (2 layers,
random weights) whose decoder layers are the units, called with
use_cache=False (13 modules and the model's config per layer).

    .venv/bin/python bench/graph_call_cost.py build/plugin/apply/libdynaflow_apply.so

The replay module is build/plugin/torch/_dynaflow_replay.so unless env
DYNAFLOW_REPLAY_EXT names another. bench/replay_ab.py measures an earlier
commit's replay beside this one's, in one process.
"""

import os
import statistics
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "plugin", "python"))
os.environ.setdefault("DYNAFLOW_REPLAY_EXT",
                      os.path.join(ROOT, "build", "plugin", "torch", "_dynaflow_replay.so"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from apply_overhead import Net  # noqa: E402 - one Linear(8, 8) as Net.blocks.0
from dynaflow import _apply  # noqa: E402

CALLS, RUNS = 1000, 7


class NullGraphs:
    """A graph backend whose capture runs the call once and whose replay
    does nothing: the host side of a replayed call, measured alone."""

    @staticmethod
    def accepts(_t):
        return True

    @staticmethod
    def in_capture():
        return False

    @staticmethod
    def capture(fn, _device):
        return None, fn()

    @staticmethod
    def replay(_graph, copy_in, copy_out):
        copy_in()
        return copy_out()


class Layer(nn.Module):
    """A decoder layer's call signature and a little work on each argument."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 64)

    def forward(self, hidden_states, position_embeddings, attention_mask, position_ids,
                cache_position):
        cos, sin = position_embeddings
        h = self.proj(hidden_states) * cos + sin
        return h.masked_fill(~attention_mask[:, 0, :, :1], 0.0)


class LayerNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer()])

    def forward(self, x):
        batch, seq, _ = x.shape
        cos, sin = torch.ones(batch, seq, 64), torch.zeros(batch, seq, 64)
        mask = torch.ones(batch, 1, seq, seq, dtype=torch.bool)
        positions = torch.arange(seq)
        return self.layers[0](x, position_embeddings=(cos, sin), attention_mask=mask,
                              position_ids=positions[None], cache_position=positions)


class HfLlama(nn.Module):
    """A tiny transformers Llama, called on token ids without a cache."""

    def __init__(self):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        self.lm = LlamaForCausalLM(LlamaConfig(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)).eval()

    def forward(self, ids):
        return self.lm(ids, use_cache=False).logits


def plan(units):
    return {"schema": _apply.PLAN_SCHEMA, "device": {"name": ""},
            "partition_rules": [{"name": "split", "role": "split", "operators": [],
                                 "modules": units}],
            "buckets": [{"min_tokens": 0, "max_tokens": None, "strategy": "nanobatch_overlap",
                         "splits": 2, "rules": ["split"], "streams": []}]}


def per_call_us(fn, x):
    start = time.perf_counter()
    for _ in range(CALLS):
        fn(x)
    return (time.perf_counter() - start) / CALLS * 1e6


class InPlanned:
    """Time spent inside the planned forwards (_apply._PlannedForward) while
    on: with NullGraphs nothing is launched there, so for a replayed call
    it is all host work."""

    def __init__(self, apply_module=_apply):
        self.seconds = 0.0
        self.on = False
        call = apply_module._PlannedForward.__call__

        def timed(forward, *args, **kwargs):
            if not self.on:
                return call(forward, *args, **kwargs)
            start = time.perf_counter()
            try:
                return call(forward, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        apply_module._PlannedForward.__call__ = timed

    def per_call_us(self, fn, x):
        self.seconds, self.on = 0.0, True
        try:
            per_call_us(fn, x)
        finally:
            self.on = False
        return self.seconds / CALLS * 1e6


def variants(runtime, make, units, x, apply_module=_apply):
    """{name: callable} of one module: original, planned eager, planned
    replayed (by `apply_module`, a version of dynaflow._apply)."""
    torch.manual_seed(0)
    original = make()
    eager = make()
    eager.load_state_dict(original.state_dict())
    replayed = make()
    replayed.load_state_dict(original.state_dict())
    apply_module.apply(eager, plan(units), runtime_lib=runtime, graphs=False)
    apply_module.apply(replayed, plan(units), runtime_lib=runtime)
    replayed._dynaflow_applier.graph_backend = NullGraphs()
    for net in (eager, replayed):
        for _ in range(3):  # the audit, the warm-up, the capture
            net(x)
    report = replayed._dynaflow_applier.report
    assert report.graphs_captured == len(replayed._dynaflow_applier.forwards) and \
        report.graph_eager_calls == {}, report.as_json(False)
    expected = original(x)
    for net in (eager, replayed):
        torch.testing.assert_close(net(x), expected, rtol=1e-5, atol=1e-6)
    return {"original": original, "planned, eager": eager, "planned, replayed": replayed}


def cases():
    """{name: (module class, plan units, input)} of the three modules."""
    return {
        "Linear(8, 8), 8 rows": (Net, ["Net.blocks.*"], torch.randn(8, 8)),
        "decoder-layer arguments, 8 x 16 tokens": (LayerNet, ["LayerNet.layers.*"],
                                                   torch.randn(8, 16, 64)),
        "transformers Llama, 2 decoder layers, 8 x 16 tokens": (
            HfLlama, ["HfLlama.lm.model.layers.*"], torch.randint(0, 256, (8, 16))),
    }


def main():
    runtime = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DYNAFLOW_APPLY_LIB", "")
    torch.set_num_threads(1)
    timer = InPlanned()
    with torch.no_grad():
        for case, (make, units, x) in cases().items():
            nets = variants(runtime, make, units, x)
            n = len(nets["planned, replayed"]._dynaflow_applier.forwards)
            samples = {"original": [], "planned, eager": [], "replayed": []}
            for _ in range(RUNS):  # alternating, so that load hits every variant alike
                samples["original"].append(per_call_us(nets["original"], x))
                samples["planned, eager"].append(per_call_us(nets["planned, eager"], x))
                samples["replayed"].append(timer.per_call_us(nets["planned, replayed"], x))
            original, eager, replayed = (statistics.median(samples[k]) for k in samples)
            print(f"{case}, {n} units ({CALLS} calls x {RUNS} runs, median µs per call):")
            print(f"  original                         {original:8.1f}")
            print(f"  planned, eager: added            {eager - original:8.1f}")
            print(f"  planned, replayed: host work     {replayed:8.1f}  (in the planned forwards; "
                  f"nothing launched)")
            print(f"  replayed / eager added: {replayed / (eager - original):.2f}")


if __name__ == "__main__":
    main()
