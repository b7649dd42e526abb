#!/usr/bin/env bash
# dynaflow throughput benchmark on a >= 1 GB Kineto trace.
#
#   bench/advise_bench.sh            # build, generate (or reuse), measure, summarise
#
# What it does, in one run:
#   1. builds the dynaflow CLI in Release into build-bench/ (incremental);
#   2. generates a 2-rank tensor-parallel Llama training trace with
#      scripts/gen_kineto_trace.py, rank 0 alone >= 1 GB of uncompressed JSON, cached in
#      bench/out/ (reused while the generator and its arguments are unchanged);
#   3. measures on the rank-0 .json.gz, alternating, BENCH_REPS times:
#        zcat FILE > /dev/null
#        dynaflow advise FILE --format json > /dev/null
#          (stdout, not "-o /dev/null": the CLI writes -o through a temporary file and
#          renames it over the target, which would replace /dev/null when run as root)
#        dynaflow import FILE -o bench/out/bench.db
#      wall time, peak RSS and CPU time with /usr/bin/time -f "%e %M %U %S", and the
#      CPU that other processes used meanwhile (from /proc/stat; 0 = quiet machine);
#   4. times Holistic Trace Analysis (PyPI HolisticTraceAnalysis, in bench/out/venv)
#      get_temporal_breakdown on the same file; if it fails, runs out of memory or time,
#      it reruns HTA and dynaflow on a ~100 MB trace and says so;
#   5. prints a summary table (also bench/out/results.md and results.json).
#
# Environment knobs:
#   BENCH_OUT=bench/out    work directory (traces, venv, results; git-ignored)
#   BENCH_REPS=3           repetitions of each dynaflow/zcat measurement
#   BENCH_TARGET_MB=2300   uncompressed MB over both ranks (rank 0 gets half)
#   BENCH_SEED=1           generator seed
#   BENCH_HTA=1            0 skips the HTA comparison; "small" runs it on the small trace only
#   BENCH_HTA_TIMEOUT=900  seconds HTA may take on the big file
#   BENCH_HTA_MEM_GB=20    address-space limit (GB) for the HTA process
#   BENCH_HTA_SMALL_MB=200 size (both ranks) of the fallback trace for HTA
#   BENCH_MIN_MB=1000      smallest acceptable rank-0 size (lower it only to test the script)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${BENCH_OUT:-$ROOT/bench/out}"
BUILD="$ROOT/build-bench"
BIN="$BUILD/cli/dynaflow"
GEN="$ROOT/scripts/gen_kineto_trace.py"
REPS="${BENCH_REPS:-3}"
TARGET_MB="${BENCH_TARGET_MB:-2300}"
SEED="${BENCH_SEED:-1}"
HTA="${BENCH_HTA:-1}"
HTA_TIMEOUT="${BENCH_HTA_TIMEOUT:-900}"
HTA_MEM_GB="${BENCH_HTA_MEM_GB:-20}"
HTA_SMALL_MB="${BENCH_HTA_SMALL_MB:-200}"
MIN_MB="${BENCH_MIN_MB:-1000}"
TIME=/usr/bin/time

say() { printf '\n== %s\n' "$*" >&2; }
die() { printf 'advise_bench: error: %s\n' "$*" >&2; exit 1; }

for tool in cmake ninja python3 zcat; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' is required but not on PATH"
done
[[ -x "$TIME" ]] || die "$TIME (GNU time) is required: apt-get install time"
[[ "$REPS" =~ ^[1-9][0-9]*$ ]] || die "BENCH_REPS must be a positive integer"
mkdir -p "$OUT"

# --------------------------------------------------------------------------- 1. build
say "building dynaflow (Release) in $BUILD"
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDYNAFLOW_BUILD_TESTS=OFF >&2 \
    || die "cmake configure failed"
fi
cmake --build "$BUILD" -j"$(nproc)" --target dynaflow >&2 || die "build failed"
[[ -x "$BIN" ]] || die "build produced no $BIN"
SOURCE_REV="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
  SOURCE_REV="$SOURCE_REV+local-changes"
fi
MACHINE="$(nproc) CPUs ($(lscpu | sed -n 's/^Model name: *//p' | head -n1)), $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo) RAM"
say "dynaflow $SOURCE_REV on $MACHINE"

