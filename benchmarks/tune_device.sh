#!/usr/bin/env bash
# `nvtx-trace tune` on programs shaped like users', against the best configuration of the same settings made
# by hand, on the GPU machine (device tool), from the repo root:
#   source .device-carry/env.sh; bash benchmarks/tune_device.sh LABEL [GPU] [BUDGET_S]
# Labels: hf_fp32 (HF-style GPT-2, 6 layers, fp32 defaults), gpt_fp32 (GPT-2-class, 6 layers, fp32, hand-written
# attention), gpt_bf16 (the same in bf16 autocast, eager), gpt_compiled (the same, compiled), rn50_cl
# (ResNet-50 fp32 channels_last on GPU-made batches), rn18_loader (ImageNet-style ResNet-18, CPU transforms, 2 workers).
# Several labels run at once, one per GPU, each pinned to its share of the cores:
#   bash benchmarks/tune_device.sh hf_fp32 0 & bash benchmarks/tune_device.sh gpt_fp32 1 & wait
# Writes $OUT/tune_<LABEL>.json (tune's), $OUT/hand_<LABEL>.jsonl (plain runs by hand: the program's own
# CUDA-event timing), $OUT/log_<LABEL>.txt.
set -u
LABEL=${1:?label}
GPU=${2:-0}
BUDGET=${3:-420}
O=${OUT:-/tmp/out}
mkdir -p "$O"
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=$GPU
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
CORES=$(nproc)
SHARE=$((CORES / (NGPU > 0 ? NGPU : 1)))
PIN="taskset -c $((GPU * SHARE))-$((GPU * SHARE + SHARE - 1))"
B=programs/busy
case $LABEL in
  hf_fp32) PROG="$B/hf_style_train.py --dtype fp32 --steps 800 --warmup 5"
           HAND=("$B/hf_style_train.py --dtype fp32 --steps 40 --warmup 20"
                 "$B/hf_style_train.py --dtype bf16 --compile --steps 40 --warmup 20") ;;
  gpt_fp32) PROG="$B/gpt_train.py --dtype fp32 --layers 6 --steps 800 --warmup 5"
            HAND=("$B/gpt_train.py --dtype fp32 --layers 6 --steps 40 --warmup 20"
                  "$B/gpt_train.py --dtype bf16 --layers 6 --compile --steps 40 --warmup 20") ;;
  gpt_bf16) PROG="$B/gpt_train.py --dtype bf16 --layers 6 --steps 800 --warmup 5"
            HAND=("$B/gpt_train.py --dtype bf16 --layers 6 --steps 40 --warmup 20"
                  "$B/gpt_train.py --dtype bf16 --layers 6 --compile --steps 40 --warmup 20") ;;
  rn50_cl) PROG="$B/resnet_train.py --channels-last --data gpu --steps 800 --warmup 5"
           HAND=("$B/resnet_train.py --channels-last --data gpu --steps 40 --warmup 20"
                 "$B/resnet_train.py --channels-last --data gpu --dtype bf16 --steps 40 --warmup 20") ;;
  gpt_compiled) PROG="$B/gpt_train.py --dtype bf16 --layers 6 --compile --steps 800 --warmup 5"
                HAND=("$B/gpt_train.py --dtype bf16 --layers 6 --compile --steps 40 --warmup 20"
                      "$B/gpt_train.py --dtype bf16 --layers 6 --compile --optim fused --steps 40 --warmup 20") ;;
  rn18_loader) PROG="programs/heldout/loader_bound_resnet.py --workers 2 --steps 3000"
               HAND=("programs/heldout/loader_bound_resnet.py --workers 2 --steps 60"
                     "programs/heldout/loader_bound_resnet.py --workers $((SHARE - 2)) --steps 120") ;;
  *) echo "unknown label $LABEL" >&2; exit 2 ;;
esac
LOG=$O/log_$LABEL.txt
echo "== $LABEL on GPU $GPU, $PIN, budget $BUDGET s" >"$LOG"
# shellcheck disable=SC2086
/usr/bin/time -f "tune wall %e s" $PIN python3 -m nvtx_trace.cli tune --no-history --budget "$BUDGET" \
  --out /tmp/tune_$LABEL --force --json "$O/tune_$LABEL.json" $PROG >>"$LOG" 2>&1
for h in "${HAND[@]}"; do
  echo "== by hand: $h" >>"$LOG"
  # shellcheck disable=SC2086
  line=$(timeout 240 $PIN python3 $h 2>>"$LOG" | grep '^{' | tail -1)
  echo "{\"cmd\": \"$h\", \"result\": ${line:-null}}" >>"$O/hand_$LABEL.jsonl"
done
echo "== done $LABEL at ${SECONDS}s" >>"$LOG"
