#!/usr/bin/env bash
# Capture the two-GPU DDP samples (run from the project root on a machine with 2 GPUs and nsys >= 2023):
#   NSYS=/path/to/nsys scripts/capture_ddp_samples.sh OUTDIR
# programs/ddp_train.py (NCCL, one GPU per rank, nvtx_autotrace `step N` ranges), three ways:
#   OUTDIR/balanced/        both ranks load data equally fast; one report for the node (`nvtx-trace run`)
#   OUTDIR/straggler/       rank 1's samples cost 6x the CPU time; one report for the node
#   OUTDIR/rank0.sqlite, OUTDIR/rank1.sqlite   the same straggler run, one report per rank
#                           (torchrun --no-python nsys profile -o rank%q{RANK} ...)
# Then redact each before committing: nvtx-trace redact OUTDIR/straggler/report.sqlite -o sample_reports/...
set -euo pipefail
out=${1:?usage: capture_ddp_samples.sh OUTDIR}
nsys=${NSYS:-nsys}
steps=${STEPS:-50}
mkdir -p "$out"
program=programs/ddp_train.py
python3 -m nvtx_trace.cli run --nsys "$nsys" --out "$out/balanced" --force ${RUN_ARGS:-} \
    -- torchrun --nproc_per_node=2 "$program" --steps "$steps"
python3 -m nvtx_trace.cli run --nsys "$nsys" --out "$out/straggler" --force ${RUN_ARGS:-} \
    -- torchrun --nproc_per_node=2 "$program" --steps "$steps" --slow-rank 1
torchrun --nproc_per_node=2 --no-python "$nsys" profile -t cuda,nvtx -s none --cpuctxsw none \
    --trace-fork-before-exec=true -f true -o "$out/rank%q{RANK}" \
    python3 -m nvtx_autotrace "$program" --steps "$steps" --slow-rank 1
for r in 0 1; do
  "$nsys" export --type sqlite -f true -o "$out/rank$r.sqlite" "$out/rank$r.nsys-rep"
done
ls -la "$out"
