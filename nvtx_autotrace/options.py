"""Options, from ``install(**kwargs)`` over environment variables over defaults.

Environment variables exist because ``import nvtx_autotrace`` and
``python -m nvtx_autotrace`` take no arguments, and because DataLoader workers
started with ``spawn`` must come up with the same settings as the parent.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields

ENV_PREFIX = "NVTX_AUTOTRACE"


@dataclass(frozen=True)
class Options:
    enabled: str = "auto"  # NVTX_AUTOTRACE: auto (only under a profiler) | 1 (always) | 0 (never)
    module_depth: int | None = None  # NVTX_AUTOTRACE_MODULE_DEPTH: auto (None: budgeted) | N (deepest path) | -1 (all)
    budget_pct: float = 0.5  # NVTX_AUTOTRACE_BUDGET_PCT: module ranges' estimated cost allowed, % of a plain step
    modules: bool = True  # NVTX_AUTOTRACE_MODULES: module forward ranges
    backward_modules: bool = True  # NVTX_AUTOTRACE_BACKWARD_MODULES: per-module backward ranges
    dataloader: bool = True  # NVTX_AUTOTRACE_DATALOADER: batch waits and worker fetches
    optimizer: bool = True  # NVTX_AUTOTRACE_OPTIMIZER: optimizer.step / zero_grad ranges
    steps: bool = True  # NVTX_AUTOTRACE_STEPS: `step N` ranges
    copies: bool = True  # NVTX_AUTOTRACE_COPIES: host-to-device copies and pin_memory
    syncs: bool = True  # NVTX_AUTOTRACE_SYNCS: .item() / .cpu() / ... on CUDA tensors, cuda.synchronize

    @classmethod
    def from_env(cls, environ=os.environ, **overrides) -> "Options":
        values = {}
        for f in fields(cls):
            key = ENV_PREFIX if f.name == "enabled" else f"{ENV_PREFIX}_{f.name.upper()}"
            if key in environ and environ[key].strip() != "":
                values[f.name] = _parse(f.name, environ[key], key)
        for name, value in overrides.items():
            if name not in {f.name for f in fields(cls)}:
                raise TypeError(f"unknown nvtx_autotrace option {name!r}")
            values[name] = _parse(name, value, name)
        return cls(**values)

    def as_env(self) -> dict[str, str]:
        """These options as environment variables (for child processes)."""
        out = {}
        for name, value in asdict(self).items():
            key = ENV_PREFIX if name == "enabled" else f"{ENV_PREFIX}_{name.upper()}"
            out[key] = str(int(value)) if isinstance(value, bool) else "auto" if value is None else str(value)
        return out


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse(name: str, value, where: str):
    if name == "enabled":
        text = str(value).strip().lower() if not isinstance(value, bool) else ("1" if value else "0")
        if text in _TRUE:
            return "1"
        if text in _FALSE:
            return "0"
        if text == "auto":
            return "auto"
        raise ValueError(f"{where}={value!r}: expected auto, 1 or 0")
    if name == "module_depth":
        if value is None or str(value).strip().lower() == "auto":
            return None
        try:
            depth = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}={value!r}: expected auto or an integer (-1 = no limit)") from None
        if depth < -1:
            raise ValueError(f"{where}={value!r}: expected auto, -1 (no limit) or a depth >= 0")
        return depth
    if name == "budget_pct":
        try:
            pct = float(value)
        except (TypeError, ValueError):
            pct = float("nan")
        if not 0 < pct <= 100:
            raise ValueError(f"{where}={value!r}: expected a percentage of the step time, > 0 and <= 100")
        return pct
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{where}={value!r}: expected 1 or 0")
