#!/usr/bin/env bash
# Issue 52 on the GPU machine: a new user's first steps with an unmodified Lightning program (doctor, run,
# try --advice), then `run` killed (SIGKILL to the tool alone) and interrupted (SIGINT to its process group, as a
# terminal's Ctrl-C) while its program is capturing; after each, what is new in the temp folder and /dev/shm and
# which nsys or program processes still run. From the repo root:
#   source .device-carry/env.sh; bash scripts/first_hour_device.sh [STEP...]   (steps: doctor kill int run try)
# Writes $OUT/first_hour.txt (the log), $OUT/first_hour_*.json (run's and try's JSON), the interrupted run's logs
# (INT_AFTER: seconds from the program's start under nsys to the Ctrl-C, default 25).
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
LOG=$O/first_hour.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
T=${TMPDIR:-/tmp}
P=programs/heldout2/lightning_cnn.py
NT=(python3 -m nvtx_trace.cli)
BEFORE=$HOME/.first_hour_before
snap() { { ls -A "$T"; ls -A /dev/shm | sed 's|^|/dev/shm/|'; } 2>/dev/null | sort; }
say() { echo "== $* (at ${SECONDS} s)" >>"$LOG"; }
left() {  # what is new since the snapshot, and which nsys or program processes still run
  local new running
  new=$(comm -13 "$BEFORE" <(snap))
  running=$(pgrep -af "nsys|lightning_cnn" | grep -v -e pgrep -e first_hour -e "bash -c")  # not the shells running us
  [ -n "$new" ] && sed 's/^/  new in the temp folders: /' <<<"$new" >>"$LOG"
  [ -n "$running" ] && sed 's/^/  still running: /' <<<"$running" >>"$LOG"
  say "left after $1: $(grep -c . <<<"$new") new file(s), $(grep -c . <<<"$running") process(es)"
}
capturing() {  # waits until the program runs under nsys and its capture window has been open a few seconds
  for _ in $(seq 120); do pgrep -f "nsys profile" >/dev/null && pgrep -f lightning_cnn >/dev/null && break; sleep 1; done
  sleep "${1:-30}"
}
[ $# -eq 0 ] && set -- doctor kill int run try
echo "first hour on $(nvidia-smi -L | head -1), $(nproc) CPUs, nsys $("${NSYS:-nsys}" --version 2>&1 | tail -1)" >"$LOG"
for s in "$@"; do
  snap >"$BEFORE"
  case $s in
    doctor) say "doctor"; "${NT[@]}" doctor >>"$LOG" 2>&1; say "doctor exit $?" ;;
    kill) say "run, the tool SIGKILLed mid-capture"
          setsid "${NT[@]}" run --no-history --out "$HOME/fh_kill" --force "$P" >"$HOME/fh_kill.log" 2>&1 &
          pid=$!; capturing 25; kill -9 "$pid"; wait "$pid"; say "the tool's exit $?"; sleep 20; left "SIGKILL" ;;
    int) say "run, Ctrl-C (SIGINT to the process group) mid-capture"
         setsid "${NT[@]}" run --no-history --out "$HOME/fh_int" --force "$P" >"$HOME/fh_int.log" 2>&1 &
         pid=$!; capturing "${INT_AFTER:-25}"; kill -INT -- "-$pid"; wait "$pid"; say "exit $? (want 130)"
         tail -5 "$HOME/fh_int.log" >>"$LOG"; sleep 5; left "SIGINT"
         cp "$HOME/fh_int.log" "$O/first_hour_int_${INT_AFTER:-25}.log"; cp "$HOME/fh_int/nsys.log" "$O/first_hour_int_nsys_${INT_AFTER:-25}.log" ;;
    run) say "run"; /usr/bin/time -f "run wall %e s" timeout 300 "${NT[@]}" run --no-history --out "$HOME/fh_run" \
           --force "$P" >"$HOME/fh_run.log" 2>&1; say "run exit $?"
         grep -v "^Epoch\|it/s\]" "$HOME/fh_run.log" | tail -40 >>"$LOG"
         cp "$HOME/fh_run/summary.json" "$O/first_hour_run.json" 2>/dev/null; left "run" ;;
    try) say "try --advice --rounds 1"
         timeout 330 "${NT[@]}" try --advice --rounds 1 --no-history --out "$HOME/fh_try" --force \
           --json "$O/first_hour_try.json" "$P" >"$HOME/fh_try.log" 2>&1; say "try exit $?"
         grep -v "^Epoch\|it/s\]" "$HOME/fh_try.log" | tail -40 >>"$LOG"; left "try" ;;
    *) say "unknown step $s" ;;
  esac
done
