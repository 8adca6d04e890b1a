#!/usr/bin/env bash
# Runs the "busy GPU" measurements on the GPU machine (device tool), from the repo root:
#   source .device-carry/env.sh; bash programs/busy/device_run.sh A|B [deadline_s]
# Phase A: versions, matmul/conv microbenchmark, GPT timing rounds, GPT nsys captures.
# Phase B: loader check, HF-style and ResNet-50 timing rounds, their nsys captures.
# Phase D: captures of ResNet-50 in bf16 and of the compiled HF-style model.
# Phase E: HF-style bf16 with GPT-2's vocabulary (50257) against one padded to a multiple of 64 (50304).
# Phase C: ResNet-50 channels_last fp32 against its two levers, torch.compile and bf16 autocast (14 workers,
#          so the loader keeps up with bf16), and a capture of the compiled model (is the fusion advice right?).
# Phase F: the settings record on a GPU, and the evidence for the optimizer, allocator, debug-API and manual-attention
#          findings: plain GPT-2-small bf16 SDPA with AdamW foreach (default) / loop / fused, with empty_cache() every
#          step, with anomaly detection; a held-out manual-attention shape (seq 512, batch 16) against SDPA; then
#          `nvtx-trace run` (the tool, default window) on three of them, reports brought back for analysis.
# Phase G: through the tool itself: the GPT of the lever table (hand-written attention), the HF-style model with
#          foreach AdamW (its plain default is fused), the GPT with anomaly detection, ResNet-50 with
#          cudnn.benchmark off (plain: off against on), a GPT at batch 1, seq 128 (small kernels).
# Phase K1/K2/K3: `nvtx-trace try --advice` (issue 31's programs) against the same changes by hand, with the
#          advice profile's report brought back: K1 ResNet-50 NCHW fp32 on GPU-made batches (the model alone:
#          channels_last, amp); K2 ResNet-18 with a transform-heavy loader of 2 workers (num_workers under core
#          contention) and a capture at 14 workers; K3 the GPT-2-class eager trainer (compile). Outputs in one tar.
# Phase K4/K5: held out from the models K1-K2 calibrated (channels_last's batch-norm gain, loader contention):
#          K4 ResNet-50 bf16 NCHW and ResNet-101 fp32 NCHW on GPU-made batches, `try --from` their profile with
#          channels_last=1, and by hand; K5 ResNet-34 with 3 loader workers, `try --from` its profile with the
#          advised num_workers, and by hand.
# Phase K6: held out from K4's bf16 batch-norm factor: ResNet-101 and ResNet-18 bf16 NCHW on GPU-made batches,
#          `try --from` their profile with channels_last=1, and by hand.
# Plain timing runs are interleaved (round 1 forward order, round 2 reversed, ...);
# captures come after round 2 so they happen even if round 3 is skipped at the deadline.
# Writes under $OUT: results_<P>.jsonl, log_<P>.txt, versions_<P>.txt, bench.jsonl, <capture>.sqlite.xz
set -u
PHASE=${1:?phase A or B}
DEADLINE=${2:-540}
O=${OUT:-/tmp/out}
mkdir -p "$O" /tmp/cap /tmp/run
LOG=$O/log_$PHASE.txt
RES=$O/results_$PHASE.jsonl
export PYTHONUNBUFFERED=1
B=programs/busy
NSYS=${NSYS:-nsys}

left() { echo $((DEADLINE - SECONDS)); }