# --------------------------------------------------------------------------- 2. trace
# Generates PREFIX_rank{0,1}.json.gz unless a stamp says the same generator and
# arguments produced them already.
gen_trace() {  # gen_trace PREFIX TARGET_MB
  local prefix="$1" target="$2"
  local args=(--ranks 2 --target-mb "$target" --seed "$SEED" --level 1 -o "$prefix")
  local stamp="$prefix.stamp"
  local want
  want="$(sha256sum "$GEN" | cut -d' ' -f1) ${args[*]}"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -f "${prefix}_rank0.json.gz" \
        && -f "${prefix}_rank0.meta.json" ]]; then
    say "reusing $(basename "$prefix")_rank*.json.gz (same generator and arguments)"
    return 0
  fi
  local need_mb=$(( target / 8 + 1024 ))
  local avail_mb
  avail_mb=$(df -Pm "$OUT" | awk 'NR==2 {print $4}')
  (( avail_mb > need_mb )) || die "only ${avail_mb} MB free under $OUT, need ~${need_mb} MB"
  rm -f "$stamp"
  say "generating a ${target} MB trace: python3 scripts/gen_kineto_trace.py ${args[*]}"
  local t0 t1
  t0=$(date +%s.%N)
  python3 "$GEN" "${args[@]}" >&2 || die "trace generation failed"
  t1=$(date +%s.%N)
  python3 - "$prefix" "$t0" "$t1" <<'EOF' >&2
import json, sys
prefix, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
total = sum(json.load(open(f"{prefix}_rank{r}.meta.json"))["uncompressed_bytes"] for r in (0, 1))
json.dump({"seconds": round(t1 - t0, 2), "uncompressed_bytes": total},
          open(prefix + ".genstats.json", "w"))
print(f"generator: {total/1e6:.0f} MB of JSON in {t1-t0:.1f} s ({total/1e6/(t1-t0):.1f} MB/s, 2 processes)")
EOF
  echo "$want" > "$stamp"
}

BIG="$OUT/llama_tp2_bench"
gen_trace "$BIG" "$TARGET_MB"
FILE="${BIG}_rank0.json.gz"
META="${BIG}_rank0.meta.json"
RAW_BYTES=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["uncompressed_bytes"])' "$META")
(( RAW_BYTES >= MIN_MB * 1000000 )) || die "$FILE has only $RAW_BYTES uncompressed bytes (< ${MIN_MB} MB); raise BENCH_TARGET_MB"

RESULTS="$OUT/results.tsv"   # label rep wall_s maxrss_kb file other_cores cpu_s [hta phases]
: > "$RESULTS"

# Busy CPU seconds of the whole machine so far (all cores), from /proc/stat.
busy_s() {
  awk -v hz="$(getconf CLK_TCK)" '/^cpu / {print ($2+$3+$4+$7+$8+$9)/hz; exit}' /proc/stat
}
# other_cores BUSY0 BUSY1 WALL USER SYS: average number of cores that something other
# than the measured command kept busy while it ran (0 = quiet machine).
other_cores() {
  awk -v b0="$1" -v b1="$2" -v w="$3" -v u="$4" -v s="$5" \
    'BEGIN {o = (b1 - b0 - u - s) / (w > 0 ? w : 1); if (o < 0) o = 0; printf "%.2f", o}'
}

# measure LABEL REP FILE CMD... : one timed run, appended to results.tsv.
measure() {
  local label="$1" rep="$2" file="$3"; shift 3
  local tf="$OUT/.time.$$" b0 b1
  b0=$(busy_s)
  if ! "$TIME" -f "%e %M %U %S" -o "$tf" "$@"; then
    cat "$tf" >&2 || true
    die "'$*' failed"
  fi
  b1=$(busy_s)
  local wall rss usr sys other
  read -r wall rss usr sys < <(tail -n1 "$tf")
  rm -f "$tf"
  other=$(other_cores "$b0" "$b1" "$wall" "$usr" "$sys")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$rep" "$wall" "$rss" "$file" "$other" \
    "$(awk -v u="$usr" -v s="$sys" 'BEGIN{print u+s}')" >> "$RESULTS"
  printf '  %-12s rep %s: %7.2f s  %8.1f MB peak RSS  (cpu %s+%s s; other load %s cores)\n' \
    "$label" "$rep" "$wall" "$(awk -v k="$rss" 'BEGIN{print k/1024}')" "$usr" "$sys" "$other" >&2
}

