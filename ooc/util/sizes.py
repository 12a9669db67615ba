"""Byte sizes: one parser and one formatter for every command.

Decimal (SI) units for ``kB``/``MB``/``GB``/``TB`` (and the bare letters ``k``/``M``/``G``/``T``),
binary units for ``KiB``/``MiB``/``GiB``/``TiB``: ``"4GB"`` is 4 x 10^9 bytes, ``"4GiB"`` 4 x 2^30.
:func:`format_bytes` prints binary units, as ``ooc info`` shows sizes.
"""

from __future__ import annotations

import math

import re

__all__ = ["parse_bytes", "format_bytes"]

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_POSITIVE = "sizes are positive: 16MB, 1.5GiB"


def parse_bytes(text: str | int | float) -> int:
    """``"4GB"`` -> 4_000_000_000, ``"512MiB"`` -> 536_870_912, ``123`` -> 123.

    Raises:
        ValueError: not a non-negative size with a known unit (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB);
            a negative one is refused as such (``-16MB is not a size (sizes are positive: ...)``).
    """
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"{text} is not a size ({_POSITIVE})")
        return int(text)
    if re.fullmatch(r"\s*-\s*[0-9.].*", str(text)):
        raise ValueError(f"{str(text).strip()} is not a size ({_POSITIVE})")
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot parse size {text!r}: use e.g. 4GB (4 x 10^9 bytes), 512MiB (512 x 2^20) or a byte count")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_bytes(n: float, up: bool = False) -> str:
    """Human-readable binary size, e.g. ``1.5 GiB`` (``up``: rounded up to the digit shown, so the
    figure printed is never below ``n``: for a minimum a user may copy)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{math.ceil(n) if up else int(n)} B"
            return f"{math.ceil(n * 10) / 10 if up else n:.1f} {unit}"
        n /= 1024
    return str(n)
