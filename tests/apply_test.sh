#!/usr/bin/env bash
# End-to-end tests of `dynaflow apply` on the CPU: a forced split plan from
# `dynaflow advise` of a traced run of examples/llama_decode.py, applied to the
# unmodified program with --verify (same tokens as the original run), plans
# refused for an unknown module or another device with and without --strict,
# a verify failure caught, and bad plans or commands; torch.distributed over
# gloo in two processes (tensor parallel written by hand and with torch's
# DTensor parallelism, and DDP training of a tiny Hugging Face Llama when
# transformers is installed).
#
# Needs DYNAFLOW_BIN and DYNAFLOW_SOURCE_DIR (ctest sets both) and
# DYNAFLOW_PYTHON, a Python with torch (the checkout's .venv by default);
# exits 77 (skipped) when that Python has no torch.
set -u
. "$(dirname "$0")/lib.sh"
py=${DYNAFLOW_PYTHON:-$src/.venv/bin/python}

if ! "$py" -c "import torch" 2>/dev/null; then
  echo "SKIP: $py cannot import torch"
  exit 77
fi
# Two requests: under apply the first call of each kind (the prefill, a decode
# step) runs the original way while its operators are audited (dynaflow/_rows.py).
decode=("$py" "$src/examples/llama_decode.py" --batch 4 --decode-steps 4 --requests 2)

# edit_plan IN OUT PYTHON: OUT is IN after PYTHON ran on it as `p`; in it,
# units(p, [patterns]) makes the split units those patterns, unstaggered.
edit_plan() {
  "$py" - "$1" "$2" "$3" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
def units(p, patterns):
    p["partition_rules"] = [r for r in p["partition_rules"] if r["role"] != "stage"]
    p["partition_rules"][0]["modules"] = patterns
    for b in p["buckets"]:
        b.pop("segments", None)
        b["rules"] = [n for n in b["rules"] if n.endswith(".split")]
exec(sys.argv[3])
json.dump(p, open(sys.argv[2], "w"))
PY
}

# close A B: the outputs A and B print the same "step" lines (tp_mlp.py's
# outputs), their numbers within 1e-5 of each other relative to the line's
# largest: float32 outputs, which kernels of other shapes (a micro-batch's
# rows) or other modules (nn.Linear against `x @ w.t()`) may round otherwise
# on another CPU.
close() {
  "$py" - "$1" "$2" <<'PY'
import re, sys
number = re.compile(r"-?\d+\.\d*(?:e[+-]?\d+)?")
a, b = ([l for l in open(f).read().splitlines() if l.startswith("step ")] for f in sys.argv[1:])
def same(x, y):
    xs, ys = [float(n) for n in number.findall(x)], [float(n) for n in number.findall(y)]
    scale = max([1.0] + [abs(v) for v in xs + ys])
    return (number.sub("#", x) == number.sub("#", y) and len(xs) == len(ys) and
            all(abs(u - v) <= 1e-5 * scale for u, v in zip(xs, ys)))
sys.exit(0 if len(a) == len(b) and a and all(map(same, a, b)) else 1)
PY
}

# --- bad input
echo '{}' >"$work/empty.json"
echo 'not json' >"$work/junk.json"
expect_code "missing plan" 2 "$bin" apply "$work/none.json" -- /bin/true
check "missing plan says so" has "$work/err" "cannot read the plan"
expect_code "not JSON" 2 "$bin" apply "$work/junk.json" -- /bin/true
expect_code "not a plan" 2 "$bin" apply "$work/empty.json" -- /bin/true

# --- the plan: trace on the CPU, force a 2-way split
expect_code "trace" 0 "$bin" trace -o "$work/run.db" -- "${decode[@]}"
expect_code "advise forced" 0 "$bin" advise "$work/run.db" --plan "$work/plan.json" \
  --force-strategy nanobatch_overlap --splits 2
check "plan splits the decoder stack" has "$work/plan.json" '"LlamaForCausalLM.model"'
check "plan cuts it at the layers' attention" has "$work/plan.json" '"LlamaForCausalLM.model.layers.*.attn"'
expect_code "command not found" 127 "$bin" apply "$work/plan.json" -- "$work/no-such-program"
# Past the schema's bounds: refused in one line before the program starts
# (splits: 100000 used to abort it with exit 134; long names are quoted cut).
edit_plan "$work/plan.json" "$work/huge_splits.json" \
  'p["splits"] = 100000; [b.update(splits=100000) for b in p["buckets"] if b["splits"] > 1]'
