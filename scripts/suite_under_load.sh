#!/usr/bin/env bash
# Issue 42's target: the whole suite, as .ci/run runs it, passes N times in a row on a clean clone while a CPU
# burner runs beside it (one busy process per two cores: this 2-core VM at half its CPU for the tests), and with
# --nsys, issue 52's target: another user's nsys capturing a program over and over beside it too (its injection
# configs and scratch files come and go in /tmp, its processes in /proc: none of them the suite's to judge).
#   bash scripts/suite_under_load.sh [--nsys] [N] [COMMIT]   (default 3, HEAD); prints each pass's result and time.
set -u
BESIDE_NSYS=0
[ "${1:-}" = --nsys ] && { BESIDE_NSYS=1; shift; }
N=${1:-3}
COMMIT=${2:-HEAD}
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/nvtx-trace-load-XXXXXX")
git clone -q "$HERE" "$WORK/clone" && git -C "$WORK/clone" checkout -q "$COMMIT" || exit 2
BURNERS=$(( ($(nproc) + 1) / 2 ))
PIDS=()
for _ in $(seq "$BURNERS"); do python3 -c "while True: pass" & PIDS+=($!); done
BESIDE=""
if [ "$BESIDE_NSYS" = 1 ]; then
  NSYS=${NSYS:-$(command -v nsys)} || { echo "--nsys: no nsys on PATH (or \$NSYS)" >&2; exit 2; }
  mkdir -p "$WORK/beside"
  # asked to stop (a file), it ends after its capture in flight, so that nsys cleans up after itself. NVTX only:
  # Debian's nsys 2022.4 tracing osrt beside a busy core hangs as it generates its report (its agent spun a core
  # for 66 minutes, a second burner; measured: -t osrt,nvtx beside one burner never ends, -t nvtx ends in 5 s).
  # A capture that hangs anyway is killed after 120 s, with the agent of its session (a session of its own).
  bash -c 'while [ ! -e "$1/stop" ]; do "$0" profile --trace=nvtx --sample=none --force-overwrite=true \
    -o "$1/capture" python3 -c "import time; [time.sleep(0.005) for _ in range(400)]" >/dev/null 2>&1 & p=$!
    ( sleep 120; kill -9 "$p" ) 2>/dev/null & w=$!
    wait "$p"; pkill -P "$w" sleep; kill "$w" 2>/dev/null; pkill -9 -f "session-name[= ]profile-[^ ]*-$p( |$)"
    rm -f "$1"/capture.*; done' "$NSYS" "$WORK/beside" &
  BESIDE=$!
fi
stop() {
  kill "${PIDS[@]}" 2>/dev/null
  if [ -n "$BESIDE" ]; then  # asked first; a capture hung past a minute: the loop, its nsys and agent are killed
    touch "$WORK/beside/stop"
    timeout 60 tail --pid="$BESIDE" -f /dev/null || {
      pkill -f -- "$WORK/beside( |$)"  # the loop and its per-capture watchers (their sleep ends itself)
      for p in $(pgrep -f -- "-o $WORK/beside/capture"); do
        kill -9 "$p"; pkill -9 -f "session-name[= ]profile-[^ ]*-$p( |$)"
      done
    }
  fi
  rm -rf "$WORK"
}
trap stop EXIT
echo "suite under load: $N pass(es) of $(git -C "$WORK/clone" rev-parse --short HEAD), $BURNERS burner(s) on $(nproc) CPUs$(
  [ "$BESIDE_NSYS" = 1 ] && echo ", another nsys capturing beside it")"
cd "$WORK/clone" || exit 2
python3 -m pip install -q -e . --no-deps >/dev/null 2>&1
FAILED=0
for i in $(seq "$N"); do
  began=$SECONDS
  CI=true python3 -m pytest -q -p no:cacheprovider >"$WORK/pass$i.log" 2>&1
  rc=$?
  echo "pass $i: exit $rc in $((SECONDS - began)) s: $(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$WORK/pass$i.log" | tail -1)"
  if [ $rc -ne 0 ]; then
    FAILED=1
    # the work folder goes at exit: a failed pass's whole log is kept beside it, and a hang (the suite's guard dumps
    # every thread's stack and ends the run, with no summary line) is named by the test frames of its dump
    kept="${TMPDIR:-/tmp}/nvtx-trace-load-$(git -C "$WORK/clone" rev-parse --short HEAD)-pass$i.log"
    cp "$WORK/pass$i.log" "$kept" && echo "  the pass's log: $kept"
    sed -n '/^Timeout (/,$p' "$WORK/pass$i.log" | grep -E '/tests/[^/]+\.py", line' | sed 's/^/  hung in: /' | head -8
    grep -E "^(FAILED|ERROR)|left behind|  left in|still running" "$WORK/pass$i.log" | head -30
    sed -n '/^=* \(FAILURES\|ERRORS\) =*$/,/^=* warnings summary/p' "$WORK/pass$i.log" | head -200
  fi
done
python3 -m pip install -q -e "$HERE" --no-deps >/dev/null 2>&1  # the editable install back where it was
exit $FAILED
