#!/usr/bin/env bash
# The HTML report in a real browser: headless Chromium loads the page built
# from the bundled example traces, its DOM must hold both step timelines, and
# its screenshot must be a picture, not a blank page, with the timelines'
# compute (green) and memory (blue) bars on it.
# Needs DYNAFLOW_BIN and DYNAFLOW_SOURCE_DIR (ctest sets both). Skips (exit 77,
# which ctest reports as skipped) when chromium is not installed: `apt-get install chromium`.
set -u
. "$(dirname "$0")/lib.sh"
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "html_render_test: SKIPPED: chromium is not installed (Debian package chromium)"
  exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }

"$bin" advise "$src"/examples/traces/llama_tp2_rank0.json.gz "$src"/examples/traces/llama_tp2_rank1.json.gz \
  --format html -o "$work/report.html" || fail "advise --format html"
grep -q 'data-role="measured"' "$work/report.html" || fail "no measured timeline in the HTML"

# Chromium wants a writable home and no session bus; a fresh profile each run.
export HOME="$work" XDG_CONFIG_HOME="$work/.config" XDG_CACHE_HOME="$work/.cache"
flags=(--headless --disable-gpu --no-sandbox --no-first-run --hide-scrollbars
       --user-data-dir="$work/profile" --window-size=1400,1000)

timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$work/report.html" >"$work/dom.html" 2>"$work/dom.err" ||
  fail "chromium --dump-dom: $(tail -n 3 "$work/dom.err")"
for role in measured predicted; do
  grep -q "class=\"timeline\" data-role=\"$role\"" "$work/dom.html" || fail "the loaded page has no $role timeline"
done
grep -q 'dynaflow advise' "$work/dom.html" || fail "the loaded page has no title"

timeout 120 "$browser" "${flags[@]}" --screenshot="$work/report.png" "file://$work/report.html" \
  >"$work/shot.out" 2>&1 || fail "chromium --screenshot: $(tail -n 3 "$work/shot.out")"
[ -s "$work/report.png" ] || fail "no screenshot written"
# The top of the page holds the advice: the step timelines with compute bars
# (#2e7d32) and memory bars (#1565c0) by the hundreds of pixels.
python3 "$src/tests/png_check.py" "$work/report.png" --min-colors 16 \
  --color 2e7d32:500 --color 1565c0:100 || fail "the screenshot does not show the timelines"
echo "html_render_test: ok"