expect_code "splits past the bound" 2 "$bin" apply "$work/huge_splits.json" -- /bin/touch "$work/ran"
check "splits bound named" has "$work/err" "splits: must be an integer in [1, 16]"
check "one line" test "$(wc -l <"$work/err")" -eq 1
check "the program never started" test ! -e "$work/ran"
edit_plan "$work/plan.json" "$work/long_name.json" \
  '[r.update(modules=["M." + "n" * 10**7]) for r in p["partition_rules"] if r["role"] == "split"]'
expect_code "long module name" 2 "$bin" apply "$work/long_name.json" -- /bin/true
check "long name not echoed" test "$(wc -c <"$work/err")" -lt 400

# --- applied, verified, same tokens
"${decode[@]}" >"$work/base.out" 2>&1
base=$(grep checksum "$work/base.out")
expect_code "apply --verify" 0 "$bin" apply --verify "$work/plan.json" -- "${decode[@]}"
check "same tokens as the original run" has_lines "$work/out" "$base"
check "verify line" grep -qE '^verify: max_abs_diff=[0-9.e+-]+ max_rel_diff=[0-9.e+-]+ \(6 calls\)' "$work/out"
check "every stack call after the audited ones planned" has "$work/err" \
  "6 planned and 2 original calls of 1 modules"
check "the audited calls said" has "$work/err" \
  "2 calls ran the original way: LlamaForCausalLM.model: the first call of its kind, run the original way to prove that its operators keep the rows apart"
check "every stack call staggered as predicted" has "$work/err" \
  "LlamaForCausalLM.model ran staggered (4 segments x 2 micro-batches) in the predicted order in 6 of 6 calls"

expect_code "advise dual batch" 0 "$bin" advise "$work/run.db" --plan "$work/dbo.json" \
  --force-strategy dual_batch_overlap
expect_code "apply dual batch" 0 "$bin" apply --verify "$work/dbo.json" -- "${decode[@]}"
check "dual batch: same tokens" has_lines "$work/out" "$base"

# Training (examples/train_step.py): forward split, backward through the
# merged outputs, same losses; --verify's baseline leaves the tensors autograd
# saved untouched.
train=("$py" "$src/examples/train_step.py")
expect_code "trace training" 0 "$bin" trace -o "$work/train.db" -- "${train[@]}"
expect_code "advise training" 0 "$bin" advise "$work/train.db" --plan "$work/train.json" \
  --force-strategy nanobatch_overlap --splits 2
"${train[@]}" >"$work/train_base.out" 2>&1
losses=$(grep -o "loss .*" "$work/train_base.out")
expect_code "apply --verify training" 0 "$bin" apply --verify --strict "$work/train.json" -- \
  "${train[@]}"
check "training: same losses" has "$work/out" "$losses"
check "training: every stack call after the first planned" has "$work/err" "2 planned and 1 original calls"
check "training: verify line" grep -qE '^verify: .* \(2 calls\)' "$work/out"

# Sequential below 8 tokens: decode steps (4 tokens) run the original path,
# the prefill (4 x 32 tokens) the plan.
edit_plan "$work/plan.json" "$work/bucketed.json" '
split = p["buckets"][0]
seq = dict(split, strategy="sequential", splits=1, rules=[], max_tokens=8)
p["buckets"] = [seq, dict(split, min_tokens=8)]'
expect_code "bucketed" 0 "$bin" apply "$work/bucketed.json" -- "${decode[@]}"
check "prefill planned, decode original" has "$work/err" "1 planned and 7 original calls"
check "bucketed: same tokens" has_lines "$work/out" "$base"

# --- plans that do not fit
edit_plan "$work/plan.json" "$work/unknown.json" \
  'units(p, ["LlamaForCausalLM.model.blocks.*"])'
expect_code "unknown module runs unmodified" 0 "$bin" apply "$work/unknown.json" -- "${decode[@]}"
check "unknown module named" has "$work/err" "plan refused: unknown module LlamaForCausalLM.model.blocks.*"
check "unmodified run: same tokens" has_lines "$work/out" "$base"
expect_code "unknown module --strict" 2 "$bin" apply --strict "$work/unknown.json" -- "${decode[@]}"
check "--strict says it exits" has "$work/err" "exiting (--strict)"

edit_plan "$work/plan.json" "$work/h200.json" 'p["device"]["name"] = "NVIDIA H200"'
expect_code "another device" 0 "$bin" apply "$work/h200.json" -- "${decode[@]}"
check "device named" has "$work/err" "the plan is for NVIDIA H200, the model runs on cpu"
expect_code "another device --strict" 2 "$bin" apply --strict "$work/h200.json" -- "${decode[@]}"

