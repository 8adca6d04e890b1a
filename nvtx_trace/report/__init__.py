"""Renderers: each turns one Analysis into one output (terminal, JSON, HTML) and computes nothing new."""

from __future__ import annotations


def skipped_by_reason(skipped: dict[str, str]) -> dict[str, list[str]]:
    """One line per reason: three analyses skipped for want of GPU data say so once, in every renderer."""
    out: dict[str, list[str]] = {}
    for name, why in skipped.items():
        out.setdefault(why, []).append(name)
    return out
