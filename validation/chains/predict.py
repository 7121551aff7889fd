"""Predict the measured chains with mksim (CPU): per case predicted vs measured, MAPE, PDL's sign.

Each case's workload and schedule are rebuilt as the runner built them (:mod:`.cases`) and
simulated on the hardware model asked for; the prediction is the simulated latency less the launch
latency before the first kernel (CUDA events see GPU time: ``validation.suite.predicted_us``).

What a prediction is of: every case goes through :func:`predict_case`, which takes the
implementation's name. mksim has no implementation profiles yet, so both implementations are
predicted with its default (ideal-kernel) model, and cuBLAS chains with the schedule options of
the mode's defaults; the output says so (``model`` per row). mksim has no PDL trigger position
either: graph_pdl ``early`` and ``late`` get the same prediction.

PDL's sign: for each mksim chain (sequence, batch) and trigger, the measured effect of graph + PDL
against graph (``pdl / graph - 1``) and the predicted one; counted where the measured effect
exceeds :data:`PDL_THRESHOLD` in size, right where both have the same sign.
"""

from __future__ import annotations

import statistics
from typing import Any

import hwmodels
import mksim
from mksim.errors import MksimError

from . import cases as C

PDL_THRESHOLD = 0.03
MODEL_NOTE = {"mksim": "ideal kernels (no implementation profile yet)",
              "cublas": "ideal kernels (no implementation profile yet)"}


def predict_case(sequence: str, batch: int, mode: str, implementation: str, gpu: str,
                 trigger: str | None = None) -> float:
    """Predicted µs of one chain. ``implementation`` (``mksim`` or ``cublas``) picks the schedule's
    options: mksim's kernels run with what they need (:func:`.cases.kernel_options`); cuBLAS with
    the mode's defaults. The one place where an implementation profile will plug in."""
    if implementation not in C.IMPLEMENTATIONS:
        raise MksimError(f"unknown implementation {implementation!r}; give one of {', '.join(C.IMPLEMENTATIONS)}")
    wl = C.chain_workload(sequence, batch)
    g = hwmodels.load(gpu)
    if implementation == "mksim":
        s = mksim.build_schedule(wl, g, mode, **C.kernel_options(wl, mode, gpu))
    else:
        s = mksim.build_schedule(wl, g, mode)
    return mksim.simulate(s).latency_us - g.launch.launch_latency_us


def predict_single(k: int, n: int, batch: int, implementation: str, gpu: str) -> float:
    """Predicted µs of one ``K x N`` kernel launched alone between events (a stream of one op),
    with the same implementation switch as :func:`predict_case`."""
    if implementation not in C.IMPLEMENTATIONS:
        raise MksimError(f"unknown implementation {implementation!r}; give one of {', '.join(C.IMPLEMENTATIONS)}")
    wl = C.chain_workload(C.Sequence("single", "llama-3.2-1b", ((k, n),)), batch)
    g = hwmodels.load(gpu)
    opts = C.kernel_options(wl, "stream", gpu) if implementation == "mksim" else {}
    s = mksim.build_schedule(wl, g, "stream", **opts)
    return mksim.simulate(s).latency_us - g.launch.launch_latency_us


def compare_singles(raw: dict, gpu: str) -> list[dict]:
    """Predicted against measured for every single kernel of ``raw`` (the calibration set: reported,
    not part of the chains' MAPE)."""
    rows = []
    for x in raw.get("singles", []):
        try:
            k, n, b, impl = int(x["K"]), int(x["N"]), int(x["batch"]), x["implementation"]
            meas = float(x["measured_us"])
        except (KeyError, TypeError, ValueError):
            raise MksimError(f"a single kernel row lacks K, N, batch, implementation or measured_us: "
                             f"{x!r:.80}") from None
        pred = predict_single(k, n, b, impl, gpu)
        rows.append({"implementation": impl, "batch": b, "K": k, "N": n, "weight_B": 2 * k * n, "measured_us": meas,
                     "predicted_us": pred, "error": pred / meas - 1, "checked": x.get("checked", True)})
    return rows


def check_raw(raw: Any) -> None:
    """Reject a raw file that is not the runner's, in one line."""
    if not isinstance(raw, dict) or not isinstance(raw.get("cases"), list):
        raise MksimError("not a chains raw file (no 'cases' list); give the chains.json `run` wrote")
    need = ("name", "implementation", "mode", "batch", "sequence", "measured_us")
    for i, c in enumerate(raw["cases"]):
        missing = [k for k in need if not isinstance(c, dict) or k not in c]
        if missing:
            raise MksimError(f"case {i}: missing {', '.join(missing)}")
        if c["sequence"] not in C.SEQUENCES:
            raise MksimError(f"case {c['name']}: unknown sequence {c['sequence']!r}; known: {', '.join(C.SEQUENCES)}")


def compare(raw: dict, gpu: str) -> list[dict]:
    """Predicted against measured for every case of ``raw`` that was checked."""
    check_raw(raw)
    rows = []
    memo: dict[tuple, float] = {}
    for c in raw["cases"]:
        key = (c["sequence"], c["batch"], c["mode"], c["implementation"])
        if key not in memo:  # graph_pdl's two triggers share a prediction
            memo[key] = predict_case(c["sequence"], c["batch"], c["mode"], c["implementation"], gpu, c.get("trigger"))
        pred = memo[key]
        rows.append({"name": c["name"], "sequence": c["sequence"], "implementation": c["implementation"],
                     "mode": c["mode"], "trigger": c.get("trigger"), "batch": c["batch"],
                     "n_kernels": c.get("n_kernels"), "checked": c.get("checked", True),
                     "measured_us": c["measured_us"], "predicted_us": pred, "error": pred / c["measured_us"] - 1,
                     "model": MODEL_NOTE[c["implementation"]]})
    return rows