# torch imported, but the plan's model never runs.
expect_code "model never runs" 0 "$bin" apply "$work/plan.json" -- "$py" -c "import torch"
check "model never runs: said" has "$work/err" "plan not applied: no module LlamaForCausalLM ran"
check "model never runs: said once" test "$(grep -c "no module LlamaForCausalLM ran" "$work/err")" -eq 1
expect_code "model never runs --strict" 2 "$bin" apply --strict "$work/plan.json" -- \
  "$py" -c "import torch"

expect_code "no torch" 0 "$bin" apply "$work/plan.json" -- /bin/echo hi
check "no torch said" has "$work/err" "never imported torch"
expect_code "no torch --strict" 2 "$bin" apply --strict "$work/plan.json" -- /bin/echo hi
# A program killed before its exit reports nothing: not taken for one without torch.
expect_code "killed" 137 "$bin" apply "$work/plan.json" -- "$py" -c \
  "import os, signal, torch; os.kill(os.getpid(), signal.SIGKILL)"
check "killed said" has "$work/err" \
  "no Python process of the program reported (each reports at its exit: they died first"

# --- torch.distributed over gloo, two processes: a tensor-parallel MLP whose
# layers all_reduce. The plan's unit is the model itself (the first call,
# which attaches the plan, runs the original: torch chose its forward before
# the hook ran), cut at each layer. Each rank must issue the micro-batches' collectives in the
# same order (on the CPU they run one after the other), or gloo sums one
# rank's micro-batch 0 with the other's micro-batch 1: silently wrong.
# Four steps: the first of each rank runs the original way while it is audited.
tp=("$py" "$src/tests/dist/tp_mlp.py" --steps 4)
expect_code "trace tensor parallel" 0 "$bin" trace -o "$work/tp.db" -- "${tp[@]}"
expect_code "advise tensor parallel" 0 "$bin" advise "$work/tp.db" --plan "$work/tp.json" \
  --force-strategy nanobatch_overlap --splits 2
"${tp[@]}" >"$work/tp_base.out" 2>"$work/base.err"
expect_code "apply --verify tensor parallel" 0 "$bin" apply --verify --strict "$work/tp.json" -- \
  "${tp[@]}"
check "tensor parallel: same outputs" close "$work/out" "$work/tp_base.out"
check "tensor parallel: both ranks planned" has "$work/err" \
  "4 planned and 4 original calls of 1 modules in 2 processes"
check "tensor parallel: verify line" grep -qE '^verify: .* \(4 calls\)' "$work/out"
check "tensor parallel: the sequencer's order on both ranks" has "$work/err" \
  "TPModel ran staggered (3 segments x 2 micro-batches) in the predicted order in 4 of 4 calls"
# Dual-batch overlap: the model cut at its all_reduce calls, both micro-batches'
# compute in turn, one's collective beside the other's compute (on the CPU the
# sequencer's order, the same on both ranks).
expect_code "advise dual batch, tensor parallel" 0 "$bin" advise "$work/tp.db" \
  --plan "$work/tp_dbo.json" --force-strategy dual_batch_overlap
check "dual batch plan: the model, 3 collectives" "$py" -c '
import json, sys
p = json.load(open(sys.argv[1]))
assert p["buckets"][0]["segments"] == 3, p["buckets"][0]
assert p["partition_rules"][0]["modules"] == ["TPModel"], p["partition_rules"]' "$work/tp_dbo.json"
expect_code "apply dual batch, tensor parallel" 0 "$bin" apply --verify --strict "$work/tp_dbo.json" \
  -- "${tp[@]}"
check "dual batch, tensor parallel: same outputs" close "$work/out" "$work/tp_base.out"
check "dual batch, tensor parallel: the predicted order" has "$work/err" \
  "TPModel ran dual-batch (3 collectives x 2 micro-batches) in the predicted order in 4 of 4 calls"
# Communication overlap: each layer's all_reduce launched asynchronously and
# waited for just before the residual add reads it.
expect_code "advise comm overlap, tensor parallel" 0 "$bin" advise "$work/tp.db" \
  --plan "$work/tp_overlap.json" --force-strategy comm_overlap
check "comm overlap plan: the layers" has "$work/tp_overlap.json" '"TPModel.layers.*"'
expect_code "apply comm overlap, tensor parallel" 0 "$bin" apply --verify --strict \
  "$work/tp_overlap.json" -- "${tp[@]}"
check "comm overlap, tensor parallel: same outputs" close "$work/out" "$work/tp_base.out"
check "comm overlap, tensor parallel: every layer call planned" has "$work/err" \
  "24 planned and 0 original calls of 3 modules in 2 processes"
