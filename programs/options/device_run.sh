#!/usr/bin/env bash
# Issue 51 on a two-GPU machine: tune against the best configuration by hand, one program per GPU at once, each
# pinned to its half of the cores (CUDA_VISIBLE_DEVICES + taskset; tune's CPUs-allowed logic sees the half).
#   source .device-carry/env.sh; bash programs/options/device_run.sh BUDGET_S "NAME0|ARGS..." "NAME1|ARGS..."
# A side: NAME is gpt2 (programs/options/gpt2_flags_train.py), images (image_folder_train.py), lightning
# (programs/heldout/lightning_train.py, Trainer defaults) or hf (programs/options/hf_args_train.py, TrainingArguments
# from its command line, fp32 defaults). For each: the
# program plain as it is and with its best options by hand (interleaved, the program's own printed step), then
# `nvtx-trace tune --budget BUDGET_S` (which times the program as it is itself: BYHAND="plain best" adds a plain
# by-hand run). Writes under $OUT: <name>.log, <name>.byhand.jsonl, <name>.tune.json.
set -u
O=${OUT:-/tmp/out}
TIMED='import json, sys
from nvtx_trace.runner import timing
r = timing.time_once(sys.argv[1:], {})
print(json.dumps({"step_ms": r.value_ms, "statistic": r.statistic, "parts": r.parts, "why": r.why}))'

mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-} TOKENIZERS_PARALLELISM=false WANDB_DISABLED=true
BUDGET=$1
shift
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$O/gpus.txt"
ncores=$(nproc)
half=${CORES_PER_SIDE:-$((ncores / 2))}  # a one-GPU host of 16 cores: CORES_PER_SIDE=16 is a side of a 32-core pair
script_of() {
  case $1 in
    gpt2) echo programs/options/gpt2_flags_train.py ;;
    images) echo programs/options/image_folder_train.py ;;
    lightning) echo programs/heldout/lightning_train.py ;;
    hf) echo programs/options/hf_args_train.py ;;
  esac
}
short_of() {  # what makes a by-hand run short (tune stops its own runs after their timed window)
  case $1 in
    gpt2) echo "--num_iterations 100" ;;
    images) echo "--epochs 2" ;;
    lightning) echo "--steps 120" ;;
    hf) echo "--max_steps 120" ;;
  esac
}
best_of() {
  case $1 in
    gpt2) echo "--flash 1 --dtype bfloat16 --tensorcores 1 --compile 1" ;;
    images) echo "-j $((half - 2)) --pin-mem --amp --amp-dtype bfloat16 --channels-last" ;;
    lightning) echo "--tf32 --bf16 --compile" ;;
    hf) echo "--bf16 --tf32 True --torch_compile" ;;
  esac
}
side() {  # gpu index, "name|args"
  local gpu=$1 name=${2%%|*} args=${2#*|}
  local cpus=$((gpu * half))-$((gpu * half + half - 1))
  local script
  script=$(script_of "$name")
  export CUDA_VISIBLE_DEVICES=$gpu
  {
    echo "=== $name on GPU $gpu, cores $cpus: $script $args; best by hand: $(best_of "$name")"
    for round in 1; do
      for what in ${BYHAND:-best}; do
        extra=""
        [ "$what" = best ] && extra=$(best_of "$name")
        t0=$SECONDS
        # shellcheck disable=SC2086
        # timed as tune times a run (nvtx_autotrace's window, its statistic), and as the program prints it
        # shellcheck disable=SC2086
        timed=$(taskset -c "$cpus" timeout 300 python3 -c "$TIMED" "$script" $args $extra 2>>"$O/$name.log" | tail -1)
        # shellcheck disable=SC2086
        line=$(taskset -c "$cpus" timeout 300 python3 "$script" $args $extra $(short_of "$name") 2>>"$O/$name.log" | grep -E '^[{]' | tail -1)
        echo "{\"round\": $round, \"what\": \"$what\", \"wall_s\": $((SECONDS - t0)), \"timed\": ${timed:-null}, \"out\": ${line:-null}}" >>"$O/$name.byhand.jsonl"
      done
    done
    t0=$SECONDS
    # shellcheck disable=SC2086
    taskset -c "$cpus" timeout $((BUDGET + 120)) python3 -m nvtx_trace.cli tune --no-history --budget "$BUDGET" \
      --out "/tmp/tune-$name" --json "$O/$name.tune.json" "$script" $args
    echo "=== tune exit $? after $((SECONDS - t0)) s"
  } >>"$O/$name.log" 2>&1
}
i=0
for spec in "$@"; do
  side "$i" "$spec" &
  i=$((i + 1))
done
wait
for f in "$O"/*.byhand.jsonl; do echo "== $f"; cat "$f"; done
for f in "$O"/*.log; do echo "== $f"; grep -E "nvtx-trace tune:|Step |=== |run it as|Traceback|Error" "$f" | tail -40; done
