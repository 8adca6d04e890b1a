#!/usr/bin/env bash
# Issue 43 on the GPU machine: planted syncs and copies named by line, Lightning's logging syncs, nsys's Python
# backtraces of CUDA calls (can this nsys, what it costs), the cost of naming lines (A/B under nsys), and the
# ImageNet-style host-bound loop (by hand and under `try --advice`), and the line of each transposing module:
#   source .device-carry/env.sh; bash programs/syncs/device_run.sh STAGE...   (stages: help syncs lightning pybt ab hostbound layout)
# Writes $OUT/<stage>/... and $OUT/<stage>.log.
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
S=programs/syncs
HB=programs/hostbound/imagenet_style.py
med() { grep -h "median step" "$@" | tail -1; }
NSYS_BIN=$(python3 -c 'from nvtx_trace.capture.locate import find_nsys; print(find_nsys().path)')  # as the tool finds it
for STAGE in "$@"; do
  mkdir -p "$O/$STAGE"
  L=$O/$STAGE.log
  echo "== $STAGE at ${SECONDS}s on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(nproc) CPUs" >"$L"
  case $STAGE in
    help)
      "$NSYS_BIN" --version >>"$L" 2>&1
      "$NSYS_BIN" profile --help >"$O/$STAGE/profile_help.txt" 2>&1
      grep -n -i -A4 "python\|backtrace" "$O/$STAGE/profile_help.txt" >>"$L" ;;
    syncs)
      for P in planted_syncs planted_copies; do
        timeout 280 python3 -m nvtx_trace.cli run --no-history --out "/tmp/$P" --force $S/$P.py >>"$L" 2>&1
        echo "== $P exit $? at ${SECONDS}s" >>"$L"
        cp /tmp/$P/summary.json "$O/$STAGE/$P.json"; xz -T0 -c /tmp/$P/report.sqlite >"$O/$STAGE/$P.sqlite.xz"
      done ;;
    lightning)
      timeout 280 python3 -m nvtx_trace.cli run --no-history --out /tmp/lit --force $S/lightning_logging.py >>"$L" 2>&1
      echo "== exit $? at ${SECONDS}s" >>"$L"
      cp /tmp/lit/summary.json "$O/$STAGE/summary.json"; xz -T0 -c /tmp/lit/report.sqlite >"$O/$STAGE/report.sqlite.xz" ;;
    pybt)
      for V in "none|" "bt|--python-backtrace=cuda" "bt_sampling|--python-backtrace=cuda --python-sampling=true" \
               "bt_cudabt|--python-backtrace=cuda --python-sampling=true --cudabacktrace=sync:0"; do
        N=${V%%|*}; ARGS=${V#*|}
        # shellcheck disable=SC2086
        timeout 200 "$NSYS_BIN" profile -t cuda,nvtx $ARGS --force-overwrite true -o /tmp/pybt_$N \
          python3 -m nvtx_autotrace $S/planted_syncs.py --steps 300 >"$O/$STAGE/$N.txt" 2>&1
        echo "== $N ($ARGS) exit $? at ${SECONDS}s: $(med "$O/$STAGE/$N.txt")" >>"$L"
        "$NSYS_BIN" export --type sqlite --force-overwrite true -o /tmp/pybt_$N.sqlite /tmp/pybt_$N.nsys-rep >/dev/null 2>&1 &&
          python3 - "/tmp/pybt_$N.sqlite" >>"$L" 2>&1 <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
tabs = [r[0] for r in c.execute("select name from sqlite_master where type='table'")]
print("  tables:", " ".join(t for t in tabs if any(k in t.upper() for k in ("CALLCHAIN", "PYTHON", "BACKTRACE", "SAMPL"))))
for t in tabs:
    if any(k in t.upper() for k in ("CALLCHAIN", "PYTHON", "BACKTRACE")):
        cols = [r[1] for r in c.execute(f"pragma table_info({t})")]
        n = c.execute(f"select count(*) from {t}").fetchone()[0]
        print(f"  {t}({', '.join(cols)}): {n} rows")
        for r in c.execute(f"select * from {t} limit 3"):
            print("    ", r)
cols = [r[1] for r in c.execute("pragma table_info(CUPTI_ACTIVITY_KIND_RUNTIME)")]
print("  runtime columns:", cols)
if "callchainId" in cols:
    print("  runtime rows with a callchain:", c.execute("select count(*) from CUPTI_ACTIVITY_KIND_RUNTIME where callchainId is not null").fetchone())
PY
        [ "$N" = bt_sampling ] && xz -T0 -c /tmp/pybt_$N.sqlite >"$O/$STAGE/$N.sqlite.xz"
      done ;;
    ab)
      for R in 1 2 3; do
        for F in 1 0; do
          NVTX_AUTOTRACE_SITES=$F timeout 200 "$NSYS_BIN" profile -t cuda,nvtx --force-overwrite true -o /tmp/ab \
            python3 -m nvtx_autotrace $S/planted_syncs.py --steps 600 >"$O/$STAGE/r${R}_sites$F.txt" 2>&1
          echo "round $R sites=$F: $(med "$O/$STAGE/r${R}_sites$F.txt")" >>"$L"
        done
        timeout 200 python3 $S/planted_syncs.py --steps 600 >"$O/$STAGE/r${R}_plain.txt" 2>&1
        echo "round $R plain: $(med "$O/$STAGE/r${R}_plain.txt")" >>"$L"
      done ;;
    layout)
      # NCHW + fp16 autocast: cuDNN's transposes, each module's calling line from the settings record
      R=programs/resnet_train.py
      timeout 280 python3 -m nvtx_trace.cli run --no-history --out /tmp/layout --force $R --variant flawed --steps 60 \
        --workers 8 --sample-ms 0.2 >>"$L" 2>&1
      echo "== exit $? at ${SECONDS}s" >>"$L"
      cp /tmp/layout/summary.json "$O/$STAGE/summary.json"; xz -T0 -c /tmp/layout/report.sqlite >"$O/$STAGE/report.sqlite.xz"
      for Q in 1 2; do
        for F in 1 0; do
          NVTX_AUTOTRACE_SITES=$F NVTX_AUTOTRACE_MODULE_DEPTH=-1 timeout 200 "$NSYS_BIN" profile -t cuda,nvtx \
            --force-overwrite true -o /tmp/lab python3 -m nvtx_autotrace $R --variant flawed --steps 80 --workers 8 \
            --sample-ms 0.2 >"$O/$STAGE/r${Q}_sites$F.txt" 2>&1
          echo "round $Q sites=$F: $(grep -h "median" "$O/$STAGE/r${Q}_sites$F.txt" | tail -1)" >>"$L"
        done
      done ;;
    hostbound)
      for R in 1 2; do
        for V in "dp|" "nodp|--no-dp" "read20|--read-every 20" "nodp_read20|--no-dp --read-every 20"; do
          N=${V%%|*}; ARGS=${V#*|}
          # shellcheck disable=SC2086
          timeout 200 python3 $HB $ARGS >"$O/$STAGE/r${R}_$N.txt" 2>&1
          echo "round $R $N: $(med "$O/$STAGE/r${R}_$N.txt")" >>"$L"
        done
      done
      timeout 500 python3 -m nvtx_trace.cli try --advice --rounds 1 --no-history --out /tmp/hb_try --force \
        --json "$O/$STAGE/try.json" $HB >>"$L" 2>&1
      echo "== try --advice exit $? at ${SECONDS}s" >>"$L"
      cp /tmp/hb_try/profile/summary.json "$O/$STAGE/profile.json" 2>/dev/null ;;
    *) echo "unknown stage $STAGE" >>"$L" ;;
  esac
  echo "== $STAGE done at ${SECONDS}s" >>"$L"
done
