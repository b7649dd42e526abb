"""Tiny Hugging Face models (tests/hf/hf_models.py) split in ways the rest of
tests/hf_apply_test.py does not: batches that do not divide evenly, 3 and 4
micro-batches, bfloat16, and each family's stack as one unit, as its layers,
as a staggered region cut at its layers' children, or the whole model. Each case applies a
forced plan in process (dynaflow.apply) and runs one usage pattern twice: the
first run audits each kind of call (run the original way), the second must
split and give the unmodified model's tokens and logits within the dtype's
tolerance.

    python hf_sweep.py [--device cpu]

Prints one line per case; exits 1 if any case differs, raises or did not
split. Env: PYTHONPATH with dynaflow's package (plugin/python),
DYNAFLOW_APPLY_LIB the runtime library (tests/hf_apply_test.py sets both).
"""

import argparse
import contextlib
import io
import os
import sys

import torch

import dynaflow
from dynaflow import _apply

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_models  # noqa: E402 - after the path is set

# family -> (its decoder stack, the stack's layer list, the layers' children
# that cut a staggered region into segments)
STACKS = {
    "llama": ("LlamaForCausalLM.model", "layers", ("self_attn", "mlp")),
    "qwen2": ("Qwen2ForCausalLM.model", "layers", ("self_attn", "mlp")),
    "mixtral": ("MixtralForCausalLM.model", "layers", ("self_attn",)),
    "gpt2": ("GPT2LMHeadModel.transformer", "h", ("attn", "mlp")),
    "mistral": ("MistralForCausalLM.model", "layers", ("self_attn", "mlp")),
    "gemma2": ("Gemma2ForCausalLM.model", "layers", ("self_attn", "mlp")),
    "qwen2_moe": ("Qwen2MoeForCausalLM.model", "layers", ("self_attn", "mlp")),
    "phi3": ("Phi3ForCausalLM.model", "layers", ("self_attn", "mlp")),
    "gemma3": ("Gemma3ForCausalLM.model", "layers", ("self_attn", "mlp")),
    "gpt_neox": ("GPTNeoXForCausalLM.gpt_neox", "layers", ("attention",)),
    "opt": ("OPTForCausalLM.model.decoder", "layers", ("self_attn",)),
    "bloom": ("BloomForCausalLM.transformer", "h", ("self_attention",)),
}
F32, BF16 = torch.float32, torch.bfloat16
# (family, batch, splits, unit, dtype, pattern, prompt length)
CASES = [
    ("llama", 3, 2, "layers", F32, "decode_loop", 5),
    ("llama", 7, 3, "staggered", BF16, "generate", 12),
    ("llama", 5, 2, "layers", F32, "train", 12),
    ("qwen2", 5, 4, "stack", F32, "left_padding", 12),
    ("mixtral", 6, 3, "layers", BF16, "forward", 17),
    ("gpt2", 5, 2, "staggered", F32, "beam_search", 12),
    ("mistral", 7, 4, "layers", F32, "static_cache", 12),
    ("gemma2", 5, 3, "staggered", F32, "decode_loop", 17),
    ("qwen2_moe", 7, 2, "stack", BF16, "outputs", 5),
    ("phi3", 3, 3, "layers", F32, "next_turn", 12),
    ("gemma3", 6, 4, "staggered", BF16, "left_padding", 12),
    ("gpt_neox", 5, 2, "staggered", F32, "static_cache", 17),
    ("opt", 7, 3, "stack", F32, "generate", 12),
    ("bloom", 5, 2, "staggered", BF16, "beam_search", 12),
    # The whole model as the unit: generate() reads which arguments its
    # forward takes (GPT-2's position_ids, made from the padding mask).
    ("gpt2", 5, 2, "model", F32, "left_padding", 12),
    ("llama", 6, 3, "model", BF16, "next_turn", 12),
    # The layers as units, each reading its own layer of the cache (its
    # views made at that read, _split._LazyLayers): sliding-window and full
    # static layers side by side, and beam search's reordered caches.
    ("gemma3", 5, 2, "layers", F32, "static_cache", 12),
    ("gpt2", 4, 2, "layers", F32, "beam_search", 12),
]
TOLERANCE = {F32: dict(rtol=1e-4, atol=1e-5), BF16: dict(rtol=2e-2, atol=2e-2)}


