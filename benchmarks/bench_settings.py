"""What the settings record (nvtx_autotrace/settings.py) costs a training program.

    python benchmarks/bench_settings.py [--device cuda] [--rounds 9]

Two figures, printed, asserting nothing:
* per step: the three notes it adds to every step (a set insert in ``torch.autocast.__enter__`` and in
  ``Optimizer.zero_grad``, a counter in ``torch.cuda.empty_cache``), as the difference between the same
  calls with and without the patches, interleaved rounds, median;
* once: reading the record (one garbage-collector scan plus the flags) with a GPT-2-small-sized model,
  its AdamW and a DataLoader alive.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CALLS = 20_000


def step_calls(opt, device: str):
    """What one training step does that the settings patches see: one autocast, one zero_grad."""
    def call():
        with torch.autocast(device, dtype=torch.bfloat16):
            pass
        opt.zero_grad(set_to_none=True)

    return call


def per_call_ns(fn) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(CALLS):
        fn()
    return (time.perf_counter_ns() - t0) / CALLS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args(argv)

    import nvtx_autotrace
    from nvtx_autotrace import _backend, settings

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "programs" / "busy"))
    from gpt_train import GPT

    model = GPT(50304, 1024, 12, 768, 12, "sdpa").to(args.device)
    opt = torch.optim.AdamW(model.parameters())
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(64, 8)), batch_size=8)
    call = step_calls(opt, args.device)

    diffs = []
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        t = {}
        for on in order:
            nvtx_autotrace.use_backend(_backend.Recorder())
            nvtx_autotrace.install(enabled="1", modules=False, dataloader=False, copies=False, syncs=False,
                                   steps=False, settings=on)
            t[on] = per_call_ns(call)
            nvtx_autotrace.uninstall()
        diffs.append(t[True] - t[False])
    nvtx_autotrace.use_backend(None)
    base = per_call_ns(call)

    settings.install()
    reads = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        settings.read_static()
        reads.append(time.perf_counter_ns() - t0)
    nvtx_autotrace.uninstall()
    del loader
    print(f"torch {torch.__version__}, device {args.device}, {sum(p.numel() for p in model.parameters()):,} parameters")
    print(f"per step: autocast enter + zero_grad take {base / 1000:.2f} µs plain; the settings notes add "
          f"{statistics.median(diffs):.0f} ns (median of {args.rounds} interleaved rounds, {CALLS} calls each, "
          f"nvtx_autotrace installed with and without settings)")
    print(f"once: reading the record takes {statistics.median(reads) / 1e6:.1f} ms (median of 5; "
          f"{len(__import__('gc').get_objects()):,} objects scanned)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