check "comm overlap, tensor parallel: collectives overlapped" has "$work/err" \
  "24 collectives launched asynchronously"
# The residual add reads each all_reduce's result right after its launch.
check "comm overlap, tensor parallel: what ran beside them" has "$work/err" \
  "24 read inside their call, 0 operators ran beside them"
check "comm overlap, tensor parallel: verify line" grep -qE '^verify: .* \(24 calls\)' "$work/out"
expect_code "nothing to overlap" 2 "$bin" advise "$work/run.db" --plan "$work/no_overlap.json" \
  --force-strategy comm_overlap
check "nothing to overlap said" has "$work/err" "--force-strategy comm_overlap: nothing to overlap"
check "nothing to overlap: no plan written" test ! -e "$work/no_overlap.json"
# The same with the layers as units, unstaggered: the micro-batches run in order.
edit_plan "$work/tp.json" "$work/tp_layers.json" 'units(p, ["TPModel.layers.*"])'
expect_code "apply tensor parallel, layer units" 0 "$bin" apply --verify --strict \
  "$work/tp_layers.json" -- "${tp[@]}"
check "tensor parallel, layer units: same outputs" close "$work/out" "$work/tp_base.out"
check "tensor parallel, layer units: both ranks planned" has "$work/err" \
  "18 planned and 6 original calls of 3 modules in 2 processes"
# The same sum by a list reduce_scatter and a list all_gather (each rank sums
# half of the features): row by row, so the layers split as with all_reduce.
# Before, the audit had no rule for either and refused the plan.
"${tp[@]}" --gather-scatter >"$work/tp_gs_base.out" 2>"$work/base.err"
expect_code "apply tensor parallel, gather-scatter" 0 "$bin" apply --verify --strict \
  "$work/tp_layers.json" -- "${tp[@]}" --gather-scatter
check "tensor parallel, gather-scatter: same outputs" close "$work/out" "$work/tp_gs_base.out"
check "tensor parallel, gather-scatter: both ranks planned" has "$work/err" \
  "18 planned and 6 original calls of 3 modules in 2 processes"
check "tensor parallel, gather-scatter: verify line" grep -qE '^verify: .* \(18 calls\)' "$work/out"
# The same layers sharded by torch's own tensor parallelism (DTensor weights,
# ColwiseParallel and RowwiseParallel hooks): nothing dynaflow can prove. As
# units, the layers are refused for the hooks inside them, and the Linear
# modules for their DTensor arguments, each in one line on both ranks, before
# anything runs split; the outputs are the unmodified run's (the same as the
# hand-written layers').
"${tp[@]}" --dtensor >"$work/tp_dt_base.out" 2>"$work/base.err"
check "DTensor layers: the hand-written layers' outputs" close "$work/tp_dt_base.out" \
  "$work/tp_base.out"
expect_code "apply tensor parallel, DTensor layers" 0 timeout 300 "$bin" apply \
  "$work/tp_layers.json" -- "${tp[@]}" --dtensor
check "DTensor layers: same outputs" close "$work/out" "$work/tp_dt_base.out"
refusals=$(grep -c "plan refused: TPModel.layers.0.up: forward pre-hook distribute_module" \
  "$work/err")
check "DTensor layers: the sharding hooks refused on both ranks ($refusals)" test "$refusals" -eq 2
check "DTensor layers: nothing split" has "$work/err" \
  "0 planned and 24 original calls of 3 modules in 2 processes"
edit_plan "$work/tp.json" "$work/tp_linear.json" \
  'units(p, ["TPModel.layers.*.up", "TPModel.layers.*.down"])'
expect_code "apply tensor parallel, DTensor Linear units" 0 timeout 300 "$bin" apply \
  "$work/tp_linear.json" -- "${tp[@]}" --dtensor
check "DTensor Linear units: same outputs" close "$work/out" "$work/tp_dt_base.out"
refusals=$(grep -c \
  "plan refused: TPModel.layers.0.down: its batch argument of type DTensor is a tensor subclass" \
  "$work/err")
check "DTensor Linear units: refused on both ranks ($refusals)" test "$refusals" -eq 2
check "DTensor Linear units: nothing split" has "$work/err" \
  "0 planned and 48 original calls of 6 modules in 2 processes"
# Each layer divided by the batch's rows over both ranks, an all_reduce of a
# number made in Python: the first call's comparison differs on both ranks
# (whose collectives it issues in the same order), so both refuse the plan
# there and run unmodified; before, this exited 0 with outputs off by 0.49.
"${tp[@]}" --batch-scaled >"$work/tp_scaled_base.out" 2>"$work/base.err"
expect_code "apply tensor parallel, batch-scaled" 0 "$bin" apply "$work/tp_layers.json" -- \
  "${tp[@]}" --batch-scaled