run_reps() {  # run_reps FILE TAG  (TAG "" for the big file, "_small" for the fallback)
  local file="$1" tag="$2" db="$OUT/bench$2.db"
  cat "$file" > /dev/null  # page cache warm: every tool reads from memory
  for rep in $(seq 1 "$REPS"); do
    measure "zcat$tag" "$rep" "$file" sh -c 'exec zcat "$1" > /dev/null' sh "$file"
    measure "advise$tag" "$rep" "$file" sh -c 'exec "$1" advise "$2" --format json > /dev/null' sh "$BIN" "$file"
    rm -f "$db"
    measure "import$tag" "$rep" "$file" "$BIN" import "$file" -o "$db"
  done
  rm -f "$db"
}

# --------------------------------------------------------------------------- 3. dynaflow
say "measuring $(basename "$FILE") ($((RAW_BYTES / 1000000)) MB uncompressed), $REPS alternating repetitions"
run_reps "$FILE" ""

# --------------------------------------------------------------------------- 4. HTA
HTA_PY="$OUT/venv/bin/python"
hta_setup() {
  # pandas < 3: HTA 0.5.0 assigns int64 row indices into an int16 column
  # (transform_correlation_to_index), which pandas 3 rejects on any trace with more
  # than 32767 events ("Invalid value ... for dtype 'int16'").
  if [[ ! -x "$HTA_PY" ]] || ! "$HTA_PY" -c 'import hta, pandas, sys; sys.exit(int(pandas.__version__.split(".")[0]) >= 3)' 2>/dev/null; then
    say "installing HolisticTraceAnalysis (with pandas<3) into $OUT/venv (pip)"
    [[ -x "$HTA_PY" ]] || python3 -m venv "$OUT/venv" >&2 || die "cannot create $OUT/venv"
    "$OUT/venv/bin/pip" install -q HolisticTraceAnalysis "pandas<3" >&2 \
      || die "pip install HolisticTraceAnalysis failed"
  fi
  HTA_VERSIONS=$("$HTA_PY" -c 'import importlib.metadata as m; print("HolisticTraceAnalysis %s, pandas %s, numpy %s" % tuple(m.version(p) for p in ("HolisticTraceAnalysis", "pandas", "numpy")))')
  say "HTA environment: $HTA_VERSIONS"
}

cat > "$OUT/hta_breakdown.py" <<'EOF'
import resource, sys, time
t0 = time.time()
from hta.trace_analysis import TraceAnalysis
t1 = time.time()
analysis = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.time()
df = analysis.get_temporal_breakdown(visualize=False)
t3 = time.time()
print(df.to_string(), file=sys.stderr)
print("HTA_PHASES import=%.2f parse=%.2f breakdown=%.2f" % (t1 - t0, t2 - t1, t3 - t2))
EOF

# hta_run FILE TAG: one HTA run over a directory holding only FILE; 0 when it worked.
hta_run() {
  local file="$1" tag="$2" dir="$OUT/hta_dir$2" tf="$OUT/.time.hta.$$" log="$OUT/hta$2.log"
  rm -rf "$dir"; mkdir -p "$dir"
  ln -s "$file" "$dir/$(basename "$file")"
  local rc=0 b0 b1
  b0=$(busy_s)
  ( ulimit -v $((HTA_MEM_GB * 1024 * 1024))
    exec "$TIME" -f "%e %M %U %S" -o "$tf" timeout "$HTA_TIMEOUT" "$HTA_PY" "$OUT/hta_breakdown.py" "$dir"
  ) > "$log" 2>&1 || rc=$?
  b1=$(busy_s)
  rm -rf "$dir"
  if (( rc != 0 )); then
    printf '  HTA failed on %s (exit %d%s); last lines of %s:\n' "$(basename "$file")" "$rc" \
      "$( ((rc == 124)) && echo ", timed out after ${HTA_TIMEOUT} s")" "$log" >&2
    tail -n 5 "$log" >&2 || true
    rm -f "$tf"
    return 1
  fi
  local wall rss usr sys other
  read -r wall rss usr sys < <(tail -n1 "$tf")
  rm -f "$tf"
  other=$(other_cores "$b0" "$b1" "$wall" "$usr" "$sys")
  local phases
  phases=$(grep -o 'HTA_PHASES.*' "$log" | head -n1 || true)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "hta$tag" 1 "$wall" "$rss" "$file" "$other" \
    "$(awk -v u="$usr" -v s="$sys" 'BEGIN{print u+s}')" "$phases" >> "$RESULTS"
  printf '  %-12s rep 1: %7.2f s  %8.1f MB peak RSS  (cpu %s+%s s; other load %s cores; %s)\n' "hta$tag" \
    "$wall" "$(awk -v k="$rss" 'BEGIN{print k/1024}')" "$usr" "$sys" "$other" "$phases" >&2
}

