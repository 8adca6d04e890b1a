"""How a figure is written for a person: durations, sizes, counts and shares, the same everywhere (the analysis's
findings, the pages, the terminal), so that no layer formats a figure its own way."""

from __future__ import annotations


def ms(ns: float) -> str:
    """Human duration: 1234567 -> '1.23 ms'."""
    ns = float(ns)
    if abs(ns) >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if abs(ns) >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e3:.1f} µs"


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def count(n: int, word: str, plural: str | None = None) -> str:
    """'1 worker', '3 workers', '2 training processes'."""
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def pct(x: float) -> str:
    """'37 %'; a share that rounds to 0 but is not zero reads '<1 %'."""
    return "<1 %" if 0 < x < 0.005 else f"{100 * x:.0f} %"
