#!/usr/bin/env bash
# Held-out GPU captures (issue 32): `nvtx-trace run` (default window) of the two programs here, then the
# second door, `nvtx-trace analyze` of each run's own report.sqlite and report.nsys-rep, compared key by key
# with the run's summary.json (tests/test_one_answer.py's comparison), and each program's plain median step.
#   source .device-carry/env.sh; bash programs/heldout/device_run.sh [doors|fix-rn18|fix-gpt]
# Writes under $OUT: log.txt, doors.txt, plain.jsonl, <name>.sqlite.xz, <name>.summary.json
# fix-rn18 / fix-gpt: does a conclusion survive its fix? `nvtx-trace try --advice` (profile, then each top finding's
# own knobs, plain and alternating) against the same change made by hand (vit: a ViT-B/16 fp32 trainer, the same); fix-rn18 also re-measures ResNet-101 bf16
# channels_last (try vs by hand, issue 31's one miss, after the optimizer-state fix). try_<name>.json, plain.jsonl.
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O" /tmp/run
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
H=programs/heldout
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$O/log.txt"
python3 -c "import torch; print(torch.__version__, torch.version.cuda)" >>"$O/log.txt"
doors() {  # name
  local d=/tmp/run/$1
  for door in report.sqlite report.nsys-rep; do
    python3 -m nvtx_trace.cli analyze "$d/$door" --json "$d/again_${door%%.*}_${door##*.}.json" --force >>"$O/log.txt" 2>&1
    python3 - "$d/summary.json" "$d/again_${door%%.*}_${door##*.}.json" "$1 $door" <<'PY' >>"$O/doors.txt" 2>&1
import json, sys
sys.path.insert(0, "tests")
from test_one_answer import differences
a, b = (json.load(open(p)) for p in sys.argv[1:3])
d = differences(a, b)
print(sys.argv[3], "SAME" if not d else f"{len(d)} differences", *d[:20], sep="\n  ")
PY
  done
  python3 -c "
import lzma, shutil, sys
with open(sys.argv[1], 'rb') as f, lzma.open(sys.argv[2], 'wb', preset=6) as g:
    shutil.copyfileobj(f, g)" "$d/report.sqlite" "$O/$1.sqlite.xz"
  cp "$d/summary.json" "$O/$1.summary.json"
}
trace() {  # name script args...
  local name=$1
  shift
  echo "=== run $name t=$SECONDS" | tee -a "$O/log.txt"
  timeout 280 python3 -m nvtx_trace.cli run --out "/tmp/run/$name" --no-history "$@" >>"$O/log.txt" 2>&1
  echo "rc=$? t=$SECONDS" | tee -a "$O/log.txt"
  [[ -f /tmp/run/$name/report.sqlite ]] && doors "$name"
}
plain() {  # name script args...
  local name=$1
  shift
  echo "{\"name\": \"$name\", \"result\": $(timeout 150 python3 "$@" 2>>"$O/log.txt" | grep '^{' | tail -1)}" >>"$O/plain.jsonl"
}
advice() {  # name args...
  local name=$1
  shift
  echo "=== try $name t=$SECONDS" | tee -a "$O/log.txt"
  timeout 400 python3 -m nvtx_trace.cli try --no-history --out "/tmp/try/$name" --json "$O/try_$name.json" "$@" \
    >>"$O/log.txt" 2>&1
  echo "rc=$? t=$SECONDS" | tee -a "$O/log.txt"
}
case ${1:-doors} in
doors)
  plain gpt_accum $H/nanogpt_accum_train.py --steps 60
  plain rn18_loader $H/loader_bound_resnet.py --steps 60
  trace gpt_accum $H/nanogpt_accum_train.py --steps 400
  trace rn18_loader $H/loader_bound_resnet.py --steps 400 ;;
fix-rn18)
  advice rn18_loader --advice $H/loader_bound_resnet.py --steps 400
  plain rn18_w15_by_hand $H/loader_bound_resnet.py --steps 100 --workers 15
  plain rn18_w3 $H/loader_bound_resnet.py --steps 100
  advice rn101_bf16_cl channels_last=1 programs/busy/resnet_train.py --arch resnet101 --dtype bf16 --data gpu --steps 300
  plain rn101_bf16_cl_by_hand programs/busy/resnet_train.py --arch resnet101 --dtype bf16 --data gpu --channels-last
  plain rn101_bf16_nchw programs/busy/resnet_train.py --arch resnet101 --dtype bf16 --data gpu ;;
fix-gpt)
  advice gpt_accum --advice $H/nanogpt_accum_train.py --steps 400
  advice rn18_loader_again --advice $H/loader_bound_resnet.py --steps 400
  cp /tmp/try/rn18_loader_again/profile/summary.json "$O/rn18_loader_again.summary.json"
  cp /tmp/try/gpt_accum/profile/summary.json "$O/gpt_accum_profile.summary.json"
  plain gpt_accum_plain $H/nanogpt_accum_train.py --steps 80
  plain gpt_accum_compiled_by_hand $H/nanogpt_accum_train.py --steps 80 --compile ;;
vit)  # 2026-11-26: a ViT-B/16 fp32 trainer written after the busy-GPU rules; advice (predicted) against by hand
  python3 $H/vit_train.py --steps 3 --batch 4 --workers 1 >>"$O/log.txt" 2>&1 || echo "smoke test failed" >>"$O/log.txt"
  for r in 1 2; do
    for v in "" --tf32 --bf16; do plain "vit_fp32${v/--/_}_r$r" $H/vit_train.py --steps 90 $v; done
  done
  advice vit --advice $H/vit_train.py --steps 200
  mkdir -p /tmp/run && rm -rf /tmp/run/vit_profile && cp -r /tmp/try/vit/profile /tmp/run/vit_profile && doors vit_profile
  cp /tmp/try/vit/try.json "$O/try_vit_full.json" 2>/dev/null ;;
vit-bf16)  # the same ViT in bf16: what the tool says next (advice), against the same change by hand
  for r in 1 2; do
    for v in "" --compile; do plain "vit_bf16${v/--/_}_r$r" $H/vit_train.py --steps 150 --bf16 $v; done
  done
  advice vit_bf16 --advice $H/vit_train.py --steps 300 --bf16
  rm -rf /tmp/run/vit_bf16_profile && cp -r /tmp/try/vit_bf16/profile /tmp/run/vit_bf16_profile && doors vit_bf16_profile ;;
compile)  # after try left out the steps in which torch.compile made a graph
  advice gpt_accum_compile compile=1 $H/nanogpt_accum_train.py --steps 400
  plain gpt_accum_plain $H/nanogpt_accum_train.py --steps 80
  plain gpt_accum_compiled_by_hand $H/nanogpt_accum_train.py --steps 80 --compile ;;
esac
echo "done t=$SECONDS" | tee -a "$O/log.txt"
