"""Sizes in words for people: one formatter for every message and summary line."""

from __future__ import annotations

__all__ = ["human_bytes"]


def human_bytes(n: float) -> str:
    """``n`` bytes in binary units: ``"512 B"``, ``"1.5 MiB"``, up to TiB (one decimal
    above bytes)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
