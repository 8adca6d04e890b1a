"""Tensor-core speed ratios on this GPU: GEMM and conv TFLOP/s in fp32 (no TF32), TF32 and bf16.

    python programs/busy/matmul_bench.py > bench.json

GEMMs are torch.matmul of (M x K) @ (K x N) with shapes from a GPT-2-small step at
8192 tokens (QKV, attention out-proj, MLP up/down, lm_head) and an 8192^3 reference.
The conv is a ResNet-50-like 3x3, 256->256 channels, 56x56, batch 128, stride 1,
padding 1, channels_last, forward only, cudnn.benchmark=True.
fp32: matmul.allow_tf32=False / cudnn.allow_tf32=False; tf32: both True;
bf16: inputs and weights in bfloat16. Each number: 5 warm-up calls, then --reps calls
between two CUDA events; TFLOP/s = 2*M*N*K (conv: 2*N*H*W*Cout*Cin*9) / time.
Prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

GEMMS = [  # name, M, K, N
    ("qkv 8192x768@768x2304", 8192, 768, 2304),
    ("attn_proj 8192x768@768x768", 8192, 768, 768),
    ("mlp_up 8192x768@768x3072", 8192, 768, 3072),
    ("mlp_down 8192x3072@3072x768", 8192, 3072, 768),
    ("lm_head 8192x768@768x50304", 8192, 768, 50304),
    ("square 8192^3", 8192, 8192, 8192),
]


def timeit(fn, reps):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def set_mode(mode):
    tf32 = mode == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    torch.backends.cudnn.benchmark = True
    gpu = torch.cuda.get_device_name()
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, m, k, n in GEMMS:
        for mode in ("fp32", "tf32", "bf16"):
            set_mode(mode)
            dt = torch.bfloat16 if mode == "bf16" else torch.float32
            a = torch.randn(m, k, device="cuda", generator=g).to(dt)
            b = torch.randn(k, n, device="cuda", generator=g).to(dt)
            reps = max(3, args.reps // 4) if (mode == "fp32" and m * n * k > 2e11) else args.reps
            ms = timeit(lambda a=a, b=b: torch.matmul(a, b), reps)
            print(json.dumps({"kind": "gemm", "shape": name, "M": m, "K": k, "N": n, "mode": mode, "ms": round(ms, 4),
                              "tflops": round(2 * m * n * k / ms / 1e9, 1), "gpu": gpu}), flush=True)
            del a, b
    nb, c, h = 128, 256, 56
    for mode in ("fp32", "tf32", "bf16"):
        set_mode(mode)
        dt = torch.bfloat16 if mode == "bf16" else torch.float32
        x = torch.randn(nb, c, h, h, device="cuda", generator=g).to(dt).contiguous(memory_format=torch.channels_last)
        w = torch.randn(c, c, 3, 3, device="cuda", generator=g).to(dt).contiguous(memory_format=torch.channels_last)
        ms = timeit(lambda x=x, w=w: F.conv2d(x, w, padding=1), args.reps)
        flops = 2 * nb * h * h * c * c * 9
        print(json.dumps({"kind": "conv", "shape": "conv3x3 256->256 56x56 b128 NHWC fwd", "mode": mode,
                          "ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1), "gpu": gpu}), flush=True)
    print(json.dumps({"kind": "versions", "torch": torch.__version__, "cuda": torch.version.cuda,
                      "cudnn": torch.backends.cudnn.version(), "gpu": gpu}), flush=True)


if __name__ == "__main__":
    main()
