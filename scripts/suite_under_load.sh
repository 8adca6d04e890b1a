#!/usr/bin/env bash
# Issue 42's target: the whole suite, as .ci/run runs it, passes N times in a row on a clean clone while a CPU
# burner runs beside it (one busy process per two cores: this 2-core VM at half its CPU for the tests).
#   bash scripts/suite_under_load.sh [N] [COMMIT]   (default 3, HEAD); prints each pass's result and time.
set -u
N=${1:-3}
COMMIT=${2:-HEAD}
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/nvtx-trace-load-XXXXXX")
git clone -q "$HERE" "$WORK/clone" && git -C "$WORK/clone" checkout -q "$COMMIT" || exit 2
BURNERS=$(( ($(nproc) + 1) / 2 ))
PIDS=()
for _ in $(seq "$BURNERS"); do python3 -c "while True: pass" & PIDS+=($!); done
trap 'kill "${PIDS[@]}" 2>/dev/null; rm -rf "$WORK"' EXIT
echo "suite under load: $N pass(es) of $(git -C "$WORK/clone" rev-parse --short HEAD), $BURNERS burner(s) on $(nproc) CPUs"
cd "$WORK/clone" || exit 2
python3 -m pip install -q -e . --no-deps >/dev/null 2>&1
FAILED=0
for i in $(seq "$N"); do
  began=$SECONDS
  CI=true python3 -m pytest -q -p no:cacheprovider >"$WORK/pass$i.log" 2>&1
  rc=$?
  echo "pass $i: exit $rc in $((SECONDS - began)) s: $(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$WORK/pass$i.log" | tail -1)"
  [ $rc -ne 0 ] && { FAILED=1; grep -E "^(FAILED|ERROR)|left behind|  left in|still running" "$WORK/pass$i.log" | head -30
                      sed -n '/^=* \(FAILURES\|ERRORS\) =*$/,/^=* warnings summary/p' "$WORK/pass$i.log" | head -200; }
done
python3 -m pip install -q -e "$HERE" --no-deps >/dev/null 2>&1  # the editable install back where it was
exit $FAILED
