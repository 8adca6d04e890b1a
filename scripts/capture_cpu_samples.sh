#!/usr/bin/env bash
# Re-capture the CPU sample report with `nvtx-trace run` on Debian's nsys 2022.4
# (no GPU needed; nvtx==0.2.11, torch CPU build), then redact it into sample_reports/:
#   scripts/capture_cpu_samples.sh [WORKDIR]
# Writes WORKDIR/cpu_slow_loader/ (report.nsys-rep, report.sqlite, summary.json,
# summary.html) and sample_reports/cpu_slow_loader.sqlite: programs/slow_loader_train.py,
# 12 steps, 2 DataLoader workers forked without exec, autotrace ranges in the training
# process and in both workers. Traced for NVTX only (-t nvtx; run adds -s none
# --cpuctxsw none): OS-runtime tracing would make the export ~2 MB bigger and shows
# nothing the tests need.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d)}
mkdir -p "$work"
out="$work/cpu_slow_loader"
rm -rf "$out"
nvtx-trace run --full --out "$out" --trace nvtx "$root/programs/slow_loader_train.py" --steps 12
nvtx-trace redact "$out/report.sqlite" -o "$root/sample_reports/cpu_slow_loader.sqlite" --force
ls -la "$out" "$root/sample_reports/cpu_slow_loader.sqlite"
