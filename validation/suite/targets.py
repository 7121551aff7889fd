"""The megakernel design targets, evaluated from a validation summary's rows (pure functions of the rows).

The generated megakernel of a model and batch is held at its fastest *usable* case — measured,
no error, output within tolerance — among the suite's megakernel schedules (default, searched,
fused, sentinel), unless a target names a schedule. Each target is a dict: ``id``, ``target``
(in words), ``met`` (``True``, ``False``, or ``None`` where nothing to judge was measured) and
``detail`` (the numbers behind it, or why there are none: refused, failed, not measured).

- :func:`design_targets` — the step of llama-3.2-1b at batch 1, llama-3.1-8b's share of the HBM
  read bandwidth at batch 1, batch 8 against batch 1, the searched schedule against the default,
  the prediction's error, every case's output;
- :func:`read_stacks` and the ``stacks`` argument — optionally, the megakernel against
  ``torch.compile`` in a CUDA graph (``inductor_graph``) measured by ``python -m validation stacks run`` on
  the same machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mksim.errors import MksimError

__all__ = ["TARGETS", "design_targets", "fastest_megakernel", "read_stacks"]

TARGETS = {"step_us": 730.0,            # llama-3.2-1b batch 1
           "bandwidth_fraction": 0.85,  # llama-3.1-8b batch 1, of the HBM read bandwidth
           "b8_over_b1": 1.15,          # batch 8's step over batch 1's, every model
           "searched_gain": 1.05,       # default / searched at batch 1, every model
           "mape_pct": 6.0, "case_error_pct": 10.0, "rel_err": 1e-2,
           "over_inductor": 1.5}        # inductor_graph / megakernel, where a stacks run is given
STACK = "inductor_graph"


def _usable(r: dict) -> bool:
    return bool(r.get("measured_us")) and not r.get("error") and r.get("correct") is not False


def _mk(rows: list[dict], model: str, batch: int, schedule: str | None = None) -> list[dict]:
    return [r for r in rows if (r["model"], r["batch"], r["mode"]) == (model, batch, "megakernel")
            and (schedule is None or r["schedule"] == schedule)]


def fastest_megakernel(rows: list[dict], model: str, batch: int, schedule: str | None = None) -> dict | None:
    """The fastest usable megakernel row of ``model`` at ``batch`` (of ``schedule`` if given)."""
    ok = [r for r in _mk(rows, model, batch, schedule) if _usable(r)]
    return min(ok, key=lambda r: r["measured_us"]) if ok else None


def _why_not(rows: list[dict], model: str, batch: int, schedule: str | None = None) -> str:
    """Why a model and batch has no usable megakernel row, in a few words."""
    rs = _mk(rows, model, batch, schedule)
    what = f"{model} b{batch}" + (f" {schedule}" if schedule else "")
    if not rs:
        return f"{what}: not measured"
    if any(r.get("refused") for r in rs):
        return f"{what}: refused ({next(r['refused'] for r in rs if r.get('refused'))})"
    if any(r.get("error") for r in rs):
        return f"{what}: failed ({next(r['error'] for r in rs if r.get('error'))})"
    return f"{what}: wrong output"


def _verdict(parts: list[bool | None]) -> bool | None:
    """All met: True; one missed: False; otherwise (something not measured) None."""
    if any(p is False for p in parts):
        return False
    return None if any(p is None for p in parts) or not parts else True


def _refused_or_none(rows: list[dict], model: str, batch: int, schedule: str | None = None) -> bool | None:
    """A case that was refused or failed misses its target; one that was not measured says nothing."""
    return None if "not measured" in _why_not(rows, model, batch, schedule) else False


def design_targets(rows: list[dict], metrics: dict, models: tuple[str, ...], hbm_GBps: float,
                   stacks: dict | None = None, t: dict[str, float] = TARGETS) -> list[dict[str, Any]]:
    """The design targets (module docstring) for ``models`` (the first is the small one, the second
    the large one), from summary ``rows`` and their ``metrics``; ``stacks``: :func:`read_stacks`."""
    out: list[dict[str, Any]] = []

    def add(id_: str, target: str, met: bool | None, detail: str) -> None:
        out.append({"id": id_, "target": target, "met": met, "detail": detail})

    def label(r: dict) -> str:
        return f"{r['measured_us']:.1f} µs ({r['schedule']})"

    small, large = models[0], models[-1]
    b = fastest_megakernel(rows, small, 1)
    add("step_us", f"{small} batch 1 step ≤ {t['step_us']:g} µs",
        None if b is None and _refused_or_none(rows, small, 1) is None else
        (b is not None and b["measured_us"] <= t["step_us"]),
        label(b) if b else _why_not(rows, small, 1))

    b = fastest_megakernel(rows, large, 1)
    frac = (b or {}).get("bandwidth_fraction")
    add("bandwidth", f"{large} batch 1 ≥ {t['bandwidth_fraction'] * 100:g} % of the HBM read bandwidth",
        None if b is None and _refused_or_none(rows, large, 1) is None else (frac or 0) >= t["bandwidth_fraction"],
        f"{frac * 100:.0f} %: {b['achieved_GBps'] / 1e3:.2f} of {hbm_GBps / 1e3:.2f} TB/s, {label(b)}"
        if b and frac else _why_not(rows, large, 1))

    parts, details = [], []
    for m in models:
        b1, b8 = fastest_megakernel(rows, m, 1), fastest_megakernel(rows, m, 8)
        if b1 and b8:
            x = b8["measured_us"] / b1["measured_us"]
            parts.append(x <= t["b8_over_b1"])
            details.append(f"{m} {x:.2f}× ({b8['measured_us']:.1f} / {b1['measured_us']:.1f} µs)")
        else:
            miss = [(bb, bt) for bb, bt in ((1, b1), (8, b8)) if bt is None]
            parts.append(_verdict([_refused_or_none(rows, m, bb) for bb, _ in miss]))
            details.append("; ".join(_why_not(rows, m, bb) for bb, _ in miss))
    add("batch8", f"batch 8 ≤ {t['b8_over_b1']:g}× batch 1, every model", _verdict(parts), "; ".join(details))

    parts, details = [], []
    for m in models:
        d, s = fastest_megakernel(rows, m, 1, "default"), fastest_megakernel(rows, m, 1, "searched")
        if d and s:
            x = d["measured_us"] / s["measured_us"]
            parts.append(x >= t["searched_gain"])
            details.append(f"{m} {x:.3f}× ({s['measured_us']:.1f} against {d['measured_us']:.1f} µs)")
        else:
            which = [k for k, v in (("default", d), ("searched", s)) if v is None]
            parts.append(_verdict([_refused_or_none(rows, m, 1, k) for k in which]))
            details.append("; ".join(_why_not(rows, m, 1, k) for k in which))
    add("searched", f"searched beats default by ≥ {(t['searched_gain'] - 1) * 100:.0f} % at batch 1, every model",
        _verdict(parts), "; ".join(details))

    compared = [r for r in rows if r.get("error_pct") is not None and not r.get("error")]
    if compared:
        worst = max(compared, key=lambda r: abs(r["error_pct"]))
        add("prediction", f"MAPE ≤ {t['mape_pct']:g} %, no case beyond {t['case_error_pct']:g} %",
            metrics["mape_pct"] <= t["mape_pct"] and abs(worst["error_pct"]) <= t["case_error_pct"],
            f"MAPE {metrics['mape_pct']:.1f} % over {len(compared)} cases; largest {worst['error_pct']:+.1f} % "
            f"({worst['name']})")
    else:
        add("prediction", f"MAPE ≤ {t['mape_pct']:g} %, no case beyond {t['case_error_pct']:g} %", None,
            "no case compared")

    ran = [r for r in rows if not r.get("refused")]
    checked = [r for r in ran if r.get("max_rel_err") is not None]
    bad = [r for r in ran if r.get("error") or r.get("correct") is False
           or (r.get("max_rel_err") is not None and r["max_rel_err"] > t["rel_err"])]
    detail = (f"largest {max(r['max_rel_err'] for r in checked):.1e} "
              f"({max(checked, key=lambda r: r['max_rel_err'])['name']}) over {len(checked)} cases" if checked
              else "no case checked")
    if bad:
        detail += "; " + ", ".join(r["name"] + (" failed" if r.get("error") else " wrong") for r in bad)
    add("correct", f"every case's max rel err ≤ {t['rel_err']:.0e}".replace("e-0", "e-"), None if not ran else not bad,
        detail)

    if stacks is not None:
        parts, details = [], []
        kv = {r.get("kv_len") for r in rows} - {None}
        rank = {m: i for i, m in enumerate(models)}
        for st in sorted(stacks.get("steps", []), key=lambda st: (rank.get(st["model"], len(rank)), st["batch"])):
            mk = fastest_megakernel(rows, st["model"], st["batch"])
            if st["stack"] != STACK or mk is None or st["kv_len"] not in kv:
                continue
            x = st["median_us"] / mk["measured_us"]
            parts.append(x >= t["over_inductor"])
            details.append(f"{st['model']} b{st['batch']} {x:.2f}× ({st['median_us']:.1f} against "
                           f"{mk['measured_us']:.1f} µs)")
        add("inductor", f"megakernel ≥ {t['over_inductor']:g}× faster than torch.compile in a CUDA graph "
                        f"({STACK}, {stacks.get('source', 'a stacks run')})",
            _verdict(parts) if parts else None, "; ".join(details) or "no model and batch measured by both")
    return out


def read_stacks(folder: Path | str) -> dict[str, Any]:
    """The whole steps of a ``python -m validation stacks run`` folder (its ``step-*.json``, sub-folders
    too): ``{"source": folder, "steps": [{stack, model, batch, kv_len, median_us}, ...]}``."""
    root = Path(folder)
    files = sorted(root.rglob("step-*.json")) if root.is_dir() else []
    if not files:
        raise MksimError(f"{root}: no step-*.json files of a validation.stacks run")
    steps = []
    for f in files:
        try:
            d = json.loads(f.read_text())
            steps.append({"stack": str(d["stack"]), "model": str(d["model"]), "batch": int(d["batch"]),
                          "kv_len": int(d["kv_len"]), "median_us": float(d["step_us"]["median"])})
        except (OSError, ValueError, KeyError, TypeError):
            raise MksimError(f"{f}: not a step record of validation.stacks (stack, model, batch, kv_len, "
                             "step_us.median)") from None
    return {"source": str(folder), "steps": sorted(steps, key=lambda s: (s["stack"], s["model"], s["batch"],
                                                                         s["kv_len"]))}