check "tensor parallel, batch-scaled: same outputs" close "$work/out" "$work/tp_scaled_base.out"
check "tensor parallel, batch-scaled: refused at the first call" has "$work/err" \
  "plan refused: TPModel.layers.0: the first call of its kind, run split in 2 on a copy of its arguments, computed another result"
refusals=$(grep -c "plan refused: TPModel.layers.0: the first call of its kind" "$work/err")
check "tensor parallel, batch-scaled: refused on both ranks ($refusals)" test "$refusals" -eq 2
[ "$refusals" -eq 2 ] || cut -c1-300 "$work/err"
# Only rank 1's layers add a number made of the batch size, after the
# all_reduce: only its comparison differs. The ranks agree at that audited
# call (the audit saw the layer's all_reduce, on the world group), so rank 0
# refuses too; before, rank 0 split and rank 1 did not, and gloo aborted the
# program ("Received data size doesn't match expected size").
"${tp[@]}" --rank1-batch-number >"$work/tp_rank1_base.out" 2>"$work/base.err"
expect_code "apply tensor parallel, one rank refuses" 0 timeout 300 "$bin" apply \
  "$work/tp_layers.json" -- "${tp[@]}" --rank1-batch-number
check "tensor parallel, one rank refuses: same outputs" close "$work/out" "$work/tp_rank1_base.out"
check "tensor parallel, one rank refuses: its reason" has "$work/err" \
  "plan refused: TPModel.layers.0: the first call of its kind, run split in 2 on a copy of its arguments, computed another result"
check "tensor parallel, one rank refuses: the other rank with it" has "$work/err" \
  "plan refused: TPModel.layers.0: another rank of its process group refused the plan at this call"
# Only rank 1's input gain, a module that issues no collectives, adds a number
# made of the batch size: only rank 1 refuses the gain's calls, and the layers,
# whose all_reduces pair with rank 0's, go on split on both ranks. Before, the
# refusal ended the whole plan on rank 1: rank 0's agreement at a layer's
# audited first call met rank 1's next all_reduce, and gloo aborted.
edit_plan "$work/tp.json" "$work/tp_gain.json" 'units(p, ["TPModel.gain", "TPModel.layers.*"])'
"${tp[@]}" --rank1-gain-number >"$work/tp_gain_base.out" 2>"$work/base.err"
expect_code "apply tensor parallel, one rank refuses a unit without collectives" 0 timeout 300 \
  "$bin" apply --verify "$work/tp_gain.json" -- "${tp[@]}" --rank1-gain-number
check "tensor parallel, one rank refuses a gain: same outputs" close "$work/out" "$work/tp_gain_base.out"
refusals=$(grep -c "plan refused: TPModel.gain: the first call of its kind" "$work/err")
check "tensor parallel, one rank refuses a gain: on rank 1 only ($refusals)" test "$refusals" -eq 1
# Per rank: each unit's first call is audited; rank 1 runs the gain's other 3
# calls the original way, and every other later call splits.
check "tensor parallel, one rank refuses a gain: the layers split on both ranks" has "$work/err" \
  "21 planned and 11 original calls of 4 modules in 2 processes"
check "tensor parallel, one rank refuses a gain: its calls said" has "$work/err" \
  "3 calls ran the original way: TPModel.gain: the first call of its kind"
check "tensor parallel, one rank refuses a gain: verify line" \
  grep -qE '^verify: .* \(21 calls\)' "$work/out"

# --- data parallel over gloo, two processes: a tiny Hugging Face Llama trained
# under torch's DistributedDataParallel, the plan traced through DDP (its units
# under DistributedDataParallel.module). Each layer's weights get their
# gradients from both micro-batches before DDP's reducer averages them across
# the ranks: losses and weights as the unmodified run's, within float
# rounding (the weight gradients are summed in another order).
if "$py" -c "import transformers" 2>/dev/null; then
  ddp=("$py" "$src/tests/dist/ddp_llama.py" --steps 3)
  expect_code "trace data parallel" 0 "$bin" trace -o "$work/ddp.db" -- "${ddp[@]}"
  expect_code "advise data parallel" 0 "$bin" advise "$work/ddp.db" --plan "$work/ddp.json" \
    --force-strategy nanobatch_overlap --splits 2
  check "data parallel plan: the decoder under DDP" has "$work/ddp.json" \
    '"DistributedDataParallel.module.model"'
  "${ddp[@]}" >"$work/ddp_base.out" 2>/dev/null
  expect_code "apply --verify data parallel" 0 "$bin" apply --verify --strict "$work/ddp.json" -- \
    "${ddp[@]}"
  check "data parallel: both ranks planned" has "$work/err" \
    "4 planned and 2 original calls of 1 modules in 2 processes"
  check "data parallel: verify line" grep -qE '^verify: .* \(4 calls\)' "$work/out"
  check "data parallel: losses and weights as unmodified" "$py" -c '