record() {  # label round json-line
  if [[ "$3" == \{* ]]; then
    echo "{\"label\": \"$1\", \"round\": $2, \"t\": $SECONDS, \"result\": $3}" >>"$RES"
  else
    echo "{\"label\": \"$1\", \"round\": $2, \"t\": $SECONDS, \"error\": true}" >>"$RES"
  fi
}

run() {  # label round est_s cmd...
  local label=$1 round=$2 est=$3
  shift 3
  if (($(left) < est)); then echo "SKIP $label r$round at t=$SECONDS" | tee -a "$LOG"; return; fi
  echo "=== $label r$round t=$SECONDS: $*" >>"$LOG"
  local out
  out=$(timeout $(($(left) - 5)) "$@" 2>>"$LOG" | grep '^{' | tail -1)
  echo "$label r$round t=$SECONDS $(echo "$out" | cut -c1-60)"
  record "$label" "$round" "$out"
}

capture() {  # label est_s cmd...
  local label=$1 est=$2
  shift 2
  if (($(left) < est)); then echo "SKIP capture $label at t=$SECONDS" | tee -a "$LOG"; return; fi
  echo "=== capture $label t=$SECONDS: $*" >>"$LOG"
  local out
  out=$(timeout $(($(left) - 5)) "$NSYS" profile -t cuda,nvtx --capture-range=cudaProfilerApi \
    --capture-range-end=stop -s none --cpuctxsw=none -f true -o "/tmp/cap/$label" "$@" 2>>"$LOG" | grep '^{' | tail -1)
  record "cap_$label" 0 "$out"
  if [[ -f /tmp/cap/$label.nsys-rep ]]; then
    timeout 120 "$NSYS" export --type sqlite -f true -o "/tmp/cap/$label.sqlite" "/tmp/cap/$label.nsys-rep" >>"$LOG" 2>&1
    python3 - "/tmp/cap/$label.sqlite" "$O/$label.sqlite.xz" <<'EOF' >>"$LOG" 2>&1
import lzma, shutil, sys
with open(sys.argv[1], "rb") as f, lzma.open(sys.argv[2], "wb", preset=9) as g:
    shutil.copyfileobj(f, g)
EOF
    ls -la "/tmp/cap/$label".* "$O/$label.sqlite.xz" >>"$LOG" 2>&1
  fi
  echo "capture $label done t=$SECONDS"
}

{
  date; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
  "$NSYS" --version; nproc
  python3 -c "import torch, torchvision, transformers, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'torchvision', torchvision.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
} >"$O/versions_$PHASE.txt" 2>&1
cat "$O/versions_$PHASE.txt"

G="python3 $B/gpt_train.py"
H="python3 $B/hf_style_train.py"
R="python3 $B/resnet_train.py"

if [[ $PHASE == A ]]; then
  timeout 120 python3 $B/matmul_bench.py >"$O/bench.jsonl" 2>>"$LOG"
  echo "bench done t=$SECONDS"
  variants=(
    "gpt_bf16_manual|25|$G --dtype bf16"
    "gpt_bf16_manual_compile|90|$G --dtype bf16 --compile"
    "gpt_fp32_manual|35|$G --dtype fp32"
    "gpt_fp32_manual_tf32|25|$G --dtype fp32 --tf32"
    "gpt_bf16_sdpa|25|$G --dtype bf16 --attn sdpa"
  )
  caps() {
    capture gpt_bf16_eager 60 $G --dtype bf16 --warmup 10 --profile-steps 8
    capture gpt_bf16_compiled 90 $G --dtype bf16 --compile --warmup 10 --profile-steps 8
    capture gpt_fp32 60 $G --dtype fp32 --warmup 10 --profile-steps 8
  }
elif [[ $PHASE == D ]]; then  # captures only: what bf16 does to ResNet-50's kernels, what compile does to HF's
  variants=()
  caps() {
    capture rn50_cl_bf16 60 $R --channels-last --dtype bf16 --workers 14 --warmup 10 --profile-steps 8
    capture hf_bf16_compiled 150 $H --dtype bf16 --compile --warmup 10 --profile-steps 8
  }
elif [[ $PHASE == E ]]; then  # HF-style bf16: GPT-2's vocabulary (align1 LM-head GEMMs) against one padded to 64
  variants=(
    "hf_bf16|25|$H --dtype bf16"
    "hf_bf16_vocab50304|25|$H --dtype bf16 --vocab 50304"
  )
  caps() { :; }
elif [[ $PHASE == C ]]; then
  run resnet_loader_only 0 30 $R --loader-only --workers 14
  variants=(
    "rn50_cl_fp32|35|$R --channels-last --dtype fp32 --workers 14"
    "rn50_cl_bf16|30|$R --channels-last --dtype bf16 --workers 14"
  )
  caps() {  # compiling takes minutes: one timed run between the rounds, then one capture
    run rn50_cl_fp32_compile 1 150 $R --channels-last --dtype fp32 --compile --workers 14
    capture rn50_cl_fp32_compiled 150 $R --channels-last --dtype fp32 --compile --workers 14 --warmup 10 --profile-steps 8
  }
elif [[ $PHASE == B ]]; then
  run resnet_loader_only 0 30 $R --loader-only --workers 8
  variants=(
    "hf_fp32|30|$H --dtype fp32"
    "hf_fp32_tf32|25|$H --dtype fp32 --tf32"
    "hf_bf16|25|$H --dtype bf16"
    "hf_bf16_compile|90|$H --dtype bf16 --compile"
    "rn50_cl_fp32|35|$R --channels-last --dtype fp32"
    "rn50_cl_bf16|30|$R --channels-last --dtype bf16"
  )
  caps() {
    capture hf_fp32 60 $H --dtype fp32 --warmup 10 --profile-steps 8
    capture hf_bf16 50 $H --dtype bf16 --warmup 10 --profile-steps 8
    capture rn50_cl_fp32 60 $R --channels-last --dtype fp32 --warmup 10 --profile-steps 8
  }
fi

trace() {  # label est_s cmd...: nvtx-trace run (default window), report.sqlite and summary.json brought back
  local label=$1 est=$2
  shift 2
  if (($(left) < est)); then echo "SKIP trace $label at t=$SECONDS" | tee -a "$LOG"; return; fi
  echo "=== trace $label t=$SECONDS: $*" >>"$LOG"
  timeout $(($(left) - 5)) python3 -m nvtx_trace.cli run --nsys "$NSYS" --out "/tmp/run/$label" --force "$@" \
    >"/tmp/run/trace_$label.txt" 2>&1
  echo "trace $label rc=$? t=$SECONDS"
  { echo "=== trace $label"; cat "/tmp/run/trace_$label.txt"; } >>"$LOG"
  [[ $PHASE == F || $PHASE == K* ]] && cp "/tmp/run/$label/summary.json" "$O/trace_$label.summary.json" 2>/dev/null
  [[ -f /tmp/run/$label/report.sqlite ]] && python3 -c "
import lzma, shutil, sys
with open(sys.argv[1], 'rb') as f, lzma.open(sys.argv[2], 'wb', preset=6) as g:
    shutil.copyfileobj(f, g)" "/tmp/run/$label/report.sqlite" "$O/trace_$label.sqlite.xz"
}

if [[ $PHASE == F ]]; then
  variants=(
    "gpt_bf16_sdpa|25|$G --dtype bf16 --attn sdpa"
    "gpt_bf16_sdpa_loop|30|$G --dtype bf16 --attn sdpa --optim loop"
    "gpt_bf16_sdpa_fused|25|$G --dtype bf16 --attn sdpa --optim fused"
    "gpt_bf16_sdpa_empty_cache|25|$G --dtype bf16 --attn sdpa --empty-cache"
    "gpt_bf16_sdpa_anomaly|40|$G --dtype bf16 --attn sdpa --anomaly"
    "gpt512_bf16_manual|25|$G --dtype bf16 --seq 512 --batch 16"
    "gpt512_bf16_sdpa|25|$G --dtype bf16 --seq 512 --batch 16 --attn sdpa"
  )
  caps() {
    trace gpt_bf16_sdpa_loop 80 $B/gpt_train.py --dtype bf16 --attn sdpa --optim loop --steps 200
    trace gpt512_bf16_manual 80 $B/gpt_train.py --dtype bf16 --seq 512 --batch 16 --steps 200
    trace gpt_bf16_sdpa_empty_cache 80 $B/gpt_train.py --dtype bf16 --attn sdpa --empty-cache --steps 200
  }
fi

if [[ $PHASE == G ]]; then  # held-out checks through the tool itself (nvtx-trace run), and their plain levers
  variants=(
    "hf_bf16_foreach|25|$H --dtype bf16 --optim adamw"
    "hf_bf16_fused|25|$H --dtype bf16"
    "rn50_cl_bf16_nobench|35|$R --channels-last --dtype bf16 --workers 14 --no-cudnn-benchmark"
    "rn50_cl_bf16_bench|35|$R --channels-last --dtype bf16 --workers 14"
  )
  caps() {
    trace gpt_bf16_manual 60 $B/gpt_train.py --dtype bf16 --steps 200
    trace hf_bf16_foreach 60 $B/hf_style_train.py --dtype bf16 --optim adamw --steps 200
    trace gpt_bf16_sdpa_anomaly 60 $B/gpt_train.py --dtype bf16 --attn sdpa --anomaly --steps 200
    trace rn50_cl_bf16_nobench 60 $B/resnet_train.py --channels-last --dtype bf16 --workers 14 --no-cudnn-benchmark --steps 200
    trace gpt128_b1 50 $B/gpt_train.py --dtype bf16 --attn sdpa --batch 1 --seq 128 --steps 400
  }
fi

trytool() {  # label est_s args...: nvtx-trace try (baseline and variant, 2 rounds, plain), JSON kept
  local label=$1 est=$2
  shift 2
  if (($(left) < est)); then echo "SKIP try $label at t=$SECONDS" | tee -a "$LOG"; return; fi
  echo "=== try $label t=$SECONDS: $*" >>"$LOG"
  timeout $(($(left) - 5)) python3 -m nvtx_trace.cli try --json "/tmp/run/try_$label.json" "$@" >>"$LOG" 2>&1
  echo "try $label rc=$? t=$SECONDS"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({'label': sys.argv[2], **d}))" \
    "/tmp/run/try_$label.json" "$label" >>"$O/try_$PHASE.jsonl" 2>>"$LOG"
}

