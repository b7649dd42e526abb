"""schemas/plan.schema.json (through Python's jsonschema) and ValidatePlanJson
(through the plan_validate tool) give the same verdict on a corpus of good and
bad plans, and the verdict each case expects. Cases at and just past every
upper bound, every type and enum, and the checks only dynaflow makes (buckets
tile [0, inf), rules exist), which the schema accepts and dynaflow refuses.

Environment: PLAN_VALIDATE (the tool), DYNAFLOW_SOURCE_DIR. Exit 77 when
jsonschema is missing (scripts/dev.sh installs it into .venv)."""
import copy
import json
import os
import subprocess
import sys
import tempfile

try:
    import jsonschema
except ImportError:
    print("plan_schema_test: SKIPPED: Python's jsonschema is missing "
          "(scripts/dev.sh installs it into .venv)")
    sys.exit(77)

SPLITS, STREAMS, STRING, ITEMS, RULES, BUCKETS = 16, 16, 4096, 4096, 256, 64
INT_MAX, COUNT_MAX = 2**31 - 1, 2**53 - 1


def base():
    """The plan of plan_test.cc's Sample()."""
    bucket = {"predicted_speedup": 1.0, "baseline_step_us": 900.0, "predicted_step_us": 900.0,
              "extra_memory_bytes": 0.0}
    return {
        "schema": "dynaflow.plan/1", "generator": "dynaflow 0.1.0",
        "source": {"traces": ["rank0.json.gz"], "fingerprint": "00112233aabbccdd"},
        "device": {"name": "NVIDIA H200", "rank": 0, "device": 0, "sm_count": 132,
                   "memory_bandwidth_gbps": 4800.0, "peak_tflops_bf16": 989.4,
                   "peaks_known": True},
        "model": {"fingerprint": "ffeeddccbbaa9988", "tokens_per_step": 512.0,
                  "kernels_per_step": 300},
        "forced": False, "strategy": "nanobatch_overlap", "splits": 2,
        "partition_rules": [
            {"name": "nanobatch_overlap.compute", "role": "compute", "operators": ["aten::mm"],
             "modules": []},
            {"name": "nanobatch_overlap.split", "role": "split", "operators": [],
             "modules": ["LlamaForCausalLM.model.layers.*"]}],
        "buckets": [
            dict(bucket, min_tokens=0.0, max_tokens=181.0, strategy="sequential", splits=1,
                 rules=[], streams=[{"id": 0, "role": "compute"}]),
            dict(bucket, min_tokens=181.0, max_tokens=None, strategy="nanobatch_overlap",
                 splits=2, rules=["nanobatch_overlap.compute", "nanobatch_overlap.split"],
                 streams=[{"id": 0, "role": "compute"}, {"id": 1, "role": "memory"},
                          {"id": 2, "role": "communication"}])],
        "predicted": {"baseline_step_us": 3600.0, "predicted_step_us": 3000.0, "speedup": 1.2,
                      "extra_memory_bytes": 33554432.0},
    }


def tiled(n):
    """n buckets tiling [0, inf)."""
    def f(p):
        b = p["buckets"][0]
        p["buckets"] = [dict(b, min_tokens=float(i), max_tokens=float(i + 1)) for i in range(n)]
        p["buckets"][-1]["max_tokens"] = None
    return f


def phased(*phases):
    """The two base buckets once per phase (None: no phase), in this order."""
    def f(p):
        two = p["buckets"]
        p["buckets"] = [dict(b, phase=ph) if ph else dict(b) for ph in phases for b in two]
    return f


def many_rules(n):
    def f(p):
        r = p["partition_rules"][0]
        p["partition_rules"] = [dict(r, name=f"r{i}") for i in range(n)]
        p["buckets"][1]["rules"] = []
    return f


def renamed(name):
    """Partition rule 0 renamed, and the bucket naming it."""
    def f(p):
        p["buckets"][1]["rules"][0] = p["partition_rules"][0]["name"] = name
    return f


def setter(*path_and_value):
    *path, value = path_and_value

    def f(p):
        o = p
        for k in path[:-1]:
            o = o[k]
        o[path[-1]] = value
    return f


def deleter(*path):
    def f(p):
        o = p
        for k in path[:-1]:
            o = o[k]
        del o[path[-1]]
    return f


