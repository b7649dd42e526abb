#!/usr/bin/env bash
# `dynaflow advise` advice end to end: --plan, --force-strategy, --splits, the
# plan against schemas/plan.schema.json, and every real trace in
# ../shared/traces advised without error with recommendations that agree
# with its timeline. Needs DYNAFLOW_BIN and DYNAFLOW_SOURCE_DIR (ctest sets both).
set -u
. "$(dirname "$0")/lib.sh"
shared="$src/../shared/traces"

# Validates PLAN against the schema with Python's jsonschema when it is
# installed (the C++ validator, plan_test, covers the same rules otherwise).
have_jsonschema=0
python3 -c "import jsonschema" 2>/dev/null && have_jsonschema=1
[ "$have_jsonschema" -eq 1 ] || echo "advise_plan_test: python3 jsonschema absent: schema checks by dynaflow only"
schema_ok() {  # schema_ok PLAN
  [ "$have_jsonschema" -eq 1 ] || return 0
  python3 - "$src/schemas/plan.schema.json" "$1" <<'PY'
import json, sys
import jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
jsonschema.validate(json.load(open(sys.argv[2])), schema, cls=jsonschema.Draft202012Validator)
PY
}

# Recommendations agree with the timeline of the same report.
agrees() {  # agrees REPORT PLAN
  python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); p = json.load(open(sys.argv[2]))
devs, recs = r["devices"], r["recommendations"]
comm = any(d["timeline"]["total_comm_us"] > 0 for d in devs)
copies = any(d["timeline"]["total_memcpy_us"] > 0 for d in devs)
def fail(msg):
    print("  disagreement:", msg); sys.exit(1)
if not devs:
    if recs: fail("recommendations without a GPU")
    if p["strategy"] != "sequential": fail("a GPU-less trace must get a sequential plan")
    sys.exit(0)
if not recs: fail("no recommendation")
if recs[0]["predicted_speedup"] < 1: fail("the best recommendation slows the step")
if not any(x["strategy"] == "sequential" for x in recs): fail("sequential missing")
sim = r["simulation"]
crit = next(d for d in devs if d["rank"] == sim["rank"] and d["device"] == sim["device"])
t, steps = crit["timeline"], crit["steps"]
for x in recs:
    if x["strategy"] in ("comm_overlap", "dual_batch_overlap", "fusion") and not comm:
        fail(x["strategy"] + " without communication")
    if abs(x["predicted_step_us"] - x["baseline_step_us"] / x["predicted_speedup"]) > 1e-6 * x["baseline_step_us"]:
        fail("predicted_step_us is not baseline / speedup")
    if abs(x["baseline_step_us"] - steps["mean_us"]) > 1e-6 * steps["mean_us"]:
        fail("baseline is not the mean step")
# The steps tile at most the device's timeline.
if steps["mean_us"] * steps["count"] > t["total_us"] * 1.01 + 1:
    fail("steps (%g us x %d) exceed the timeline's total %g us" % (steps["mean_us"], steps["count"], t["total_us"]))
for d in devs:
    kinds = {w["kind"] for w in d["idle_windows"]}
    if "communication_exposed" in kinds and d["timeline"]["total_comm_us"] == 0:
        fail("communication window without communication")
    if "copy_exposed" in kinds and d["timeline"]["total_memcpy_us"] == 0:
        fail("copy window without memcpy")
    if sum(w["per_step_us"] for w in d["idle_windows"]) > d["steps"]["mean_us"] * 1.001 + 1:
        fail("windows exceed the step")
    if d["timeline"]["exposed_comm_us"] > 0.05 * d["timeline"]["total_us"] and "communication_exposed" not in kinds:
        fail("exposed communication (%g us) but no window" % d["timeline"]["exposed_comm_us"])
if p["strategy"] != recs[0]["strategy"] and recs[0]["strategy"] != "sequential":
    fail("the plan (%s) is not the best recommendation (%s)" % (p["strategy"], recs[0]["strategy"]))
PY
}

ex0="$src/examples/traces/llama_tp2_rank0.json.gz"
ex1="$src/examples/traces/llama_tp2_rank1.json.gz"

