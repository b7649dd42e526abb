"""What a transformers cache costs a planned decode step on the CPU: one
decode step of a small Llama (4 layers, 4 key-value heads of 64) at a long
context, unmodified and with its layers split in 2 (dynaflow.apply), in one
process, alternating, on a DynamicCache (the default) or a StaticCache.
transformers' DynamicLayer grows its keys and values by concatenation on
every step, a copy of the whole cache; a split step also merges the
micro-batches' layers back into one, which copied the cache a second time
before the micro-batches wrote their rows into the merged tensors themselves
(_split._DynamicLayerAdapter), and every layer of it on every layer's call
before untouched layers were left alone. Prints the first split step (each
layer's first decode call audited and compared, _apply._PlannedForward), the
median ms per step of each and their ratio.

    .venv/bin/python bench/cache_decode_step.py build/plugin/apply/libdynaflow_apply.so [static]

LAYERS and CONTEXT in the environment set the depth (4) and the context (2048): at 32 layers
the step shows what each layer's planned call costs for the layers it does not read (views and
merges once made of every layer on every call).
"""

import contextlib
import io
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugin",
                                "python"))

import torch  # noqa: E402
import transformers as tf  # noqa: E402

from dynaflow import _apply  # noqa: E402

BATCH, STEPS, RUNS = 8, 20, 7
CONTEXT = int(os.environ.get("CONTEXT", 2048))
LAYERS = int(os.environ.get("LAYERS", 4))


def model():
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=CONTEXT + 64)).eval()


def plan():
    split = {"min_tokens": 0, "max_tokens": None, "strategy": "nanobatch_overlap", "splits": 2,
             "rules": ["s"], "streams": [{"id": 0, "role": "compute"}]}
    return {"schema": _apply.PLAN_SCHEMA, "device": {"name": ""},
            "partition_rules": [{"name": "s", "role": "split", "operators": [],
                                 "modules": ["LlamaForCausalLM.model.layers.*"]}],
            "buckets": [split]}


def prefilled(m, kind):
    """A cache of CONTEXT positions, and the next token."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(256, (BATCH, CONTEXT), generator=g)
    cache = tf.DynamicCache(config=m.config) if kind == "dynamic" else \
        tf.StaticCache(config=m.config, max_cache_len=CONTEXT + STEPS + 1)
    out = m(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache, out.logits[:, -1].argmax(-1, keepdim=True)


def ms_per_step(m, cache, token, steps=STEPS):
    """Decode steps from the prefilled cache (each grows it by one), which
    is then set back to its CONTEXT positions."""
    layers = [(layer.keys, layer.values) for layer in cache.layers]
    t = time.perf_counter()
    for _ in range(steps):
        token = m(token, past_key_values=cache, use_cache=True,
                  logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)
    took = (time.perf_counter() - t) / steps * 1e3
    for layer, (k, v) in zip(cache.layers, layers):
        layer.keys, layer.values = k, v
        if hasattr(layer, "cumulative_length"):  # a static layer's position
            layer.cumulative_length.fill_(CONTEXT)
    return took


def main():
    torch.set_num_threads(1)
    lib = sys.argv[1]
    kind = sys.argv[2] if len(sys.argv) > 2 else "dynamic"
    with torch.inference_mode():
        plain = model()
        planned = model()
        with contextlib.redirect_stderr(io.StringIO()):
            _apply.apply(planned, plan(), runtime_lib=lib)
        cache, token = prefilled(plain, kind)
        # The first decode step: each layer's first call of its kind is
        # audited, and run split on a copy of its arguments and compared.
        first = ms_per_step(planned, cache, token, steps=1)
        ms_per_step(planned, cache, token)
        samples = {"unmodified": [], "split in 2": []}
        for _ in range(RUNS):
            samples["unmodified"].append(ms_per_step(plain, cache, token))
            samples["split in 2"].append(ms_per_step(planned, cache, token))
        report = planned._dynaflow_applier.report
    medians = {k: statistics.median(v) for k, v in samples.items()}
    print(f"decode step on a {kind} cache, batch {BATCH}, {CONTEXT} positions, {LAYERS} layers: "
          f"median of {RUNS} x "
          f"{STEPS} steps ({report.planned_calls} planned calls, refused: "
          f"{report.refused or 'no'})")
    print(f"  first split step (audited) {first:8.1f} ms")
    for k, v in medians.items():
        print(f"  {k:12s} {v:8.2f} ms per step")
    print(f"  split / unmodified: {medians['split in 2'] / medians['unmodified']:.2f}")


if __name__ == "__main__":
    main()