import json, math, sys
base, planned = (json.loads(next(l for l in open(f) if l.startswith("{"))) for f in sys.argv[1:])
assert len(planned["losses"]) == 3, planned
for b, p in zip(base["losses"] + [base["parameters"]], planned["losses"] + [planned["parameters"]]):
    assert math.isclose(b, p, rel_tol=1e-5), (base, planned)' "$work/ddp_base.out" "$work/out"
else
  skipped="$skipped data parallel (no transformers for $py);"
fi

# --- modules that compute across the rows of the batch
# BatchNorm in training mode normalises by the batch's statistics: refused
# before anything runs, the program runs unmodified.
cat >"$work/bn.py" <<'PY'
import sys
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
                                    for _ in range(2))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x

torch.manual_seed(0)
print("sum", round(float(Net()(torch.randn(16, 8) * torch.arange(1, 17).unsqueeze(1)).sum()), 3))
PY
edit_plan "$work/plan.json" "$work/bn.json" '
units(p, ["Net.blocks.*"])
del p["model"]["module_fingerprint"]'
"$py" "$work/bn.py" >"$work/bn_base.out"
expect_code "batch norm refused" 0 "$bin" apply "$work/bn.json" -- "$py" "$work/bn.py"
check "batch norm named" has "$work/err" \
  "plan refused: Net.blocks.0.1: BatchNorm1d normalises by the statistics of the whole batch"
check "refusal said once" test "$(grep -c "plan refused" "$work/err")" -eq 1
check "batch norm: unmodified result" has_lines "$work/out" "$(cat "$work/bn_base.out")"
expect_code "batch norm --strict" 2 "$bin" apply --strict "$work/bn.json" -- "$py" "$work/bn.py"

# Blocks a plan may not split as is. Center mixes rows in its own code (it
# centres each column on the batch's mean): the audit of its first call, which
# runs the original way, refuses the plan before any call runs split, and the
# program's result is its own. So is Noise, which draws random numbers (split,
# each micro-batch would draw its own), and Count, which multiplies by the
# batch size. Mean divides by the batch size as a float computed in Python,
# which no audit of operators can trace back to the batch: the audited call,
# run split on a copy of its arguments too, computes another result, so the
# plan is refused at the first call. LaterMean does so only from the
# program's second call on, which no first call shows: --verify says so.
# Later draws random numbers only from the second call on: the split call
# that does is a loud error, and says that it raises.
cat >"$work/blocks.py" <<'PY'
import sys, torch
from torch import nn

class Center(nn.Module):
    def forward(self, x):
        return x - x.mean(0, keepdim=True)

class Noise(nn.Module):
    def forward(self, x):
        return x + torch.rand(x.shape[1])

class Count(nn.Module):
    def forward(self, x):
        return x * x.shape[0]

class Mean(nn.Module):
    def forward(self, x):
        return x * (1.0 / x.shape[0])

step = [0]  # the program's call

class LaterMean(nn.Module):
    def forward(self, x):
        return x * (1.0 / x.shape[0]) if step[0] else x

class Later(nn.Module):
    def forward(self, x):
        return x + torch.rand(x.shape[1]) if step[0] else x

