#!/usr/bin/env bash
# Issue 53 on the GPU machine: the memory record's cost, a planted leak, an out-of-memory step, and the batch that
# fits, from the repo root:
#   source .device-carry/env.sh; bash programs/memory/device_run.sh LABEL...
# Labels: bench (benchmarks/bench_memory.py), leak (run with nsys's CUDA memory trace), oom (a step that runs out,
# stacks in warm-up), oom_all (the same, stacks every step), accum (micro-batch x accumulation by hand, plain),
# tune (nvtx-trace tune of the micro-batch 8 x 8 accumulation program, budget $BUDGET or 540 s).
# Writes $OUT/<LABEL>.txt, and each run's summary.json and report.sqlite as $OUT/<LABEL>.json / .sqlite.
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
P=programs/memory/memory_train.py
keep() {  # LABEL: the run's summary and export beside the log
  cp "/tmp/mem_$1/summary.json" "$O/$1.json" 2>/dev/null
  cp "/tmp/mem_$1/report.sqlite" "$O/$1.sqlite" 2>/dev/null
}
for LABEL in "$@"; do
  LOG=$O/$LABEL.txt
  echo "== $LABEL start ${SECONDS}s" >"$LOG"
  case $LABEL in
    bench) timeout 400 python3 benchmarks/bench_memory.py --repeats "${REPEATS:-3}" --steps 120 --skip 30 >>"$LOG" 2>&1 ;;
    leak) timeout 300 python3 -m nvtx_trace.cli run --no-history --out /tmp/mem_leak --force \
            --nsys-args "--cuda-memory-usage=true" $P --leak --micro-batch 4 --accum 2 --steps 60 >>"$LOG" 2>&1
          keep leak ;;
    oom) timeout 300 python3 -m nvtx_trace.cli run --no-history --out /tmp/mem_oom --force \
           $P --oom-at 8 --memory-fraction 0.12 --steps 30 >>"$LOG" 2>&1; keep oom ;;
    oom_all) NVTX_AUTOTRACE_MEMORY_HISTORY=all timeout 300 python3 -m nvtx_trace.cli run --no-history \
               --out /tmp/mem_oom_all --force $P --oom-at 8 --memory-fraction 0.12 --steps 30 >>"$LOG" 2>&1
             keep oom_all ;;
    accum) for CFG in "--micro-batch 8 --accum 8" "--micro-batch 16 --accum 4" "--micro-batch 32 --accum 2" \
                      "--micro-batch 64 --accum 1"; do
             echo "-- $CFG" >>"$LOG"
             # shellcheck disable=SC2086
             timeout 120 python3 $P $CFG --steps 25 >>"$LOG" 2>&1
           done ;;
    tune) timeout 580 python3 -m nvtx_trace.cli tune --budget "${BUDGET:-540}" --no-history --out /tmp/mem_tune --force \
            --json "$O/tune.json" $P --micro-batch 8 --accum 8 --steps 100000 >>"$LOG" 2>&1 ;;
    *) echo "unknown label $LABEL" >>"$LOG" ;;
  esac
  echo "== exit $? at ${SECONDS}s" >>"$LOG"
done