HTA_NOTE=""
HTA_VERSIONS=""
if [[ "$HTA" == "1" || "$HTA" == "small" ]]; then
  hta_setup
  big_ok=0
  if [[ "$HTA" == "small" ]]; then
    HTA_NOTE="BENCH_HTA=small: HTA compared on a ${HTA_SMALL_MB} MB-total trace only, not on the big file"
  else
    say "Holistic Trace Analysis temporal breakdown on $(basename "$FILE") (timeout ${HTA_TIMEOUT} s, ${HTA_MEM_GB} GB address space)"
    if hta_run "$FILE" ""; then
      big_ok=1
    else
      HTA_NOTE="HTA could not process the $((RAW_BYTES / 1000000)) MB file within ${HTA_MEM_GB} GB / ${HTA_TIMEOUT} s; compared on a ${HTA_SMALL_MB} MB-total trace instead"
    fi
  fi
  if (( ! big_ok )); then
    SMALL="$OUT/llama_tp2_small"
    gen_trace "$SMALL" "$HTA_SMALL_MB"
    SFILE="${SMALL}_rank0.json.gz"
    say "fallback: HTA and dynaflow on $(basename "$SFILE")"
    hta_run "$SFILE" "_small" || die "HTA failed on the small trace too; see $OUT/hta_small.log"
    run_reps "$SFILE" "_small"
  fi
fi

# --------------------------------------------------------------------------- 5. summary
say "summary"
python3 - "$RESULTS" "$OUT" "$HTA_NOTE" "$HTA_VERSIONS" "$SOURCE_REV" "$MACHINE" <<'EOF'
import datetime, json, os, statistics, sys
results, out, hta_note, hta_versions, rev, machine = sys.argv[1:7]
rows = {}
files = {}
phases = {}
other = {}
for line in open(results):
    f = line.rstrip("\n").split("\t")
    label, wall, rss, path = f[0], float(f[2]), int(f[3]), f[4]
    rows.setdefault(label, []).append((wall, rss, float(f[6])))
    other.setdefault(label, []).append(float(f[5]))
    files[label] = path
    if len(f) > 7:
        phases[label] = f[7]

def meta_for(path):
    return json.load(open(path[: -len(".json.gz")] + ".meta.json"))

def med(label, i):
    return statistics.median(r[i] for r in rows[label])

summary = {"runs": {k: [{"wall_s": w, "maxrss_kb": m, "cpu_s": c, "other_load_cores": o}
                        for (w, m, c), o in zip(v, other[k])] for k, v in rows.items()},
           "files": {}, "hta_note": hta_note, "hta_phases": phases}
lines = []
def emit(s=""):
    lines.append(s)

now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
emit(f"dynaflow {rev}; {machine}; {now}")
summary.update({"source_rev": rev, "machine": machine, "date": now})