def plan(family, splits, unit):
    """A forced plan that splits `family`'s stack `splits` ways as `unit`."""
    stack, layers, children = STACKS[family]
    split = {"min_tokens": 0, "max_tokens": None, "strategy": "nanobatch_overlap",
             "splits": splits, "rules": ["split"], "streams": [{"id": 0, "role": "compute"}]}
    modules = {"layers": f"{stack}.{layers}.*", "model": stack.split(".")[0]}.get(unit, stack)
    rules = [{"name": "split", "role": "split", "operators": [], "modules": [modules]}]
    if unit == "staggered":  # the tiny models have 2 layers
        split["rules"].append("stage")
        split["segments"] = 2 * len(children)
        rules.append({"name": "stage", "role": "stage", "operators": [],
                      "modules": [f"{stack}.{layers}.*.{c}" for c in children]})
    return {"schema": _apply.PLAN_SCHEMA, "device": {"name": ""}, "partition_rules": rules,
            "buckets": [split]}


def differs(base, got, dtype):
    """Why `got` is not `base` (tokens equal, logits within tolerance), or ""."""
    if not torch.equal(base["tokens"], got["tokens"]):
        return "tokens differ"
    if len(base["logits"]) != len(got["logits"]):
        return f"{len(got['logits'])} logits, not {len(base['logits'])}"
    for k, (b, g) in enumerate(zip(base["logits"], got["logits"])):
        try:
            torch.testing.assert_close(g, b, **TOLERANCE[dtype])
        except AssertionError as e:
            return f"logits {k}: {str(e).splitlines()[1] if len(str(e).splitlines()) > 1 else e}"
    return ""


def run_case(family, batch, splits, unit, dtype, pattern, prompt, device):
    """'' when the case split and matched; else why not."""
    hf_models.BATCH, hf_models.PROMPT, hf_models.DEVICE = batch, prompt, device
    fn = {**hf_models.PATTERNS, **hf_models.EXTRA_PATTERNS}[pattern]
    with torch.no_grad():
        base = fn(hf_models.build(family).to(device, dtype), hf_models.prompts())
        model = hf_models.build(family).to(device, dtype)
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            dynaflow.apply(model, plan(family, splits, unit))
            fn(model, hf_models.prompts())  # the first call of each kind: its audit
            report = model._dynaflow_applier.report
            planned = report.planned_calls
            got = fn(model, hf_models.prompts())
    if report.refused:
        return f"refused: {report.refused}"
    if report.planned_calls == planned:
        return f"the second run split no call: {said.getvalue().strip()[:300]}"
    return differs(base, got, dtype) or ""


def run_all(cases, run, outcome):
    """Runs `run(case)` for each (name, case) of `cases`, which returns ""
    or why the case failed; prints a line per case and "N of M cases
    `outcome`"; the exit code: 1 if any case failed or raised."""
    failed = 0
    for name, case in cases.items():
        try:
            why = run(case)
        except Exception as e:  # noqa: BLE001 - a case that raises fails, the others go on
            why = f"{type(e).__name__}: {e}"
        failed += bool(why)
        print(f"{'FAIL' if why else 'ok'}: {name}{': ' + why if why else ''}", flush=True)
    print(f"{len(cases) - failed} of {len(cases)} cases {outcome}", flush=True)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    cases = {f"{family} batch {batch} in {splits} as {unit}, {str(dtype)[6:]}, {pattern}, "
             f"{prompt} tokens": (family, batch, splits, unit, dtype, pattern, prompt)
             for family, batch, splits, unit, dtype, pattern, prompt in CASES}
    return run_all(cases, lambda case: run_case(*case, args.device), "split and matched")


if __name__ == "__main__":
    sys.exit(main())