if [[ $PHASE == H ]]; then  # nvtx-trace try against the same change made by hand (one plain run each, same machine)
  variants=()
  caps() {
    trytool hf_fp32_tf32 200 tf32=1 $B/hf_style_train.py --dtype fp32 --steps 400
    run hf_fp32_tf32_by_hand 1 30 $H --dtype fp32 --tf32
    trytool rn50_cl_amp 200 amp=bf16 $B/resnet_train.py --channels-last --dtype fp32 --workers 14 --steps 400
    run rn50_cl_bf16_by_hand 1 40 $R --channels-last --dtype bf16 --workers 14
    trytool gpt_loop_fused 150 fused_optimizer=1 $B/gpt_train.py --dtype bf16 --attn sdpa --optim loop --steps 400
    run gpt_sdpa_fused_by_hand 1 25 $G --dtype bf16 --attn sdpa --optim fused
  }
fi
if [[ $PHASE == I ]]; then
  variants=()
  caps() {
    run rn50_cl_bf16_long 1 70 $R --channels-last --dtype bf16 --workers 14 --warmup 100 --steps 100
    trace rn50_w2 70 $B/resnet_train.py --workers 2 --steps 300
    trytool rn50_w2_workers 240 --from /tmp/run/rn50_w2 num_workers=14 $B/resnet_train.py --workers 2 --steps 300
    run rn50_w14_by_hand 1 40 $R --workers 14
    trytool gpt_compile 200 compile=1 $B/gpt_train.py --dtype bf16 --steps 400
  }
