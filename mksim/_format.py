"""Number formatting shared by the CLI and reports."""

from __future__ import annotations


def si(x: float, unit: str = "", digits: int = 3) -> str:
    """``si(2.47e9, "B") == "2.47 GB"``: a number with an SI prefix."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.{digits}g} {prefix}{unit}"
    return f"{x:.{digits}g} {unit}".rstrip()
