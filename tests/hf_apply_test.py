"""`dynaflow apply` on Hugging Face Transformers models: code nobody here wrote.

For each family (Llama, Qwen2, Mixtral, GPT-2, Gemma2, and Mistral with a
sliding window; tiny, built from configs with random weights by tests/hf/hf_models.py,
nothing downloaded): trace a forward with `dynaflow trace`, force a 2-way split
with `dynaflow advise --force-strategy nanobatch_overlap --splits 2`, whose
unit is the decoder stack cut at its layers' attention and MLP (a staggered
region), then run every usage pattern (model(ids), a decode loop with
past_key_values, generate(), a static cache, left padding) unmodified and
under `dynaflow apply --verify`: the first call of each kind audited (run
the original way while its operators are proved to keep rows apart), every
later stack call planned and run in the schedule's issue order, --verify
passing, the same tokens and logits within float32's tolerance. Llama also
runs in process (`dynaflow.apply(model, plan)`), with and without
torch.compile; and once under torch.inference_mode(). Seven more decoder families
(MORE_FAMILIES: Qwen2-MoE, Phi-3, Gemma 3, Bloom, MPT, GPT-NeoX, OPT) split as the advisor
plans them, with the same outputs. Llama's generate() with beam search and with sampling (the
cache's rows reordered, tokens drawn, between stack calls) splits with the same tokens. LFM2 and Mamba, whose own caches hold state no
adapter merges, are refused before a call that builds one runs split; their calls that build none
split, as do Qwen3-Next's. RecurrentGemma, which keeps state in its modules, is refused before
any call runs split. GPT-J, XGLM and DeepSeek-V2 look their position tables up by per-row
positions, and split. A training step splits where the model has no
dropout (Llama) and is refused where it has (GPT-2). The encoder-decoders T5 and BART split
their encoder and, with their EncoderDecoderCache, their decoder. tests/hf/hf_sweep.py splits
12 families in ways the rest does not: batches that do not divide evenly, 3 and 4 micro-batches,
bfloat16, and the stack as one unit, as layers, as a staggered region, or the whole model.
tests/dist/fsdp_llama.py trains Llama under torch's FSDP2 (fully_shard, gloo, 2 ranks): its
sharded layers split with the same losses and weights, and a stack holding their hooks is refused.
tests/hf/wrapped_models.py wraps Llama in PEFT's LoRA adapters and accelerate's hooks: LoRA
and AlignDevicesHook split with the same outputs; a mixed-adapter batch (PEFT's per-row
adapters, passed by pre-hooks) and cpu_offload (weights loaded per call) are refused.

Env (ctest sets them): DYNAFLOW_BIN, DYNAFLOW_SOURCE_DIR, DYNAFLOW_PYTHON (a
Python with torch and transformers), DYNAFLOW_APPLY_LIB_BUILT and, for CUDA graphs in
process, DYNAFLOW_REPLAY_EXT_BUILT;
DYNAFLOW_HF_DEVICE=cuda runs the models on the GPU (scripts/device/gpu_truth.sh). Exits 77
(skipped) when that Python lacks torch or transformers.
"""

import json
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

# family -> (the decoder stack the forced plan splits, its layers' list)
FAMILIES = {
    "llama": ("LlamaForCausalLM.model", "LlamaForCausalLM.model.layers.*"),
    "qwen2": ("Qwen2ForCausalLM.model", "Qwen2ForCausalLM.model.layers.*"),
    "mixtral": ("MixtralForCausalLM.model", "MixtralForCausalLM.model.layers.*"),
    "gpt2": ("GPT2LMHeadModel.transformer", "GPT2LMHeadModel.transformer.h.*"),
    # Sliding-window attention: DynamicSlidingWindowLayer and
    # StaticSlidingWindowLayer caches (the window, 8, is shorter than the prompt).
    "mistral": ("MistralForCausalLM.model", "MistralForCausalLM.model.layers.*"),
    # Sliding and global layers, attention and final logit softcapping.
    "gemma2": ("Gemma2ForCausalLM.model", "Gemma2ForCausalLM.model.layers.*"),
}
# More decoder families (tests/hf/hf_models.py), split as the advisor plans
# them and compared with the unmodified run, every pattern.
MORE_FAMILIES = ("qwen2_moe", "phi3", "gemma3", "bloom", "mpt", "gpt_neox", "opt")
# The layers' children that cut the stack into segments.
STAGES = {"gpt2": ("attn", "mlp")}
# Families whose stages the advisor may also take as the whole layers (their
# children's times are close on this CPU): either cut is a valid schedule.
WHOLE_LAYERS_OK = {"mistral", "gemma2"}
PATTERNS = ("forward", "decode_loop", "generate", "static_cache", "left_padding")
# Stack calls of one run of every pattern: 1 forward + 4 loop steps + 3
# generate steps x 3 patterns; each layer is called once per stack call.
STACK_CALLS = 1 + 4 + 3 * 3
LAYER_CALLS = 2 * STACK_CALLS
# Under dynaflow apply the first call of each kind runs the original way while
# its operators are proved to keep the rows apart (dynaflow/_rows.py): the
# forward, and a prefill and a decode step of each of the other four patterns.
# The applied runs pass --warmup (every pattern once before the recorded run),
# so the recorded run splits every call.
KINDS = 1 + 2 * 4
PLANNED = 2 * STACK_CALLS - KINDS
AUDITED = "the first call of its kind, run the original way to prove that its operators keep " \
          "the rows apart"
