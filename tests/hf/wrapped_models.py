"""A tiny Llama (tests/hf/hf_models.py) wrapped as people wrap models, by
code nobody here wrote: PEFT's LoRA adapters and accelerate's hooks. Each
case applies a forced 2-way plan in process (dynaflow.apply), runs a forward
and generate() twice (the first run audits each kind of call) and checks
the outcome it expects:

- LoRA adapters on the attention and MLP projections, the layers split (and
  the whole PeftModel): the same tokens and logits as the unmodified
  wrapped model, also after `set_adapter` switches to another adapter;
- LoRA's mixed-adapter batch (`adapter_names`, one adapter per row), which
  PEFT passes to its layers through forward pre-hooks holding the whole
  batch's list: refused, naming the hook, and the outputs unmodified;
- accelerate's AlignDevicesHook on each layer (what `dispatch_model` adds):
  split, with the same outputs;
- accelerate's `cpu_offload`, whose hooks load each weight from the
  offload store before every call and drop it after: refused, naming a
  weight the call replaced, and the outputs unmodified.

    python wrapped_models.py

Prints one line per case; exits 1 if any case is not as expected. Env:
PYTHONPATH with dynaflow's package (plugin/python), DYNAFLOW_APPLY_LIB the
runtime library (tests/hf_apply_test.py sets both).
"""

import contextlib
import io
import os
import sys

import accelerate
import peft
import torch

import dynaflow
from dynaflow import _apply

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_models  # noqa: E402 - after the path is set
import hf_sweep  # noqa: E402

LAYERS = "LlamaForCausalLM.model.layers.*"
# PeftModel's own forward wraps the transformers model it holds.
PEFT_LAYERS = "PeftModel.base_model.model.model.layers.*"
LORA_TARGETS = ["q_proj", "v_proj", "gate_proj"]


def plan(modules):
    split = {"min_tokens": 0, "max_tokens": None, "strategy": "nanobatch_overlap",
             "splits": 2, "rules": ["split"], "streams": [{"id": 0, "role": "compute"}]}
    return {"schema": _apply.PLAN_SCHEMA, "device": {"name": ""},
            "partition_rules": [{"name": "split", "role": "split", "operators": [],
                                 "modules": [modules]}],
            "buckets": [split]}


def lora():
    """Llama with two LoRA adapters, "one" active (random, non-zero weights)."""
    model = peft.get_peft_model(
        hf_models.build("llama"),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS,
                        init_lora_weights=False), adapter_name="one")
    torch.manual_seed(3)
    model.add_adapter("two", peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS,
                                           init_lora_weights=False))
    return model.eval()


def aligned():
    """Llama with accelerate's AlignDevicesHook on each decoder layer."""
    model = hf_models.build("llama")
    for layer in model.model.layers:
        accelerate.hooks.add_hook_to_module(
            layer, accelerate.hooks.AlignDevicesHook(execution_device="cpu",
                                                     io_same_device=True))
    return model


def offloaded():
    """Llama whose weights accelerate keeps off the module between calls."""
    model = hf_models.build("llama")
    accelerate.cpu_offload(model, execution_device="cpu")
    return model


def forward_and_generate(model, **kwargs):
    ids = hf_models.prompts()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=hf_models.NEW_TOKENS, output_logits=True,
                         return_dict_in_generate=True, **kwargs)
    return {"tokens": out.sequences,
            "logits": [model(input_ids=ids, **kwargs).logits, *out.logits]}


def switched_adapter(model):
    """Adapter "one", then "two" (its first calls are of kinds audited with "one")."""
    first = forward_and_generate(model)
    model.set_adapter("two")
    try:
        second = forward_and_generate(model)
    finally:
        model.set_adapter("one")
    return {"tokens": torch.cat([first["tokens"], second["tokens"]]),
            "logits": first["logits"] + second["logits"]}


def mixed_adapters(model):
    return forward_and_generate(model, adapter_names=["one", "two", "__base__", "one"])


# name -> (model, unit, usage, the refusal's start: "" when it must split)
CASES = {
    "LoRA, its layers split": (lora, PEFT_LAYERS, forward_and_generate, ""),
    "LoRA, the whole PeftModel split": (lora, "PeftModel", forward_and_generate, ""),
    "LoRA, the adapter switched between calls": (lora, PEFT_LAYERS, switched_adapter, ""),
    "LoRA, a mixed-adapter batch": (
        lora, PEFT_LAYERS, mixed_adapters,
        "PeftModel.base_model.model.model.layers.0.self_attn.q_proj: forward pre-hook partial "
        "would run once per micro-batch, on part of the batch"),
    "accelerate's AlignDevicesHook on each layer": (aligned, LAYERS, forward_and_generate, ""),
    "accelerate's cpu_offload": (
        offloaded, LAYERS, forward_and_generate,
        "LlamaForCausalLM.model.layers.0: parameter self_attn.q_proj.weight is shared by the "
        "micro-batches and was replaced"),
}


def run_case(build, unit, usage, refusal):
    """'' when the case went as expected; else why not."""
    with torch.no_grad():
        base = usage(build())
        model = build()
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            dynaflow.apply(model, plan(unit))
            usage(model)  # the first call of each kind: its audit
            report = model._dynaflow_applier.report
            planned = report.planned_calls
            got = usage(model)
    why = hf_sweep.differs(base, got, torch.float32)
    if why:
        return why
    if refusal:
        if not report.refused.startswith(refusal):
            return f"expected the refusal {refusal!r}, got {report.refused!r}"
        return "" if report.planned_calls == 0 else f"{report.planned_calls} calls ran split"
    if report.refused:
        return f"refused: {report.refused}"
    if report.planned_calls == planned:
        return f"the second run split no call: {said.getvalue().strip()[:300]}"
    return ""


def main():
    return hf_sweep.run_all(CASES, lambda case: run_case(*case), "as expected")


if __name__ == "__main__":
    sys.exit(main())
