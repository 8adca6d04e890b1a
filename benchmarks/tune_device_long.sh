#!/usr/bin/env bash
# Longer device work in the background (the device tool's calls end at 10 minutes; a process in its own session
# runs on while the machine is held): start with `setsid bash benchmarks/tune_device_long.sh >/dev/null 2>&1 &`,
# then collect /tmp/long/ in a later call once /tmp/long/ALL_DONE exists.
# 1. the Lightning program with the Trainer's defaults: nvtx-trace run (is its first change TF32, not the
#    optimizer that holds the whole step?); 2. the HF-style GPT-2 fp32 program tuned with a budget that lets it
#    reach bf16 (the 400-s run stopped after tf32 and compile).
set -u
R=/tmp/long
mkdir -p $R
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
( cd /tmp && python3 -m nvtx_trace.cli run --no-history --out $R/lightning_run --force \
    "$OLDPWD/programs/heldout/lightning_train.py" --steps 3000 ) >$R/log_lightning.txt 2>&1
cp $R/lightning_run/summary.json $R/lightning_summary.json 2>/dev/null
/usr/bin/time -f "tune wall %e s" python3 -m nvtx_trace.cli tune --no-history --budget "${1:-800}" --out /tmp/tune_hf \
  --force --json $R/tune_hf_fp32_long.json programs/busy/hf_style_train.py --dtype fp32 --steps 800 --warmup 5 \
  >$R/log_hf_long.txt 2>&1
touch $R/ALL_DONE