# --- usage errors: exit 2, one line, no output
expect_code "force without plan" 2 "$bin" advise "$ex0" --force-strategy comm_overlap
check "force without plan: one line" test "$(wc -l <"$work/err")" -eq 1
expect_code "unknown strategy" 2 "$bin" advise "$ex0" --force-strategy magic --plan "$work/x.json"
expect_code "splits out of range" 2 "$bin" advise "$ex0" --splits 1 --plan "$work/x.json"
expect_code "plan with --no-advice" 2 "$bin" advise "$ex0" --no-advice --plan "$work/x.json"
check "no plan written on usage errors" test ! -e "$work/x.json"

# --- the examples: a plan, then a forced one
expect_code "advise --plan" 0 "$bin" advise "$ex0" "$ex1" --format json -o "$work/r.json" --plan "$work/plan.json"
check "plan matches the schema" schema_ok "$work/plan.json"
check "plan is dynaflow.plan/1" grep -q '"schema": "dynaflow.plan/1"' "$work/plan.json"
check "recommendations agree" agrees "$work/r.json" "$work/plan.json"
# The example traces record no nn.Module paths (torch.profiler without
# with_modules): a forced split has nothing `apply` could split. Bad input:
# advise exits 2 saying why and writes nothing. (Forced plans of traces with
# module paths: apply_test.sh.)
expect_code "forced nano-batches, no modules" 2 "$bin" advise "$ex0" \
  --force-strategy nanobatch_overlap --splits 3 --plan "$work/forced.json" -o "$work/forced.txt"
check "nothing to split said" has "$work/err" \
  "--force-strategy nanobatch_overlap: nothing to split: no repeated module"
check "no report, no plan" test ! -e "$work/forced.txt" -a ! -e "$work/forced.json"
check "the plan names no operator as a unit" python3 -c "
import json,sys; p=json.load(open(sys.argv[1]))
assert all('::' not in m for r in p['partition_rules'] for m in r['modules']), p" "$work/plan.json"
expect_code "forced sequential" 0 "$bin" advise "$ex0" --force-strategy sequential --plan "$work/seq.json" -o /dev/null
check "the plan's line on stderr" has "$work/err" "dynaflow: wrote the plan $work/seq.json: 0.. tokens: sequential"
check "sequential plan" python3 -c "
import json,sys; p=json.load(open(sys.argv[1])); assert p['strategy']=='sequential' and p['predicted']['speedup']==1" "$work/seq.json"
expect_code "text report" 0 "$bin" advise "$ex0"
check "text has windows" grep -q "Idle-resource windows" "$work/out"
check "text has recommendations" grep -q "^Recommendations" "$work/out"
expect_code "--no-advice" 0 "$bin" advise "$ex0" --no-advice --format json
check "--no-advice: empty recommendations" python3 -c "
import json,sys; j=json.load(open(sys.argv[1])); assert j['recommendations']==[] and j['devices'][0]['idle_windows']==[]" "$work/out"

# --- every real trace: advice without error, agreeing with its timeline
if [ -d "$shared" ]; then
  for f in "$shared"/kineto/*.json.gz "$shared"/nsys/*.sqlite; do
    name=$(basename "$f")
    expect_code "advise $name" 0 "$bin" advise "$f" --format json -o "$work/$name.json" --plan "$work/$name.plan.json"
    [ -s "$work/$name.json" ] || continue
    check "$name: plan matches the schema" schema_ok "$work/$name.plan.json"
    check "$name: recommendations agree with the timeline" agrees "$work/$name.json" "$work/$name.plan.json"
    expect_code "advise $name --format html" 0 "$bin" advise "$f" --format html -o "$work/$name.html"
  done
  expect_code "two ranks" 0 "$bin" advise "$shared/kineto/hta_sampled_rank-0.json.gz" \
    "$shared/kineto/hta_sampled_rank-1.json.gz" --format json -o "$work/ranks.json" --plan "$work/ranks.plan.json"
  check "two ranks agree" agrees "$work/ranks.json" "$work/ranks.plan.json"
else
  skipped="$shared absent: the real-trace checks did not run"
fi

finish
