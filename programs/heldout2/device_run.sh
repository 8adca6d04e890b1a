#!/usr/bin/env bash
# Held-out programs of issue 41 (item 8): `nvtx-trace try --advice --rounds 1` on each, the process pinned to the
# first half of the machine's cores (taskset, as schedulers and containers pin), on the GPU machine:
#   source .device-carry/env.sh; bash programs/heldout2/device_run.sh LABEL...
# Labels: lightning jpeg attn hf timm0 mlp. Writes $OUT/try_<LABEL>.json and $OUT/log_<LABEL>.txt.
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
H=programs/heldout2
HALF=$(($(nproc) / 2))
for LABEL in "$@"; do
  case $LABEL in
    lightning) PROG="$H/lightning_cnn.py" ;;
    jpeg) PROG="$H/jpeg_folder_classifier.py" ;;
    attn) PROG="$H/fp32_attention_lm.py" ;;
    hf) PROG="$H/hf_trainer_bert.py" ;;
    timm0) PROG="$H/timm_convnext_workers0.py" ;;
    mlp) PROG="$H/small_mlp_syncs.py" ;;
    *) echo "unknown label $LABEL" >&2; continue ;;
  esac
  LOG=$O/log_$LABEL.txt
  echo "== $LABEL: taskset -c 0-$((HALF - 1)) of $(nproc), start ${SECONDS}s" >"$LOG"
  # shellcheck disable=SC2086
  timeout 560 taskset -c 0-$((HALF - 1)) python3 -m nvtx_trace.cli try --advice --rounds 1 --no-history \
    --out "/tmp/try_$LABEL" --force --json "$O/try_$LABEL.json" $PROG >>"$LOG" 2>&1
  echo "== exit $? at ${SECONDS}s" >>"$LOG"
  cp "/tmp/try_$LABEL/profile/summary.json" "$O/profile_$LABEL.json" 2>/dev/null
done
