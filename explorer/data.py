"""Plain data for the explorer's pages, extracted from mksim (no Dash, no plotly).

Every function returns dicts and lists of numbers and strings, so pages and tests share one
source of truth and the figures in :mod:`explorer.figures` stay pure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Validation result sets committed under ``validation/results/``, in display order.
VALIDATION_SETS = ("h200", "h200-heldout")


def models() -> list[str]:
    """Built-in model names."""
    from mksim import models as m

    return list(m.names())


def gpus() -> list[str]:
    """GPU names (built-in and calibrated), as ``mksim hw list`` knows them."""
    import hwmodels

    return list(hwmodels.available())


def compare_data(model: str, gpu: str, batch: int = 1, kv_len: int = 1024, phase: str = "decode") -> dict[str, Any]:
    """Every execution mode on one workload: what ``mksim compare --json`` prints, plus the breakdown order.

    Keys: ``model gpu workload batch kv_len phase bandwidth_floor_us modes categories``; ``modes`` maps each
    mode to ``latency_us tokens_per_s hbm_util speedup_vs_stream policy breakdown_us``. Raises
    :class:`mksim.errors.MksimError` on bad input (batch 0, a KV length past the model's context, ...).
    """
    from mksim.cli import compare_modes
    from mksim.sim import CATEGORIES

    d = compare_modes(model, gpu, batch, kv_len, phase)
    return {**d, "categories": list(CATEGORIES)}


def _results_dir() -> Path:
    import validation

    return Path(validation.__file__).resolve().parent / "results"


def validation_sets() -> list[str]:
    """The committed validation result sets that have a ``summary.json``."""
    root = _results_dir()
    return [s for s in VALIDATION_SETS if (root / s / "summary.json").is_file()]


def validation_data(name: str = "h200") -> dict[str, Any]:
    """Predicted vs measured from ``validation/results/<name>/summary.json``.

    Keys: ``name gpu date predicted_with`` (strings), ``cases`` (the compared cases: ``name model batch
    mode schedule predicted_us measured_us error_pct``), ``by_mode`` (per mode ``n mape_pct mean_error_pct
    max_abs_error_pct``) and ``metrics_line`` (one sentence: MAPE, per-mode errors, Kendall τ).
    """
    if name not in VALIDATION_SETS:
        from mksim.errors import MksimError

        raise MksimError(f"unknown validation set {name!r}; known: {', '.join(VALIDATION_SETS)}")
    s = json.loads((_results_dir() / name / "summary.json").read_text())
    keys = ("name", "model", "batch", "mode", "schedule", "predicted_us", "measured_us", "error_pct")
    cases = [{k: c.get(k) for k in keys} for c in s["cases"]
             if c.get("predicted_us") and c.get("measured_us") and c.get("error_pct") is not None]
    m = s.get("metrics", {})
    return {"name": name, "gpu": s.get("gpu", ""), "date": s.get("date", ""),
            "predicted_with": s.get("predicted_with", ""), "cases": cases,
            "by_mode": m.get("by_mode", {}), "metrics_line": metrics_line(m)}


def metrics_line(m: dict[str, Any]) -> str:
    """One sentence summarising a validation summary's ``metrics`` (as in ``table.md``)."""
    if "mape_pct" not in m:
        return "no compared cases"
    modes = ", ".join(f"{k} {v['mape_pct']:.1f} %" for k, v in m.get("by_mode", {}).items())
    line = f"MAPE {m['mape_pct']:.1f} % over {m.get('compared', '?')} of {m.get('cases', '?')} cases; by mode: {modes}."
    tau = m.get("kendall_tau") or {}
    if tau.get("overall") is not None:
        line += f" Kendall τ-b {tau['overall']:.2f} over all cases"
        if tau.get("mean_of_groups") is not None:
            line += f", {tau['mean_of_groups']:.2f} on average within each model and batch"
        line += "."
    return line
