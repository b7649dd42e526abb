"""`dynaflow apply` on Hugging Face Transformers models: code nobody here wrote.

For each family (Llama, Qwen2, Mixtral, GPT-2; tiny, built from configs with
random weights by tests/hf/hf_models.py, nothing downloaded): trace a forward
with `dynaflow trace`, force a 2-way split with `dynaflow advise
--force-strategy nanobatch_overlap --splits 2`, then run every usage pattern
(model(ids), a decode loop with past_key_values, generate(), a static cache,
left padding) unmodified and under `dynaflow apply --verify`: every layer call
planned, --verify passing, the same tokens and logits within float32's
tolerance. Llama also runs in process (`dynaflow.apply(model, plan)`), with
and without torch.compile; and once under torch.inference_mode().

Env (ctest sets them): DYNAFLOW_BIN, DYNAFLOW_SOURCE_DIR, DYNAFLOW_PYTHON (a
Python with torch and transformers) and DYNAFLOW_APPLY_LIB_BUILT;
DYNAFLOW_HF_DEVICE=cuda runs the models on the GPU (scripts/device/gpu_truth.sh). Exits 77
(skipped) when that Python lacks torch or transformers.
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

BIN = os.environ.get("DYNAFLOW_BIN", "")
SRC = os.environ.get("DYNAFLOW_SOURCE_DIR", "")
PY = os.environ.get("DYNAFLOW_PYTHON", sys.executable)
RUNTIME = os.environ.get("DYNAFLOW_APPLY_LIB_BUILT", "")
MODELS = os.path.join(SRC, "tests", "hf", "hf_models.py")
# cpu in CI; scripts/device/gpu_truth.sh sets cuda (the runtime's stream path).
DEVICE = ["--device", os.environ.get("DYNAFLOW_HF_DEVICE", "cpu")]

# family -> (root class, the decoder layers the forced plan must split)
FAMILIES = {
    "llama": "LlamaForCausalLM.model.layers.*",
    "qwen2": "Qwen2ForCausalLM.model.layers.*",
    "mixtral": "MixtralForCausalLM.model.layers.*",
    "gpt2": "GPT2LMHeadModel.transformer.h.*",
}
PATTERNS = ("forward", "decode_loop", "generate", "static_cache", "left_padding")
# Layer calls of one run of every pattern: 2 layers x (1 forward + 4 loop
# steps + 3 generate steps x 3 patterns).
LAYER_CALLS = 2 * (1 + 4 + 3 * 3)
RTOL, ATOL = 1e-4, 1e-5  # float32, as dynaflow apply --verify


def run(*cmd, env=None):
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def compare(test, base_path, other_path, patterns=PATTERNS):
    """Same tokens, logits within tolerance, for every pattern."""
    import torch

    base, other = torch.load(base_path), torch.load(other_path)
    for name in patterns:
        with test.subTest(pattern=name):
            test.assertTrue(torch.equal(base[name]["tokens"], other[name]["tokens"]),
                            f"{name}: tokens differ")
            test.assertEqual(len(base[name]["logits"]), len(other[name]["logits"]))
            for b, o in zip(base[name]["logits"], other[name]["logits"]):
                torch.testing.assert_close(o, b, rtol=RTOL, atol=ATOL)


class HfApplyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def plan_for(self, family):
        """Trace a forward of `family` and force a 2-way split: plan.json."""
        db, plan = self.path(f"{family}.db"), self.path(f"{family}.json")
        if os.path.exists(plan):
            return plan
        r = run(BIN, "trace", "-o", db, "--", PY, MODELS, "--family", family,
                "--patterns", "forward", *DEVICE)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run(BIN, "advise", db, "--plan", plan, "--force-strategy", "nanobatch_overlap",
                "--splits", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        import json

        with open(plan) as f:
            p = json.load(f)
        modules = [m for rule in p["partition_rules"] for m in rule["modules"]]
        self.assertEqual(modules, [FAMILIES[family]])
        self.assertRegex(p["model"]["module_fingerprint"], "^[0-9a-f]{16}$")
        return plan

    def base_for(self, family):
        out = self.path(f"{family}_base.pt")
        if not os.path.exists(out):
            r = run(PY, MODELS, "--family", family, "--out", out, *DEVICE)
            self.assertEqual(r.returncode, 0, r.stderr)
        return out

    def check_family(self, family, *extra):
        plan, base = self.plan_for(family), self.base_for(family)
        out = self.path(f"{family}_applied.pt")
        r = run(BIN, "apply", "--verify", "--strict", plan, "--", PY, MODELS, "--family", family,
                "--out", out, *DEVICE, *extra)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"dynaflow apply: {LAYER_CALLS} planned and 0 original calls of 2 modules",
                      r.stderr)
        verify = re.search(r"^verify: max_abs_diff=(\S+) max_rel_diff=(\S+) \((\d+) calls\)$",
                           r.stdout, re.M)
        self.assertIsNotNone(verify, r.stdout)
        self.assertEqual(int(verify.group(3)), LAYER_CALLS)
        self.assertLess(float(verify.group(1)), 1e-4)
        self.assertNotIn("FAILED", r.stderr)
        compare(self, base, out)

    def test_llama(self):
        self.check_family("llama")

    def test_qwen2(self):
        self.check_family("qwen2")

    def test_mixtral(self):
        self.check_family("mixtral")

    def test_gpt2(self):
        self.check_family("gpt2")

    def test_llama_under_inference_mode(self):
        # Inference tensors have no version counters: shared inputs are
        # checked by their bytes instead.
        self.check_family("llama", "--inference-mode")

    def in_process(self, *extra):
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(BIN), "..", "plugin",
                                                       "python"),
                   DYNAFLOW_APPLY_LIB=RUNTIME)
        out = self.path("inproc.pt")
        r = run(PY, MODELS, "--family", "llama", "--apply", self.plan_for("llama"), "--out", out,
                *DEVICE, *extra, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"in-process: {LAYER_CALLS} planned and 0 original calls", r.stdout)
        compare(self, self.base_for("llama"), out)

    @unittest.skipUnless(RUNTIME, "needs the built runtime library")
    def test_llama_in_process(self):
        self.in_process()

    @unittest.skipUnless(RUNTIME, "needs the built runtime library")
    def test_llama_in_process_under_torch_compile(self):
        # Planned calls are graph breaks: the plan runs as it does eagerly.
        self.in_process("--compile")


def main():
    if not (BIN and SRC):
        sys.exit("needs DYNAFLOW_BIN and DYNAFLOW_SOURCE_DIR")
    probe = run(PY, "-c", "import torch, transformers")
    if probe.returncode != 0:
        print(f"SKIP: {PY} cannot import torch and transformers")
        sys.exit(77)
    unittest.main()


if __name__ == "__main__":
    main()