fi

if [[ $PHASE == J ]]; then  # nvtx-trace try --advice: profile, then each top finding's own knobs
  variants=()
  caps() {
    trytool rn50_w2_advice 300 --advice $B/resnet_train.py --workers 2 --steps 300
    trytool hf_fp32_advice 230 --rounds 1 --advice $B/hf_style_train.py --dtype fp32 --steps 400
  }
fi

advice() {  # label est_s args...: try --advice, its JSON and its profile's report.sqlite.xz and summary.json kept
  local label=$1
  trytool "$@"
  local dir
  dir=$(grep -o 'outputs in /tmp/nvtx-trace-advice-[^)]*' "$LOG" | tail -1 | cut -d' ' -f3)
  [[ -n $dir && -f $dir/summary.json ]] && cp "$dir/summary.json" "$O/advice_$label.summary.json"
  [[ -n $dir && -f $dir/report.sqlite ]] && python3 -c "
import lzma, shutil, sys
with open(sys.argv[1], 'rb') as f, lzma.open(sys.argv[2], 'wb', preset=6) as g:
    shutil.copyfileobj(f, g)" "$dir/report.sqlite" "$O/advice_$label.sqlite.xz"
  echo "advice $label kept from ${dir:-nowhere} t=$SECONDS"
}

if [[ $PHASE == K1 ]]; then
  variants=()
  caps() {
    advice rn50_gpu 360 --advice $B/resnet_train.py --data gpu --steps 400
    run rn50_gpu_nchw_by_hand 1 30 $R --data gpu
    run rn50_gpu_cl_by_hand 1 30 $R --data gpu --channels-last
    run rn50_gpu_bf16_by_hand 1 30 $R --data gpu --dtype bf16
    run rn50_gpu_cl_bf16_by_hand 1 30 $R --data gpu --channels-last --dtype bf16
  }
fi
if [[ $PHASE == K2 ]]; then
  variants=()
  caps() {
    advice rn18_w2 300 --advice $B/resnet_train.py --arch resnet18 --workers 2 --steps 300
    n=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(next((v['knobs']['num_workers'] for v in d['variants'] if 'num_workers' in v['knobs']), 14))" /tmp/run/try_rn18_w2.json 2>/dev/null || echo 14)
    run rn18_advised_workers_by_hand 1 40 $R --arch resnet18 --workers "$n" --steps 100
    run rn18_w8_by_hand 1 40 $R --arch resnet18 --workers 8 --steps 100
    trace rn18_w14 70 $B/resnet_train.py --arch resnet18 --workers 14 --steps 300
    trace rn18_w8 70 $B/resnet_train.py --arch resnet18 --workers 8 --steps 300
  }