def pdl_signs(rows: list[dict], threshold: float = PDL_THRESHOLD) -> list[dict]:
    """graph + PDL against graph for each mksim chain and trigger: measured and predicted effect,
    whether it counts (|measured| > threshold) and whether the sign is right."""
    graph = {(r["sequence"], r["batch"]): r for r in rows if r["implementation"] == "mksim" and r["mode"] == "graph"}
    out = []
    for r in rows:
        g = graph.get((r["sequence"], r["batch"]))
        if r["implementation"] != "mksim" or r["mode"] != "graph_pdl" or g is None:
            continue
        meas = r["measured_us"] / g["measured_us"] - 1
        pred = r["predicted_us"] / g["predicted_us"] - 1
        counted = abs(meas) > threshold
        out.append({"name": r["name"], "measured_effect": meas, "predicted_effect": pred, "counted": counted,
                    "sign_right": (meas > 0) == (pred > 0) if counted else None})
    return out


def _mape(rs: list[dict]) -> float | None:
    return statistics.mean(abs(r["error"]) for r in rs) if rs else None


def summary(rows: list[dict], signs: list[dict]) -> dict:
    """MAPE over the checked cases, per implementation and per mode; PDL sign counts."""
    ok = [r for r in rows if r["checked"]]
    counted = [s for s in signs if s["counted"]]
    return {"n": len(ok), "n_unchecked": len(rows) - len(ok), "mape": _mape(ok),
            "by_implementation": {i: _mape([r for r in ok if r["implementation"] == i]) for i in C.IMPLEMENTATIONS},
            "by_mode": {m: _mape([r for r in ok if f"{r['mode']}" + (f":{r['trigger']}" if r["trigger"] else "") == m])
                        for m in dict.fromkeys(f"{r['mode']}" + (f":{r['trigger']}" if r["trigger"] else "")
                                               for r in ok)},
            "pdl_sign": {"threshold": PDL_THRESHOLD, "counted": len(counted),
                         "right": sum(1 for s in counted if s["sign_right"])}}


def report(raw: dict, gpu: str) -> dict:
    """Everything ``predict`` prints and writes: rows, PDL signs and the summary."""
    rows = compare(raw, gpu)
    signs = pdl_signs(rows)
    singles = compare_singles(raw, gpu)
    summ = summary(rows, signs)
    summ["singles"] = {i: _mape([r for r in singles if r["implementation"] == i and r["checked"]])
                       for i in C.IMPLEMENTATIONS}
    return {"gpu": gpu, "raw_gpu": raw.get("gpu"), "raw_date": raw.get("date"), "raw_commit": raw.get("commit"),
            "synthetic": bool(raw.get("synthetic", False)), "rows": rows, "pdl": signs, "singles": singles,
            "summary": summ}


def format_report(rep: dict) -> str:
    """The report as a plain-text table."""
    lines = [f"predicted with {rep['gpu']} (every implementation: ideal kernels, no profile yet); measured on "
             f"{rep['raw_gpu']} {rep['raw_date']}" + (" [SYNTHETIC TEST DATA]" if rep["synthetic"] else ""),
             f"{'case':40s} {'measured us':>11s} {'predicted us':>12s} {'error':>7s}"]
    for r in rep["rows"]:
        lines.append(f"{r['name']:40s} {r['measured_us']:11.2f} {r['predicted_us']:12.2f} {r['error']:+7.1%}"
                     + ("" if r["checked"] else "  (not checked: left out)"))
    for p in rep["pdl"]:
        right = "-" if p["sign_right"] is None else ("right" if p["sign_right"] else "WRONG")
        lines.append(f"PDL {p['name']:36s} measured {p['measured_effect']:+7.1%} predicted "
                     f"{p['predicted_effect']:+7.1%}  {right}")
    s = rep["summary"]
    if s["mape"] is not None:
        lines.append(f"MAPE {s['mape']:.1%} over {s['n']} chains; " + ", ".join(
            f"{k} {v:.1%}" for k, v in s["by_implementation"].items() if v is not None))
        lines.append("by mode: " + ", ".join(f"{k} {v:.1%}" for k, v in s["by_mode"].items() if v is not None))
    for r in rep["singles"]:
        lines.append(f"alone {r['implementation']:6s} b{r['batch']} {r['K']:6d} x {r['N']:6d} "
                     f"{r['measured_us']:9.2f} {r['predicted_us']:9.2f} {r['error']:+7.1%}")
    if any(v is not None for v in s["singles"].values()):
        lines.append("single kernels (calibration set, not in the MAPE): " + ", ".join(
            f"{k} {v:.1%}" for k, v in s["singles"].items() if v is not None))
    ps = s["pdl_sign"]
    lines.append(f"PDL sign right in {ps['right']} of {ps['counted']} chains with |measured effect| > "
                 f"{ps['threshold']:.0%}")
    return "\n".join(lines)
