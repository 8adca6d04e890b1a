#!/usr/bin/env bash
# Re-capture the GPU sample reports (run from the project root on a CUDA machine with nsys >= 2023):
#   NSYS=/path/to/nsys scripts/capture_gpu_samples.sh OUTDIR
# Writes into OUTDIR, for the flawed and the fixed variant of programs/resnet_train.py:
#   run_<variant>/      `nvtx-trace run` (nvtx_autotrace ranges): report.nsys-rep, report.sqlite, summary.*
#   resnet_<variant>_user.{nsys-rep,sqlite}   plain nsys with the script's own hand-written ranges
#   run_ddp_flawed/     the flawed variant as a 2-rank DistributedDataParallel job (needs 2 GPUs; skipped with 1)
# Traced for CUDA, cuDNN, cuBLAS and NVTX only (no OS runtime, no CPU sampling) to keep files small.
# Then, on any machine, redact before committing:
#   nvtx-trace redact OUTDIR/run_flawed/report.sqlite -o sample_reports/resnet_flawed.sqlite
#   nvtx-trace redact OUTDIR/resnet_flawed_user.sqlite -o sample_reports/resnet_flawed_user.sqlite   (same for fixed)
#   nvtx-trace redact OUTDIR/run_ddp_flawed/report.sqlite -o sample_reports/resnet_ddp_flawed.sqlite
set -euo pipefail
out=${1:?usage: capture_gpu_samples.sh OUTDIR}
nsys=${NSYS:-nsys}
mkdir -p "$out"
for variant in flawed fixed; do
  python3 -m nvtx_trace.cli run --full --nsys "$nsys" -t cuda,nvtx,cudnn,cublas --out "$out/run_$variant" --force \
      programs/resnet_train.py --variant "$variant" --steps 30
  name="$out/resnet_${variant}_user"
  "$nsys" profile -f true -o "$name" -t cuda,nvtx,cudnn,cublas -s none --cpuctxsw none \
      --trace-fork-before-exec=true \
      python3 programs/resnet_train.py --variant "$variant" --steps 30 --user-ranges
  "$nsys" export --type sqlite -f true -o "$name.sqlite" "$name.nsys-rep"
done
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  python3 -m nvtx_trace.cli run --full --nsys "$nsys" -t cuda,nvtx,cudnn,cublas --out "$out/run_ddp_flawed" --force \
      -- torchrun --nproc_per_node=2 programs/resnet_train.py --variant flawed --steps 30
fi
ls -la "$out"
