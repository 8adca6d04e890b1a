"""Options, from ``install(**kwargs)`` over environment variables over defaults.

Environment variables exist because ``import nvtx_autotrace`` and
``python -m nvtx_autotrace`` take no arguments, and because DataLoader workers
started with ``spawn`` must come up with the same settings as the parent.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields

from nvtx_trace import names


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
    settings: bool = True  # NVTX_AUTOTRACE_SETTINGS: one record of the program's settings (precision, optimizer...)
    memory: bool = True  # NVTX_AUTOTRACE_MEMORY: GPU memory per step, growing lines, out-of-memory errors explained

    @classmethod
    def from_env(cls, environ=os.environ, **overrides) -> "Options":
        values = {}
        for f in fields(cls):
            key = names.autotrace_option_env(f.name)
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
            key = names.autotrace_option_env(name)
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
    if name in ("module_depth", "budget_pct"):
        parse = names.parse_module_depth if name == "module_depth" else names.parse_budget_pct
        try:
            return parse(value)
        except ValueError as exc:
            raise ValueError(f"{where}={exc}") from None
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{where}={value!r}: expected 1 or 0")