class Net(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.blocks = nn.ModuleList(block() for _ in range(2))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x

torch.manual_seed(0)
net = Net({"center": Center, "noise": Noise, "count": Count, "mean": Mean,
           "latemean": LaterMean, "later": Later}[sys.argv[1]])
x = torch.arange(16.0).reshape(8, 2)
for step[0] in range(2):
    print("sum of squares", float((net(x) ** 2).sum()))
PY
"$py" "$work/blocks.py" center >"$work/mix_base.out"
expect_code "row mixing refused" 0 "$bin" apply "$work/bn.json" -- "$py" "$work/blocks.py" center
check "row mixing named" has "$work/err" \
  "plan refused: Net.blocks.0: aten::sub.Tensor combines a value reduced over the rows with the rows (at blocks.py:6 forward)"
check "row mixing: unmodified result" has_lines "$work/out" "$(cat "$work/mix_base.out")"
expect_code "row mixing --strict" 2 "$bin" apply --strict "$work/bn.json" -- "$py" \
  "$work/blocks.py" center
for block in noise mean count; do
  "$py" "$work/blocks.py" $block >"$work/${block}_base.out"
  expect_code "$block refused" 0 "$bin" apply "$work/bn.json" -- "$py" "$work/blocks.py" $block
  check "$block: unmodified result" has_lines "$work/out" "$(cat "$work/${block}_base.out")"
done
check "count named" has "$work/err" \
  "plan refused: Net.blocks.0: aten::mul.Tensor takes the batch size (8) as a number: split, each micro-batch would pass its own row count (at blocks.py:14 forward)"
expect_code "noise refused" 0 "$bin" apply "$work/bn.json" -- "$py" "$work/blocks.py" noise
check "noise named" has "$work/err" \
  "plan refused: Net.blocks.0: the call draws random numbers (dropout in training, say)"
expect_code "mean refused" 0 "$bin" apply "$work/bn.json" -- "$py" "$work/blocks.py" mean
check "mean named" has "$work/err" \
  "plan refused: Net.blocks.0: the first call of its kind, run split in 2 on a copy of its arguments, computed another result (output: torch.float32 differs beyond rtol=0.0001 atol=1e-05 (max abs 1.88)): its forward uses the batch size as a number"
expect_code "verify fails" 1 "$bin" apply --verify "$work/bn.json" -- "$py" "$work/blocks.py" \
  latemean
check "verify failure named" has "$work/err" "verify: FAILED: Net.blocks.0: output"
expect_code "a later draw raises" 1 "$bin" apply "$work/bn.json" -- "$py" "$work/blocks.py" later
check "a later draw says it raises" has "$work/err" \
  "plan refused: Net.blocks.0: the call drew random numbers, which the first call of its kind did not"
check "a later draw's outcome" has "$work/err" \
  "; this call raises (its micro-batches ran), and the program runs unmodified after it"

# --- calls that run unsplit for a reason that passes, counted by reason: the
# first call of a lazy module inside a unit infers its parameters (a unit's own
# lazy hook runs once, before the split); later calls split
cat >"$work/lazy.py" <<'PY'
import torch
from torch import nn

class LazyStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.LazyLinear(8), nn.ReLU())
                                     for _ in range(4)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

model, x = LazyStack(), torch.randn(4, 8)
for _ in range(3):  # infers its parameters, is audited, splits
    model(x)
PY
edit_plan "$work/plan.json" "$work/lazy.json" 'units(p, ["LazyStack.layers.*"])
p["buckets"] = [dict(b, min_tokens=0, max_tokens=None) for b in p["buckets"] if b["splits"] > 1][:1]'
expect_code "lazy layers" 0 "$bin" apply "$work/lazy.json" -- "$py" "$work/lazy.py"
check "lazy: later calls split" has "$work/err" "dynaflow apply: 4 planned and 8 original calls of 4 modules"
check "lazy: the most frequent reasons" has "$work/err" \
  "dynaflow apply: 1 call ran the original way: LazyStack.layers.0.0: LazyLinear infers its parameters on its first call"
check "lazy: three of them" test "$(grep -c "ran the original way: LazyStack" "$work/err")" -eq 3
check "lazy: the others counted" has "$work/err" \
  "dynaflow apply: 5 more calls ran the original way, for 5 other modules or reasons"

# --- the model's own top module as the unit: torch looked up the forward of
# the call the plan is attached in before the plan was in place, so that call
# runs the original way, and says why; the next is audited, then they split
cat >"$work/top.py" <<'PY'
import torch
from torch import nn