RTOL, ATOL = 1e-4, 1e-5  # float32, as dynaflow apply --verify
# Encoder-decoders: family -> (the model's class, its encoder, its decoder,
# their layers' list). T5's encoder and decoder are one class (T5Stack).
SEQ2SEQ = {
    "t5": ("T5ForConditionalGeneration", "encoder", "decoder", "block"),
    "bart": ("BartForConditionalGeneration", "model.encoder", "model.decoder", "layers"),
}
# A forward with labels, and generate() with a dynamic cache, a static one,
# padding and a cache the caller passed: the decoder runs once per call of
# `labels` and NEW_TOKENS (3) times per generate(), the encoder once per call;
# twice (--warmup). Audited, the first call of each kind: the encoder's in a
# forward and in generate(); the decoder's in the forward (a cache of its
# own), and a prefill and a decode step on a dynamic and on a static cache.
SEQ2SEQ_PATTERNS = ("labels", "generate", "static_cache", "left_padding", "passed_cache")
SEQ2SEQ_CALLS = {"encoder": (2 * 5, 2), "decoder": (2 * (1 + 3 * 4), 1 + 2 * 2)}


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
        # DYNAFLOW_HF_KEEP=DIR keeps the traces, plans and outputs there (the
        # GPU script brings them back).
        cls.tmp = None if os.environ.get("DYNAFLOW_HF_KEEP") else tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name if cls.tmp else os.environ["DYNAFLOW_HF_KEEP"]
        os.makedirs(cls.dir, exist_ok=True)

    @classmethod
    def tearDownClass(cls):
        if cls.tmp:
            cls.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def force_plan(self, family, pattern):
        """Trace `pattern` of `family` and force a 2-way split: the plan's path."""
        db, plan = self.path(f"{family}.db"), self.path(f"{family}.json")
        r = run(BIN, "trace", "-o", db, "--", PY, MODELS, "--family", family, "--patterns",
                pattern, *DEVICE)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run(BIN, "advise", db, "--plan", plan, "--force-strategy", "nanobatch_overlap",
                "--splits", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        return plan

    def plan_for(self, family):
        """Trace a forward of `family` and force a 2-way split: plan.json."""
        plan = self.forced_plan(family)
        with open(plan) as f:
            p = json.load(f)
        unit, layers = FAMILIES[family]
        stages = [f"{layers}.{c}" for c in STAGES.get(family, ("self_attn", "mlp"))]
        # On a GPU the plan also names operator rules (compute, memory...).
        rules = {r["role"]: r["modules"] for r in p["partition_rules"] if r["modules"]}
        if family in WHOLE_LAYERS_OK and rules.get("stage") == [layers]:
            stages = [layers]
        self.assertEqual(rules, {"split": [unit], "stage": stages})
        self.assertEqual(p["buckets"][0]["segments"], 2 * len(stages))  # 2 layers x stages
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
                "--out", out, "--warmup", *DEVICE, *extra)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"dynaflow apply: {PLANNED} planned and {KINDS} original calls of 1 modules",
                      r.stderr)
        self.assertIn(f"dynaflow apply: {KINDS} calls ran the original way: {FAMILIES[family][0]}: "
                      f"{AUDITED}", r.stderr)
        # Every call ran the schedule the simulator predicts, in its order.
        with open(plan) as f:
            segments = json.load(f)["buckets"][0]["segments"]
        self.assertIn(f"dynaflow apply: {FAMILIES[family][0]} ran staggered ({segments} segments x 2 "
                      f"micro-batches) in the predicted order in {PLANNED} of "
                      f"{PLANNED} calls", r.stderr)
        verify = re.search(r"^verify: max_abs_diff=(\S+) max_rel_diff=(\S+) \((\d+) calls\)$",
                           r.stdout, re.M)
        self.assertIsNotNone(verify, r.stdout)
        self.assertEqual(int(verify.group(3)), PLANNED)
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

    def test_mistral_sliding_window(self):
        self.check_family("mistral")

    def test_gemma2(self):
        self.check_family("gemma2")

    def test_more_families_split_with_the_same_outputs(self):
        for family in MORE_FAMILIES:
            with self.subTest(family=family):
                plan, base = self.forced_plan(family), self.base_for(family)
                out = self.path(f"{family}_applied.pt")
                r = run(BIN, "apply", "--verify", "--strict", plan, "--", PY, MODELS, "--family",
                        family, "--out", out, "--warmup", *DEVICE)
                self.assertEqual(r.returncode, 0, r.stderr)
                planned = re.search(r"^dynaflow apply: (\d+) planned and (\d+) original calls "
                                    r"of 1 modules$", r.stderr, re.M)
                self.assertIsNotNone(planned, r.stderr)
                # Every stack call but the first of each kind (at most KINDS).
                self.assertEqual(int(planned.group(1)) + int(planned.group(2)), 2 * STACK_CALLS)
                self.assertGreaterEqual(int(planned.group(1)), PLANNED)
                verify = re.search(r"^verify: max_abs_diff=(\S+) max_rel_diff=\S+ \((\d+) calls\)$",
                                   r.stdout, re.M)
                self.assertIsNotNone(verify, r.stdout)
                self.assertEqual(verify.group(2), planned.group(1))
                self.assertLess(float(verify.group(1)), 1e-4)
                compare(self, base, out)

    def forced_plan(self, family):
        """The forced 2-way plan of a forward of `family`, made once."""
        plan = self.path(f"{family}.json")
        return plan if os.path.exists(plan) else self.force_plan(family, "forward")

    def refused_at_its_first_call(self, family, unit, field):
        """Apply --strict to a forward with the library's defaults: the cache
        the call builds has a layer no adapter merges. Its first call runs the
        original way, audited, and that finds the cache and refuses the plan
        before any call runs split."""
        r = run(BIN, "apply", "--strict", self.forced_plan(family), "--", PY, MODELS, "--family",
                family, "--patterns", "forward", *DEVICE)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(f"dynaflow apply: plan refused: {unit}: the output.{field} is a "
                      "DynamicCache the call built, which has a layer of type "
                      "LinearAttentionLayer (layer 0) (a call with use_cache=False builds "
                      "none); exiting (--strict)", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertNotIn("tokens", r.stdout)  # it exited in the program's first forward

    def test_a_model_whose_own_cache_cannot_be_split_is_refused_before_it_runs_split(self):
        # LFM2's short-convolution layers keep LinearAttentionLayer state in the
        # DynamicCache it builds when a call passes none: no adapter merges it
        # (it once failed after the micro-batches ran).
        self.refused_at_its_first_call("lfm2", "Lfm2ForCausalLM.model", "past_key_values")

    def test_mamba_whose_cache_is_cache_params_is_refused_before_it_runs_split(self):
        self.refused_at_its_first_call("mamba", "MambaForCausalLM.backbone", "cache_params")

    def test_calls_that_build_no_cache_split_where_the_cache_could_not(self):
        # Such models were refused whole, though a call that builds no cache
        # (use_cache=False; Mamba's training step) splits safely. Run twice
        # (--warmup): the first call audited, the second split.
        for family, pattern in (("mamba", "no_cache"), ("lfm2", "no_cache"), ("mamba", "train"),
                                ("qwen3_next", "no_cache")):
            with self.subTest(family=family, pattern=pattern):
                out = self.path(f"{family}_{pattern}.pt")
                r = run(BIN, "apply", "--verify", "--strict", self.forced_plan(family), "--", PY,
                        MODELS, "--family", family, "--patterns", pattern, "--out", out,
                        "--warmup", *DEVICE)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("dynaflow apply: 1 planned and 1 original calls of 1 modules",
                              r.stderr)
                compare(self, self.outputs_base(family, pattern), out, (pattern,))

    def test_a_model_that_keeps_state_in_its_modules_is_refused_before_it_runs_split(self):
        # RecurrentGemma's recurrent layers set their state as attributes on
        # every call, also with use_cache=False: split, each micro-batch
        # would set it. Its first call changed it, so its second is audited
        # too; that one changes it again, and the plan is refused: both ran
        # the original way (the second once ran split and failed after).
        family = "recurrent_gemma"
        out = self.path(f"{family}_no_cache.pt")
        r = run(BIN, "apply", self.forced_plan(family), "--", PY, MODELS, "--family", family,
                "--patterns", "no_cache", "--out", out, "--warmup", *DEVICE)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("dynaflow apply: plan refused: RecurrentGemmaForCausalLM.model: attribute "
                      "layers.0.temporal_block.rg_lru.recurrent_states is shared by the "
                      "micro-batches and was replaced: the split result would be wrong (found "
                      "in two unsplit calls of its kind: none ran split); the program runs "
                      "unmodified", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        compare(self, self.outputs_base(family, "no_cache"), out, ("no_cache",))

    def test_position_tables_looked_up_by_per_row_positions_split(self):
        # GPT-J gathers its sines from a table repeated per row, XGLM selects
        # them from a sinusoidal table, DeepSeek-V2 rotates by complex numbers
        # (polar, view_as_complex): each was refused, though it keeps rows
        # apart. generate() twice (--warmup): a prefill and a decode step
        # audited, 4 of the 6 stack calls split.
        for family in ("gptj", "xglm", "deepseek_v2"):
            with self.subTest(family=family):
                out = self.path(f"{family}_generate.pt")
                r = run(BIN, "apply", "--verify", "--strict", self.forced_plan(family), "--", PY,
                        MODELS, "--family", family, "--patterns", "generate", "--out", out,
                        "--warmup", *DEVICE)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("dynaflow apply: 4 planned and 2 original calls of 1 modules",
                              r.stderr)
                self.assertRegex(r.stdout, r"verify: max_abs_diff=\S+ max_rel_diff=\S+ \(4 calls\)")
                compare(self, self.outputs_base(family, "generate"), out, ("generate",))

    def layers_plan(self):
        """A plan whose units are Llama's layers themselves, with no stage
        rule: each layer call splits and joins, its micro-batches side by side."""
        with open(self.plan_for("llama")) as f:
            p = json.load(f)
        p["partition_rules"] = [dict(p["partition_rules"][0],
                                     modules=[FAMILIES["llama"][1]])]
        p["buckets"][0]["rules"] = [p["partition_rules"][0]["name"]]
        del p["buckets"][0]["segments"]
        layers = self.path("llama_layers.json")
        with open(layers, "w") as f:
            json.dump(p, f)
        return layers

    def test_llama_layers_as_units_without_stagger(self):
        # The layer's own DynamicCache slices are merged back per call.
        layers = self.layers_plan()
        out = self.path("llama_layers.pt")
        r = run(BIN, "apply", "--verify", "--strict", layers, "--", PY, MODELS, "--family",
                "llama", "--out", out, "--warmup", *DEVICE)
        self.assertEqual(r.returncode, 0, r.stderr)
        # A layer sees 8 kinds of call: model(ids) and the loop's first step
        # are one (the stack makes a DynamicCache when it gets none), the
        # loop's decode steps another, both with rotary tables shared by the
        # rows (positions of 1 x tokens); generate()'s prefill and decode,
        # with tables per row (its positions are rows x tokens); prefill and
        # decode with a static cache, and with a padding mask.
        self.assertIn(f"dynaflow apply: {2 * LAYER_CALLS - 2 * 8} planned and {2 * 8} "
                      f"original calls of 2 modules", r.stderr)
        self.assertNotIn("staggered", r.stderr)
        compare(self, self.base_for("llama"), out)

    def outputs_base(self, family, pattern="outputs"):
        out = self.path(f"{family}_{pattern}_base.pt")
        if not os.path.exists(out):
            r = run(PY, MODELS, "--family", family, "--patterns", pattern, "--out", out, *DEVICE)
            self.assertEqual(r.returncode, 0, r.stderr)
        return out

    def test_mixtral_router_logits_merge_per_token(self):
        # output_router_logits: each layer's router logits are [batch x
        # tokens, experts], flattened batch-major, so the micro-batches'
        # concatenate into the unsplit call's; the load-balancing loss
        # computed from them (outside the stack) is the same.
        out = self.path("mixtral_router_logits.pt")
        r = run(BIN, "apply", "--verify", "--strict", self.plan_for("mixtral"), "--", PY, MODELS,
                "--family", "mixtral", "--patterns", "router_logits", "--out", out, "--warmup",
                *DEVICE)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("dynaflow apply: 1 planned and 1 original calls of 1 modules", r.stderr)
        self.assertIn("verify: max_abs_diff=", r.stdout)
        compare(self, self.outputs_base("mixtral", "router_logits"), out, ("router_logits",))

    def test_beam_search_and_sampling_split_with_the_same_tokens(self):
        # The generation loop reorders the cache's rows by beam between
        # stack calls and draws the sampled tokens, both outside the stack.
        # Per run: a prefill and 2 decode steps of 8 rows (4 prompts x 2
        # beams), then of 4 rows sampled: 6 stack calls; twice (--warmup),
        # its 2 kinds audited (a prefill and a decode step: the row count is
        # no part of a kind).
        out = self.path("llama_beam_search.pt")
        r = run(BIN, "apply", "--verify", "--strict", self.plan_for("llama"), "--", PY, MODELS,
                "--family", "llama", "--patterns", "beam_search", "--out", out, "--warmup",
                *DEVICE)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("dynaflow apply: 10 planned and 2 original calls of 1 modules", r.stderr)
        self.assertIn("(10 calls)", r.stdout)
        compare(self, self.outputs_base("llama", "beam_search"), out, ("beam_search",))

    def test_a_conversations_next_turn_reuses_the_first_turns_cache(self):
        # generate() marks a cache its caller passes in (_is_user_defined);
        # that flag once refused the stack mid-run. Two turns of 3 stack
        # calls each, twice (--warmup): 3 kinds audited (the first prefill,
        # the decode steps, the prefill onto the kept cache), 9 split.
        out = self.path("llama_next_turn.pt")
        r = run(BIN, "apply", "--verify", "--strict", self.plan_for("llama"), "--", PY, MODELS,
                "--family", "llama", "--patterns", "next_turn", "--out", out, "--warmup", *DEVICE)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("dynaflow apply: 9 planned and 3 original calls of 1 modules", r.stderr)
        self.assertIn("(9 calls)", r.stdout)
        compare(self, self.outputs_base("llama", "next_turn"), out, ("next_turn",))

    def test_a_training_step_splits_only_without_dropout(self):
        # GPT-2's config has dropout (0.1): split, each micro-batch would draw
        # its own masks, so its stack is refused at the audited first call,
        # which ran the original way (it once ran split, exit 0, with another
        # loss and other gradients). Llama has none: the step splits, and its
        # loss and gradients are the unmodified step's.
        for family, refused in (("gpt2", True), ("llama", False)):
            with self.subTest(family=family):
                out = self.path(f"{family}_train.pt")
                r = run(BIN, "apply", "--strict", self.plan_for(family), "--", PY, MODELS,
                        "--family", family, "--patterns", "train", "--out", out, "--warmup",
                        *DEVICE)
                self.assertNotIn("Traceback", r.stderr)
                if refused:
                    self.assertEqual(r.returncode, 2, r.stderr)
                    self.assertIn(f"dynaflow apply: plan refused: {FAMILIES[family][0]}: the call "
                                  "draws random numbers (dropout in training, say): split, each "
                                  "micro-batch would draw its own", r.stderr)
                    r = run(BIN, "apply", self.plan_for(family), "--", PY, MODELS, "--family",
                            family, "--patterns", "train", "--out", out, "--warmup", *DEVICE)
                    self.assertIn("the program runs unmodified", r.stderr)
                self.assertEqual(r.returncode, 0, r.stderr)
                if not refused:
                    self.assertIn("dynaflow apply: 1 planned and 1 original calls of 1 modules",
                                  r.stderr)
                compare(self, self.outputs_base(family, "train"), out, ("train",))

    def test_every_layers_outputs_asked_of_a_split_stack(self):
        # output_hidden_states and output_attentions: transformers collects
        # them with hooks on the layers and their attention modules, into a
        # collector the stack's own forward sets, so each micro-batch's
        # thread collects its rows and the outputs merge like any other. It
        # installs those hooks on the first call that asks (apply installs
        # them when it attaches: not a change the split call makes); without
        # --verify, whose baseline would run that first call unsplit.
        for family, verify in (("llama", ["--verify"]), ("llama", []), ("gpt2", [])):
            with self.subTest(family=family, verify=verify):
                out = self.path(f"{family}_outputs.pt")
                r = run(BIN, "apply", *verify, "--strict", self.plan_for(family), "--", PY,
                        MODELS, "--family", family, "--patterns", "outputs", "--out", out,
                        "--warmup", *DEVICE)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("dynaflow apply: 1 planned and 1 original calls of 1 modules",
                              r.stderr)
                if verify:
                    self.assertIn("verify: max_abs_diff=", r.stdout)
                compare(self, self.outputs_base(family), out, ("outputs",))

    def test_layers_as_units_run_unsplit_while_the_model_collects_their_attention(self):
        # With the layers as units, the collector belongs to the stack that
        # calls them: the attention modules' hooks would run in the
        # micro-batches' threads and record nothing (the attentions came back
        # empty, silently). Such a call runs the original way, before anything
        # of it runs; the plan stays for the calls that collect nothing.
        layers = self.layers_plan()
        out = self.path("llama_layers_outputs.pt")
        r = run(BIN, "apply", "--strict", layers, "--", PY, MODELS, "--family", "llama",
                "--patterns", "outputs,forward", "--out", out, "--warmup", *DEVICE)
        self.assertEqual(r.returncode, 0, r.stderr)
        for layer in (0, 1):
            self.assertIn(f"dynaflow apply: 2 calls ran the original way: LlamaForCausalLM.model."
                          f"layers.{layer}.self_attn: forward hook install_output_capuring_hook."
                          f"<locals>.output_capturing_hook records outputs for the caller's "
                          f"output_attentions or output_hidden_states", r.stderr)
        # And the first forward of each layer, audited.
        self.assertIn("dynaflow apply: 2 planned and 6 original calls of 2 modules", r.stderr)
        self.assertNotIn("plan refused", r.stderr)
        compare(self, self.outputs_base("llama"), out, ("outputs",))
        compare(self, self.base_for("llama"), out, ("forward",))
        # Once the hooks are installed (a call that asked for outputs before
        # the plan was applied, in process), a call that asks for none still
        # runs its collector, empty: the layers split.
        r = run(PY, MODELS, "--family", "llama", "--apply", layers, "--patterns", "forward",
                "--outputs-first", "--warmup", *DEVICE, env=self.in_process_env())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("in-process: 2 planned and 2 original calls", r.stdout)

    def test_a_model_with_other_stage_modules_is_refused_before_it_runs(self):
        # The plan cuts the stack into 4 segments; a 3-layer model would run
        # 6: another schedule than the predicted one, refused at attach.
        with open(self.plan_for("llama")) as f:
            p = json.load(f)
        p["buckets"][0]["segments"] = 6
        other = self.path("llama_other.json")
        with open(other, "w") as f:
            json.dump(p, f)
        r = run(BIN, "apply", "--strict", other, "--", PY, MODELS, "--family", "llama",
                "--patterns", "forward", *DEVICE)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("LlamaForCausalLM.model: the plan cuts it into 6 segments at "
                      "LlamaForCausalLM.model.layers.*.self_attn and others, this model has 4 "
                      "such modules", r.stderr)
        self.assertNotIn("tokens", r.stdout)  # the program never ran a forward

    def test_llama_a_tiling_per_phase(self):
        # A plan with prefill and decode tilings (as advise writes for a trace
        # with steps of both): prefill calls take the split buckets, decode
        # calls (a cache holding tokens, one new token per row) the
        # sequential one. Of STACK_CALLS: 5 prefills (the forward, the
        # loop's first step, each generate's first) and 9 decode steps.
        with open(self.plan_for("llama")) as f:
            p = json.load(f)
        prefill = [dict(b, phase="prefill") for b in p["buckets"]]
        decode = [dict(p["buckets"][0], phase="decode", min_tokens=0, max_tokens=None,
                       strategy="sequential", splits=1, rules=[],
                       streams=[{"id": 0, "role": "compute"}])]
        del decode[0]["segments"]
        p["buckets"] = decode + prefill  # any order of the phases
        phased = self.path("llama_phased.json")
        with open(phased, "w") as f:
            json.dump(p, f)
        out = self.path("llama_phased.pt")
        # With --warmup: two runs of the patterns, the first prefill of each
        # pattern audited (5 kinds).
        r = run(BIN, "apply", "--verify", "--strict", phased, "--", PY, MODELS, "--family",
                "llama", "--out", out, "--warmup", *DEVICE)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("dynaflow apply: 5 planned and 23 original calls of 1 modules", r.stderr)
        self.assertIn("dynaflow apply: calls by phase: decode 18, prefill 10\n", r.stderr)
        compare(self, self.base_for("llama"), out)
        # Only decode buckets (the split ones): prefill calls have none and
        # run unplanned.
        p["buckets"] = [dict(b, phase="decode") for b in prefill]
        with open(phased, "w") as f:
            json.dump(p, f)
        r = run(BIN, "apply", "--strict", phased, "--", PY, MODELS, "--family", "llama",
                "--out", out, "--warmup", *DEVICE)
        self.assertEqual(r.returncode, 0, r.stderr)
        # The first decode step of 4 patterns audited.
        self.assertIn("dynaflow apply: 14 planned and 14 original calls of 1 modules", r.stderr)
        self.assertIn("dynaflow apply: calls by phase: decode 18, prefill 10 (10 unplanned: the "
                      "plan has no buckets for them)\n", r.stderr)
        compare(self, self.base_for("llama"), out)

    def test_llama_under_inference_mode(self):
        # Inference tensors have no version counters: shared inputs are
        # checked by their bytes instead.
        self.check_family("llama", "--inference-mode")

    def in_process_env(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(BIN), "..", "plugin",
                                                       "python"),
                   DYNAFLOW_APPLY_LIB=RUNTIME)
        if os.environ.get("DYNAFLOW_REPLAY_EXT_BUILT"):
            env["DYNAFLOW_REPLAY_EXT"] = os.environ["DYNAFLOW_REPLAY_EXT_BUILT"]
        return env

    def in_process_script(self, path, summary, *args):
        """tests/`path` run with dynaflow's package and runtime: exit 0, and
        `summary` among the lines it prints."""
        r = run(PY, os.path.join(SRC, "tests", *path.split("/")), *args,
                env=self.in_process_env())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr[-2000:])
        self.assertIn(summary, r.stdout)

    def in_process(self, *extra):
        env = self.in_process_env()
        out = self.path("inproc.pt")
        r = run(PY, MODELS, "--family", "llama", "--apply", self.plan_for("llama"), "--out", out,
                "--warmup", *DEVICE, *extra, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"in-process: {PLANNED} planned and {KINDS} original calls", r.stdout)
        # The executed order of every call is the schedule's issue order.
        self.assertIn(f"in-process: LlamaForCausalLM.model ran {PLANNED} calls, 0 off schedule, "
                      "executed [[0, 0, 0], [0, 1, 1], [1, 0, 0], [1, 1, 1], [2, 0, 0], [2, 1, 1], "
                      "[3, 0, 0], [3, 1, 1]]", r.stdout)
        compare(self, self.base_for("llama"), out)

    @unittest.skipUnless(RUNTIME, "needs the built runtime library")
    def test_llama_in_process(self):
        self.in_process()

    @unittest.skipUnless(RUNTIME, "needs the built runtime library")
    def test_llama_in_process_under_torch_compile(self):
        # Planned calls are graph breaks: the plan runs as it does eagerly.
        self.in_process("--compile")

    @unittest.skipUnless(RUNTIME, "needs the built runtime library")
    def test_llama_under_fullgraph_compile_is_refused_in_one_line(self):
        # fullgraph=True leaves no graph break for the plan to run in, or to
        # attach in (`dynaflow apply` attaches at the model's first call):
        # dynamo traces the original forward, and the plan is refused in one
        # line. torch's Unsupported was raised before, at the attach or at a
        # planned unit. Every pattern then runs as the unmodified program
        # does; --strict exits 2.
        whole = ("torch.compile(fullgraph=True) traces it into one graph, where a planned call "
                 "cannot run (it runs between graphs): the compiled program runs it the "
                 "original way")
        out = self.path("llama_fullgraph.pt")
        r = run(BIN, "apply", self.plan_for("llama"), "--", PY, MODELS, "--family", "llama",
                "--compile", "fullgraph", "--out", out, *DEVICE)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"dynaflow apply: plan refused: LlamaForCausalLM: {whole}; the program "
                      f"runs unmodified", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        compare(self, self.base_for("llama"), out)
        r = run(BIN, "apply", "--strict", self.plan_for("llama"), "--", PY, MODELS, "--family",
                "llama", "--compile", "fullgraph", "--patterns", "forward", *DEVICE)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(f"dynaflow apply: plan refused: LlamaForCausalLM: {whole}; exiting "
                      f"(--strict)", r.stderr)
        self.assertNotIn("tokens", r.stdout)  # it exited while its first forward was compiled
        # Applied in process before the compile, the refusal is the unit's.
        r = run(PY, MODELS, "--family", "llama", "--apply", self.plan_for("llama"), "--compile",
                "fullgraph", "--out", out, *DEVICE, env=self.in_process_env())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"dynaflow apply: plan refused: LlamaForCausalLM.model: {whole}; the "
                      f"program runs unmodified", r.stderr)
        self.assertIn("in-process: 0 planned and 0 original calls", r.stdout)
        compare(self, self.base_for("llama"), out)


    @unittest.skipUnless(RUNTIME, "needs the built runtime library")
    def test_generate_compiling_its_decode_steps_splits_them_or_refuses_in_one_line(self):
        # generate() with a static cache compiles the decode steps' forward
        # (on a GPU by default). With graph breaks the planned calls in them
        # split; with fullgraph=True the plan is refused in one line at the
        # first compiled step, and the steps run as unmodified.
        for pattern, fullgraph in (("auto_compile", False), ("auto_compile_fullgraph", True)):
            with self.subTest(pattern=pattern):
                out = self.path(f"llama_{pattern}.pt")
                r = run(BIN, "apply", self.plan_for("llama"), "--", PY, MODELS, "--family",
                        "llama", "--patterns", pattern, "--out", out, "--warmup", *DEVICE)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertNotIn("Traceback", r.stderr)
                compiled = re.findall(r"^auto-compile: dynamo compiled (\d+) graphs$", r.stdout,
                                      re.M)
                self.assertTrue(compiled, r.stdout)
                self.assertGreater(int(compiled[0]), 0, r.stdout)  # the first of two runs
                said = [line for line in r.stderr.splitlines() if line.startswith("dynaflow")]
                if fullgraph:
                    self.assertEqual(said, [
                        "dynaflow apply: 1 modules of LlamaForCausalLM run the plan",
                        "dynaflow apply: plan refused: LlamaForCausalLM.model: "
                        "torch.compile(fullgraph=True) traces it into one graph, where a planned "
                        "call cannot run (it runs between graphs): the compiled program runs it "
                        "the original way; the program runs unmodified"])
                else:
                    planned = re.search(r"^dynaflow apply: (\d+) planned and \d+ original calls",
                                        r.stderr, re.M)
                    self.assertIsNotNone(planned, r.stderr)
                    self.assertGreater(int(planned.group(1)), 0)
                    self.assertNotIn("plan refused", r.stderr)
                compare(self, self.outputs_base("llama", pattern), out, (pattern,))

    @unittest.skipUnless(RUNTIME, "needs the built runtime library")
    def test_continuous_batching_runs_unsplit_and_says_why(self):
        # generate_batch() packs the requests into one row over its paged
        # cache: nothing to split by rows, and each call says so.
        out = self.path("llama_continuous_batching.pt")
        r = run(BIN, "apply", "--strict", self.plan_for("llama"), "--", PY, MODELS, "--family",
                "llama", "--patterns", "continuous_batching", "--out", out, *DEVICE)
        self.assertEqual(r.returncode, 0, r.stderr)
        calls = re.search(r"^dynaflow apply: 0 planned and (\d+) original calls of 1 modules$",
                          r.stderr, re.M)
        self.assertIsNotNone(calls, r.stderr)
        self.assertIn(f"dynaflow apply: {calls.group(1)} calls ran the original way: "
                      f"LlamaForCausalLM.model: its batch has 1 row, fewer than the 2 "
                      f"micro-batches of its bucket (sequences packed into one row, as in "
                      f"continuous batching, are one row)", r.stderr)
        compare(self, self.outputs_base("llama", "continuous_batching"), out,
                ("continuous_batching",))

    @unittest.skipUnless(RUNTIME, "needs the built runtime library")
    def test_uneven_batches_more_splits_and_bfloat16_match_the_unmodified_run(self):
        # tests/hf/hf_sweep.py: 18 cases over 12 families, in process.
        self.in_process_script("hf/hf_sweep.py", "18 of 18 cases split and matched", *DEVICE)

    @unittest.skipUnless(RUNTIME, "needs the built runtime library")
    def test_fsdp2_sharded_layers_split_and_a_stack_holding_their_hooks_is_refused(self):
        # tests/dist/fsdp_llama.py: torch's fully_shard over gloo, 2 ranks,
        # 3 training steps each way.
        self.in_process_script("dist/fsdp_llama.py", "4 of 4 FSDP runs as expected")

    @unittest.skipUnless(RUNTIME, "needs the built runtime library")
    def test_lora_adapters_and_accelerate_hooks_split_or_are_refused(self):
        # tests/hf/wrapped_models.py: Llama under PEFT's LoRA (layers, the
        # whole PeftModel, an adapter switched) and accelerate's
        # AlignDevicesHook split with the same outputs; a mixed-adapter batch
        # and cpu_offload are refused before any call runs split.
        self.in_process_script("hf/wrapped_models.py", "6 of 6 cases as expected")

    def test_encoder_decoder_models_split_their_encoder_and_their_decoder(self):
        # The forced plan splits the encoder (T5's was refused: its stack
        # takes past_key_values, and the probe took it for a decoder). The
        # same plan turned onto the decoder splits its EncoderDecoderCache:
        # self- and cross-attention caches (dynamic and static) and the
        # is_updated flags each layer sets once its cross-attention keys
        # exist, per micro-batch and merged back.
        for family, (top, encoder, decoder, layers) in SEQ2SEQ.items():
            with open(self.force_plan(family, "labels")) as f:
                p = json.load(f)
            rules = {r["role"]: r for r in p["partition_rules"] if r["modules"]}
            self.assertEqual(rules["split"]["modules"], [f"{top}.{encoder}"])
            base = self.path(f"{family}_seq2seq_base.pt")
            r = run(PY, MODELS, "--family", family, "--patterns", ",".join(SEQ2SEQ_PATTERNS),
                    "--out", base, *DEVICE)
            self.assertEqual(r.returncode, 0, r.stderr)
            for part in ("encoder", "decoder"):
                with self.subTest(family=family, part=part):
                    unit = f"{top}.{encoder if part == 'encoder' else decoder}"
                    rules["split"]["modules"] = [unit]
                    rules["stage"]["modules"] = [f"{unit}.{layers}.*"]
                    p["buckets"][0]["segments"] = 2  # 2 layers
                    part_plan = self.path(f"{family}_{part}.json")
                    with open(part_plan, "w") as f:
                        json.dump(p, f)
                    out = self.path(f"{family}_{part}.pt")
                    r = run(BIN, "apply", "--verify", "--strict", part_plan, "--", PY, MODELS,
                            "--family", family, "--patterns", ",".join(SEQ2SEQ_PATTERNS),
                            "--out", out, "--warmup", *DEVICE)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    calls, kinds = SEQ2SEQ_CALLS[part]
                    planned = calls - kinds
                    self.assertIn(f"dynaflow apply: {planned} planned and {kinds} original calls "
                                  f"of 1 modules", r.stderr)
                    self.assertIn(f"dynaflow apply: {kinds} calls ran the original way: {unit}: "
                                  f"{AUDITED}", r.stderr)
                    self.assertIn(f"dynaflow apply: {unit} ran staggered (2 segments x 2 "
                                  f"micro-batches) in the predicted order in {planned} of "
                                  f"{planned} calls", r.stderr)
                    self.assertIn(f"({planned} calls)", r.stdout)
                    self.assertNotIn("FAILED", r.stderr + r.stdout)
                    compare(self, base, out, SEQ2SEQ_PATTERNS)


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

