#!/usr/bin/env bash
# Re-capture the GPU sample reports (run on a CUDA machine with nsys >= 2023):
#   NSYS=/path/to/nsys scripts/capture_gpu_samples.sh OUTDIR
# Writes OUTDIR/resnet_{flawed,fixed}_user.{nsys-rep,sqlite}: the example
# training loop with hand-written NVTX ranges, traced for CUDA, cuDNN, cuBLAS
# and NVTX only (no CPU sampling, no context switches) to keep the files small.
# Redact before committing: nvtx-trace redact OUTDIR/x.sqlite -o sample_reports/x.sqlite
set -euo pipefail
out=${1:?usage: capture_gpu_samples.sh OUTDIR}
nsys=${NSYS:-nsys}
mkdir -p "$out"
for variant in flawed fixed; do
  name="$out/resnet_${variant}_user"
  "$nsys" profile -f true -o "$name" -t cuda,nvtx,cudnn,cublas -s none --cpuctxsw none \
      --trace-fork-before-exec=true \
      python3 examples/resnet_train.py --variant "$variant" --steps 30 --user-ranges
  "$nsys" export --type sqlite -f true -o "$name.sqlite" "$name.nsys-rep"
done
ls -la "$out"
