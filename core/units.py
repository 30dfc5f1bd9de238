"""Sizes and counts as every panel and command prints them: bytes in binary units (KiB, MiB, GiB,
1 KiB = 1024 B), a change in size said as what it is ("saved" or "grew by"), and a noun counted
with its plural."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit below it: ``512 B``, ``3.3 MiB``; a negative size
    keeps its sign."""
    size, k = abs(float(n)), 0
    while size >= 1024 and k < len(_UNITS) - 1:
        size, k = size / 1024, k + 1
    sign = "-" if n < 0 else ""
    return f"{sign}{int(abs(n))} B" if k == 0 else f"{sign}{size:.1f} {_UNITS[k]}"


def format_size_change(before: int, after: int) -> str:
    """How a size went from ``before`` to ``after`` bytes: ``saved 3.3 MiB (-3.6%)``,
    ``grew by 3.3 MiB (+3.6%)`` or ``unchanged``; the share is of ``before``."""
    delta = after - before
    if delta == 0:
        return "unchanged"
    share = f" ({delta / before:+.1%})" if before else ""
    verb = "saved" if delta < 0 else "grew by"
    return f"{verb} {format_bytes(abs(delta))}{share}"


def format_count(n: int, noun: str) -> str:
    """``1 layer``, ``273 layers``, ``1,024 cells``: ``noun`` gets an ``s`` unless ``n`` is 1."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")