# (name, mutation, schema verdict, dynaflow verdict): True = valid.
CASES = [
    ("base", lambda p: None, True, True),
    ("module_fingerprint", setter("model", "module_fingerprint", "1b225ad95c61f3fb"), True, True),
    ("phase", setter("model", "phase", "decode"), True, True),
    ("tokens_per_step null", setter("model", "tokens_per_step", None), True, True),
    ("splits at the bound", setter("splits", SPLITS), True, True),
    ("bucket splits at the bound", setter("buckets", 1, "splits", SPLITS), True, True),
    ("splits 2.0 is an integer", setter("splits", 2.0), True, True),
    ("rule name at the bound", renamed("n" * STRING), True, True),
    ("non-ASCII name at the bound (code points)",
     setter("device", "name", "\u00e9" * STRING), True, True),
    ("module pattern at the bound", setter("partition_rules", 1, "modules", ["m" * STRING]),
     True, True),
    ("modules at the bound", setter("partition_rules", 1, "modules", ["m"] * ITEMS), True, True),
    ("operators at the bound", setter("partition_rules", 0, "operators", ["op"] * ITEMS),
     True, True),
    ("traces at the bound", setter("source", "traces", ["t"] * ITEMS), True, True),
    ("partition rules at the bound", many_rules(RULES), True, True),
    ("buckets at the bound", tiled(BUCKETS), True, True),
    ("a tiling per phase", phased("prefill", "decode"), True, True),
    ("a tiling per phase and one for the rest", phased("decode", None, "training"), True, True),
    ("one phase's tiling", phased("mixed"), True, True),
    ("streams at the bound", setter("buckets", 1, "streams",
                                    [{"id": i, "role": "compute"} for i in range(STREAMS)]),
     True, True),
    ("rank at the bound", setter("device", "rank", INT_MAX), True, True),
    ("kernels_per_step at the bound", setter("model", "kernels_per_step", COUNT_MAX), True, True),
    # Upper bounds.
    ("splits 100000", setter("splits", 100000), False, False),
    ("splits past the bound", setter("splits", SPLITS + 1), False, False),
    ("bucket splits 100000", setter("buckets", 1, "splits", 100000), False, False),
    ("bucket splits 2^63", setter("buckets", 1, "splits", 2**63), False, False),
    ("bucket splits 1e300", setter("buckets", 1, "splits", 1e300), False, False),
    ("rule name past the bound", renamed("n" * (STRING + 1)), False, False),
    ("non-ASCII name past the bound", setter("device", "name", "\u00e9" * (STRING + 1)),
     False, False),
    ("module pattern past the bound",
     setter("partition_rules", 1, "modules", ["m" * (STRING + 1)]), False, False),
    ("generator past the bound", setter("generator", "g" * (STRING + 1)), False, False),
    ("modules past the bound", setter("partition_rules", 1, "modules", ["m"] * (ITEMS + 1)),
     False, False),
    ("operators past the bound", setter("partition_rules", 0, "operators", ["o"] * (ITEMS + 1)),
     False, False),
    ("traces past the bound", setter("source", "traces", ["t"] * (ITEMS + 1)), False, False),
    ("bucket rules past the bound",
     setter("buckets", 1, "rules", ["nanobatch_overlap.split"] * (ITEMS + 1)), False, False),
    ("partition rules past the bound", many_rules(RULES + 1), False, False),
    ("buckets past the bound", tiled(BUCKETS + 1), False, False),
    ("streams past the bound", setter("buckets", 1, "streams",
                                      [{"id": i % 4, "role": "compute"} for i in range(17)]),
     False, False),
    ("stream id past the bound", setter("buckets", 1, "streams", 0, "id", STREAMS), False, False),
    ("rank past the bound", setter("device", "rank", INT_MAX + 1), False, False),
    ("kernels_per_step past the bound", setter("model", "kernels_per_step", COUNT_MAX + 1),
     False, False),
    ("tokens_per_step past the bound", setter("model", "tokens_per_step", 1e16), False, False),
    ("max_tokens past the bound", setter("buckets", 0, "max_tokens", 1e16), False, False),
    # Types, enums, keys.
    ("splits 0", setter("splits", 0), False, False),
    ("splits -1", setter("splits", -1), False, False),
    ("splits 2.5", setter("splits", 2.5), False, False),
    ("splits a string", setter("splits", "2"), False, False),
    ("splits a boolean", setter("splits", True), False, False),
    ("sm_count negative", setter("device", "sm_count", -1), False, False),
    ("speedup a string", setter("predicted", "speedup", "fast"), False, False),
    ("peaks_known a number", setter("device", "peaks_known", 1), False, False),
    ("schema of another version", setter("schema", "dynaflow.plan/2"), False, False),
    ("unknown strategy", setter("strategy", "magic"), False, False),
    ("unknown rule role", setter("partition_rules", 0, "role", "other"), False, False),
    ("unknown stream role", setter("buckets", 0, "streams", 0, "role", "gpu"), False, False),
    ("no streams", setter("buckets", 0, "streams", []), False, False),
    ("no buckets", setter("buckets", []), False, False),
    ("missing key", deleter("buckets"), False, False),
    ("missing nested key", deleter("device", "name"), False, False),
    ("extra key", setter("extra", 1), False, False),
    ("extra nested key", setter("buckets", 0, "extra", 1), False, False),
    ("module name not a string", setter("partition_rules", 1, "modules", [7]), False, False),
    ("module_fingerprint a number", setter("model", "module_fingerprint", 7), False, False),
    ("phase not a phase", setter("model", "phase", "warmup"), False, False),
    ("bucket phase not a phase", setter("buckets", 0, "phase", "warmup"), False, False),
    ("the next bucket's phase a number", setter("buckets", 1, "phase", 7), False, False),
    ("the next bucket not an object", setter("buckets", 1, 5), False, False),
    # What only dynaflow checks (the schema's description says so).
    ("first bucket not at 0", setter("buckets", 0, "min_tokens", 5.0), True, False),
    ("buckets with a gap", setter("buckets", 1, "min_tokens", 200.0), True, False),
    ("last bucket closed", setter("buckets", 1, "max_tokens", 4096.0), True, False),
    ("bucket names no rule", setter("buckets", 1, "rules", ["nope"]), True, False),
    ("a phase's buckets apart", phased("prefill", "decode", "prefill"), True, False),
    ("a phase's tiling without its first bucket",
     lambda p: (phased("prefill", "decode")(p), p["buckets"].pop(2)), True, False),
    ("a phase's tiling closed", lambda p: (phased("prefill", "decode")(p),
                                           p["buckets"][1].update(max_tokens=4096.0)), True, False),
    ("half a bucket's phase", setter("buckets", 1, "phase", "decode"), True, False),
]