fi
if [[ $PHASE == K3 ]]; then
  variants=()
  caps() {
    advice gpt_eager 400 --rounds 1 --advice $B/gpt_train.py --dtype bf16 --steps 400
    run gpt_compile_by_hand 1 120 $G --dtype bf16 --compile
  }
fi

tryfrom() {  # label est_s knobs script args...: try --from the trace of the same label
  local label=$1 est=$2
  shift 2
  trytool "${label}_try" "$est" --from "/tmp/run/$label" "$@"
}

advised_workers() {  # label: the num_workers its trace's loader finding recommends (14 without one)
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(next((f['recommend']['num_workers'] for f in d['findings'] if (f.get('recommend') or {}).get('num_workers')), 14))" "/tmp/run/$1/summary.json" 2>/dev/null || echo 14
}

if [[ $PHASE == K4 ]]; then
  variants=()
  caps() {
    trace rn50_gpu_bf16 80 $B/resnet_train.py --data gpu --dtype bf16 --steps 400
    tryfrom rn50_gpu_bf16 150 channels_last=1 $B/resnet_train.py --data gpu --dtype bf16 --steps 400
    run rn50_gpu_bf16_cl_by_hand 1 30 $R --data gpu --dtype bf16 --channels-last
    trace rn101_gpu 90 $B/resnet_train.py --arch resnet101 --data gpu --steps 300
    tryfrom rn101_gpu 180 channels_last=1 $B/resnet_train.py --arch resnet101 --data gpu --steps 300
    run rn101_gpu_cl_by_hand 1 35 $R --arch resnet101 --data gpu --channels-last
  }
fi
if [[ $PHASE == K6 ]]; then
  variants=()
  caps() {
    trace rn101_gpu_bf16 90 $B/resnet_train.py --arch resnet101 --data gpu --dtype bf16 --steps 300
    tryfrom rn101_gpu_bf16 150 channels_last=1 $B/resnet_train.py --arch resnet101 --data gpu --dtype bf16 --steps 300
    run rn101_gpu_bf16_cl_by_hand 1 30 $R --arch resnet101 --data gpu --dtype bf16 --channels-last
    trace rn18_gpu_bf16 70 $B/resnet_train.py --arch resnet18 --data gpu --dtype bf16 --steps 600
    tryfrom rn18_gpu_bf16 110 channels_last=1 $B/resnet_train.py --arch resnet18 --data gpu --dtype bf16 --steps 600
    run rn18_gpu_bf16_cl_by_hand 1 25 $R --arch resnet18 --data gpu --dtype bf16 --channels-last --steps 100
  }
fi
if [[ $PHASE == K5 ]]; then
  variants=()
  caps() {
    trace rn34_w3 80 $B/resnet_train.py --arch resnet34 --workers 3 --steps 300
    n=$(advised_workers rn34_w3)
    tryfrom rn34_w3 200 "num_workers=$n" $B/resnet_train.py --arch resnet34 --workers 3 --steps 300
    run rn34_advised_by_hand 1 40 $R --arch resnet34 --workers "$n" --steps 100
    trace rn34_advised 80 $B/resnet_train.py --arch resnet34 --workers "$n" --steps 300
  }
fi

one_round() {  # round forward|reverse
  local n=${#variants[@]} i idx
  for ((i = 0; i < n; i++)); do
    idx=$i
    [[ $2 == reverse ]] && idx=$((n - 1 - i))
    IFS='|' read -r label est cmd <<<"${variants[$idx]}"
    run "$label" "$1" "$est" $cmd
  done
}

one_round 1 forward
one_round 2 reverse
caps
[[ $PHASE =~ ^([CDEFGHIJ]|K[1-6])$ ]] || one_round 3 forward
if [[ $PHASE == G ]] && (($(left) > 40)); then
  timeout 60 python3 benchmarks/bench_settings.py --device cuda >>"$LOG" 2>&1
  echo "bench_settings done t=$SECONDS"
fi
echo "phase $PHASE done t=$SECONDS"
if [[ $PHASE == K* ]]; then  # the device brings back at most 8 files: one tar
  (cd "$O" && lscpu >lscpu_$PHASE.txt 2>&1; tar -cf "phase_$PHASE.tar" --exclude "phase_$PHASE.tar" . && \
    find . -type f ! -name "phase_$PHASE.tar" -delete)
fi