for tag in ("", "_small"):
    if "advise" + tag not in rows:
        continue
    path = files["advise" + tag]
    m = meta_for(path)
    raw, events = m["uncompressed_bytes"], m["events"]
    summary["files"][tag or "big"] = {"path": os.path.relpath(path), "uncompressed_bytes": raw,
                                      "compressed_bytes": m["compressed_bytes"], "events": events}
    z, a, i = med("zcat" + tag, 0), med("advise" + tag, 0), med("import" + tag, 0)
    a_rss = med("advise" + tag, 1) * 1024
    i_rss = med("import" + tag, 1) * 1024
    emit(f"file: {os.path.relpath(path)}: {raw/1e6:.1f} MB JSON, {m['compressed_bytes']/1e6:.1f} MB gzip, {events} events")
    emit(f"{'measure':38} {'median':>10} {'runs':>28} {'target':>10} {'met':>4}")
    def runs(label, i=0, scale=1.0, fmt="{:.2f}"):
        return " ".join(fmt.format(r[i] * scale) for r in rows[label])
    emit(f"{'zcat wall (s)':38} {z:10.2f} {runs('zcat' + tag):>28}")
    emit(f"{'advise wall (s)':38} {a:10.2f} {runs('advise' + tag):>28}")
    emit(f"{'zcat CPU user+sys (s)':38} {med('zcat' + tag, 2):10.2f} {runs('zcat' + tag, 2):>28}")
    emit(f"{'advise CPU user+sys (s, 2 threads)':38} {med('advise' + tag, 2):10.2f} {runs('advise' + tag, 2):>28}")
    ratio = a / z
    emit(f"{'advise / zcat':38} {ratio:10.2f} {'':>28} {'<= 2.0':>10} {'yes' if ratio <= 2.0 else 'NO':>4}")
    emit(f"{'advise throughput (MB/s of JSON)':38} {raw/1e6/a:10.1f}")
    emit(f"{'zcat throughput (MB/s of JSON)':38} {raw/1e6/z:10.1f}")
    emit(f"{'advise peak RSS (MB)':38} {a_rss/1e6:10.1f} {runs('advise' + tag, 1, 1024/1e6, '{:.0f}'):>28}")
    rr = a_rss / raw
    emit(f"{'advise peak RSS / uncompressed size':38} {rr:10.3f} {'':>28} {'<= 0.5':>10} {'yes' if rr <= 0.5 else 'NO':>4}")
    emit(f"{'import wall (s)':38} {i:10.2f} {runs('import' + tag):>28}")
    emit(f"{'import CPU user+sys (s)':38} {med('import' + tag, 2):10.2f} {runs('import' + tag, 2):>28}")
    eps = events / i
    emit(f"{'import events/s (all traceEvents)':38} {eps:10.3g} {'':>28} {'>= 1e6':>10} {'yes' if eps >= 1e6 else 'NO':>4}")
    emit(f"{'import peak RSS (MB)':38} {i_rss/1e6:10.1f} {runs('import' + tag, 1, 1024/1e6, '{:.0f}'):>28}")
    if "hta" + tag in rows:
        h, h_rss = med("hta" + tag, 0), med("hta" + tag, 1) * 1024
        emit(f"{'HTA temporal breakdown wall (s)':38} {h:10.2f} {'(1 run) ' + phases.get('hta' + tag, ''):>28}")
        emit(f"{'HTA peak RSS (MB)':38} {h_rss/1e6:10.1f}")
        emit(f"{'HTA wall / dynaflow advise wall':38} {h/a:10.1f}")
        summary["files"][tag or "big"]["hta_over_advise"] = h / a
    summary["files"][tag or "big"].update({"zcat_s": z, "advise_s": a, "import_s": i,
        "advise_over_zcat": ratio, "advise_rss_over_size": rr, "import_events_per_s": eps,
        "advise_mb_per_s": raw / 1e6 / a})
    emit()
busiest = max(max(v) for v in other.values())
emit(f"other CPU load during the measurements: max {busiest:.2f} cores "
     f"({'quiet machine' if busiest < 0.25 else 'NOT quiet: figures are perturbed'})")
summary["max_other_load_cores"] = busiest
if hta_versions:
    emit("HTA: " + hta_versions)
    summary["hta_versions"] = hta_versions
if hta_note:
    emit("NOTE: " + hta_note)
text = "\n".join(lines)
print(text)
open(os.path.join(out, "results.md"), "w").write("```\n" + text + "\n```\n")
json.dump(summary, open(os.path.join(out, "results.json"), "w"), indent=2)
EOF
printf '\n(results in %s/results.{tsv,md,json})\n' "$OUT" >&2