class Top(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

model, x = Top(), torch.randn(4, 8)
for _ in range(3):
    model(x)
PY
edit_plan "$work/plan.json" "$work/top.json" 'units(p, ["Top"])
p["buckets"] = [dict(b, min_tokens=0, max_tokens=None) for b in p["buckets"] if b["splits"] > 1][:1]'
expect_code "top module as the unit" 0 "$bin" apply "$work/top.json" -- "$py" "$work/top.py"
check "top: attached, audited, split" has "$work/err" \
  "dynaflow apply: 1 planned and 2 original calls of 1 modules"
check "top: the attach call said" has "$work/err" \
  "dynaflow apply: 1 call ran the original way: Top: the call the plan was attached in, whose forward torch had looked up before: the model's own top module is a unit"

# --- the plan's model: module fingerprint recorded by the tracer
check "plan has the module fingerprint" grep -qE '"module_fingerprint": "[0-9a-f]{16}"' "$work/plan.json"
edit_plan "$work/plan.json" "$work/other.json" 'p["model"]["module_fingerprint"] = "0" * 16'
expect_code "another model" 0 "$bin" apply "$work/other.json" -- "${decode[@]}"
check "another model: warned" has "$work/err" \
  "warning: the plan was made for another model: module fingerprint 0000000000000000"
check "another model: applied" has "$work/err" "6 planned and 2 original calls"
expect_code "another model --strict" 2 "$bin" apply --strict "$work/other.json" -- "${decode[@]}"
check "another model --strict: refused" has "$work/err" "plan refused: the plan was made for another model"
edit_plan "$work/plan.json" "$work/nofp.json" 'del p["model"]["module_fingerprint"]'
expect_code "no fingerprint --strict" 2 "$bin" apply --strict "$work/nofp.json" -- "${decode[@]}"
check "no fingerprint said" has "$work/err" "the plan records no module fingerprint"
expect_code "no fingerprint" 0 "$bin" apply "$work/nofp.json" -- "${decode[@]}"

# --- CUDA graphs (dynaflow/_graphs.py, on CUDA only): --no-graphs reaches the
# program; what the processes report about graphs is merged and printed.
expect_code "--no-graphs" 0 "$bin" apply --no-graphs "$work/plan.json" -- /usr/bin/env
check "--no-graphs: in the environment" has "$work/out" "DYNAFLOW_APPLY_GRAPHS=0"
expect_code "graphs by default" 0 env -u DYNAFLOW_REPLAY_EXT "$bin" apply "$work/plan.json" \
  -- /usr/bin/env
check "graphs by default: in the environment" has "$work/out" "DYNAFLOW_APPLY_GRAPHS=1"
# The replay module graphs need: found beside the binary, or where the
# environment names it (a name that is no file stays, for apply to say why
# graphs are off).
replay="$(cd "$(dirname "$bin")/../plugin" && pwd)/torch/_dynaflow_replay.so"
if [ -f "$replay" ]; then  # built where the Python headers are
  check "replay module: from the build tree" has "$work/out" "DYNAFLOW_REPLAY_EXT=$replay"
fi
expect_code "replay module named" 0 env DYNAFLOW_REPLAY_EXT="$bin" "$bin" apply "$work/plan.json" \
  -- /usr/bin/env
check "replay module named: passed on" has "$work/out" "DYNAFLOW_REPLAY_EXT=$bin"
expect_code "replay module missing" 0 env DYNAFLOW_REPLAY_EXT="$work/none.so" "$bin" apply \
  "$work/plan.json" -- /usr/bin/env
check "replay module missing: left as named" has "$work/out" "DYNAFLOW_REPLAY_EXT=$work/none.so"
# Two processes' summaries, as _apply.Report.as_json writes them on CUDA.
cat >"$work/graphs_report.py" <<'PY'
import json, os, sys
for pid, (captured, replayed, eager) in enumerate([(2, 10, {"M.layers.0: autograd is recording, "
        "and a replay returns outputs without their backward": 3}), (1, 5, {"M.layers.0: "
        "autograd is recording, and a replay returns outputs without their backward": 1,
        "M.layers.1: its capture failed: RuntimeError: operation not permitted": 2})]):
    json.dump({"ran_model": True, "planned_calls": replayed + 4, "original_calls": 1,
               "units": ["M.layers.0", "M.layers.1"],
               "graphs": {"captured": captured, "replayed": replayed, "eager_calls": eager}},
              open(os.path.join(os.environ["DYNAFLOW_APPLY_REPORT"], f"{pid}.json"), "w"))
PY
expect_code "graphs summary" 0 "$bin" apply "$work/plan.json" -- "$py" "$work/graphs_report.py"
check "graphs summary: replays" has "$work/err" \
  "dynaflow apply: 15 planned calls replayed 3 CUDA graphs (each captured once per unit and shape)"
check "graphs summary: most frequent reason first" grep -qxF \
  "dynaflow apply: 4 planned calls ran eagerly, not as a CUDA graph: M.layers.0: autograd is recording, and a replay returns outputs without their backward" "$work/err"
check "graphs summary: the other reason" has "$work/err" \
  "dynaflow apply: 2 planned calls ran eagerly, not as a CUDA graph: M.layers.1: its capture failed"

# --- a forced split that finds nothing to split is an error, not an empty plan
expect_code "trace one layer" 0 "$bin" trace -o "$work/lin.db" -- "$py" -c \
  "import torch; torch.nn.Linear(4, 4)(torch.randn(2, 4))"
expect_code "nothing to split" 2 "$bin" advise "$work/lin.db" --plan "$work/lin.json" \
  --force-strategy nanobatch_overlap
check "nothing to split said" has "$work/err" "--force-strategy nanobatch_overlap: nothing to split"
check "no plan written" test ! -e "$work/lin.json"

finish