def main():
    src = os.environ["DYNAFLOW_SOURCE_DIR"]
    tool = os.environ["PLAN_VALIDATE"]
    with open(os.path.join(src, "schemas", "plan.schema.json"), encoding="utf-8") as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="plan_schema_test.") as tmp:
        files = []
        for i, (name, mutate, _, _) in enumerate(CASES):
            plan = copy.deepcopy(base())
            mutate(plan)
            path = os.path.join(tmp, f"case{i:03d}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(plan, f, ensure_ascii=False)
            files.append(path)
        out = subprocess.run([tool] + files, capture_output=True, text=True, check=True).stdout
        verdicts = dict(line.split("\t", 1) for line in out.splitlines())
        for path, (name, _, want_schema, want_dynaflow) in zip(files, CASES):
            with open(path, encoding="utf-8") as f:
                plan = json.load(f)
            errors = list(validator.iter_errors(plan))
            schema_ok = not errors
            dynaflow_ok = verdicts[path] == "ok"
            line = f"{name}: schema {'valid' if schema_ok else 'invalid'}, dynaflow " \
                   f"{'valid' if dynaflow_ok else 'invalid'}"
            if schema_ok != want_schema or dynaflow_ok != want_dynaflow:
                failures += 1
                why = errors[0].message[:160] if errors else verdicts[path][:160]
                print(f"FAIL {line}; expected schema {want_schema}, dynaflow {want_dynaflow} "
                      f"({why})")
            else:
                print(f"ok   {line}" + ("" if dynaflow_ok else f" ({verdicts[path][:100]})"))
    print(f"plan_schema_test: {len(CASES) - failures} of {len(CASES)} cases agree")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
