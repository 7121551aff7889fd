"""Predict the measured chains with mksim (CPU): per case predicted vs measured, MAPE, PDL's sign.

Each case's workload and schedule are rebuilt as the runner built them (:mod:`.cases`: mksim's
kernels with the tiling and queues the runner ran, on :data:`.cases.GPU`) and simulated on the
hardware model asked for with the implementation's profile (:data:`PROFILES`: ``mksim-mm1`` for
mksim's generated kernels of the commit the committed chains ran, ``cublas`` for torch's F.linear,
where ``hwmodels/profiles/<name>.toml`` exists; ``--no-profiles``: ideal kernels for both, said per
row). graph_pdl gets the case's trigger (``pdl_trigger``). The prediction is the simulated latency
less the launch latency before the first kernel (CUDA events see GPU time:
``validation.suite.predicted_us``).

PDL's sign: for each mksim chain (sequence, batch) and trigger, the measured effect of graph + PDL
against graph (``pdl / graph - 1``) and the predicted one; counted where the measured effect
exceeds :data:`PDL_THRESHOLD` in size, right where both have the same sign.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import hwmodels
import mksim
from mksim.errors import MksimError

from . import calibrate as K
from . import cases as C

PDL_THRESHOLD = 0.03
# implementation -> hwmodels/profiles/<name>.toml; the committed chains ran mksim's kernels of
# commit 5a201e2 (MK_MM=1), whose profile is mksim-mm1
PROFILES = {"mksim": "mksim-mm1", "cublas": "cublas"}


def model_for(implementation: str, gpu: str, profiles: bool = True) -> tuple[str, str]:
    """The hardware model (``gpu+profile``) ``implementation`` is predicted with, and what it is
    of: its profile where one exists, else ideal kernels (the best the chip allows)."""
    if implementation not in C.IMPLEMENTATIONS:
        raise MksimError(f"unknown implementation {implementation!r}; give one of {', '.join(C.IMPLEMENTATIONS)}")
    prof = PROFILES[implementation]
    if "+" in gpu:
        return gpu, f"the profile given in {gpu}"
    if profiles and prof in hwmodels.profiles():
        return f"{gpu}+{prof}", f"profile {prof} (hwmodels/profiles/{prof}.toml)"
    return gpu, "ideal kernels (no implementation profile)"


def predict_case(sequence: str, batch: int, mode: str, implementation: str, gpu: str,
                 trigger: str | None = None, profiles: bool = True) -> float:
    """Predicted µs of one chain with :func:`model_for`'s hardware model. mksim's kernels run the
    schedule the runner built (:func:`.cases.build_schedule` on :data:`.cases.GPU`: its tiling and
    megakernel queues), simulated on the model; cuBLAS's chains with the mode's default options.
    graph_pdl: ``trigger`` (default early) is the schedule's ``pdl_trigger``."""
    name, _ = model_for(implementation, gpu, profiles)
    g = hwmodels.load(name)
    wl = C.chain_workload(sequence, batch)
    opts = {"pdl_trigger": trigger or "early"} if mode == "graph_pdl" else {}
    if implementation == "mksim":
        s = C.build_schedule(wl, mode, C.GPU, **opts)
        s = dataclasses.replace(s, gpu=g)
    else:
        s = mksim.build_schedule(wl, g, mode, **opts)
    return mksim.simulate(s, timeline=False).latency_us - g.launch.launch_latency_us


def predict_single(k: int, n: int, batch: int, implementation: str, gpu: str, profiles: bool = True) -> float:
    """Predicted GPU µs of one ``K x N`` kernel alone (a graph of one op, less the launch latency),
    with the same implementation switch as :func:`predict_case`."""
    name, _ = model_for(implementation, gpu, profiles)
    g = hwmodels.load(name)
    wl = C.chain_workload(C.Sequence("single", "llama-3.2-1b", ((k, n),)), batch)
    if implementation == "mksim":
        s = dataclasses.replace(C.build_schedule(wl, "graph", C.GPU), gpu=g)
    else:
        s = mksim.build_schedule(wl, g, "graph")
    return mksim.simulate(s, timeline=False).latency_us - g.launch.launch_latency_us


def compare_singles(raw: dict, gpu: str, profiles: bool = True) -> list[dict]:
    """Predicted against measured GPU-only time for every single kernel of ``raw`` that has one
    (:func:`.calibrate.gpu_singles`; the calibration set: reported, not part of the chains' MAPE).
    The first run's mksim singles have none (timed between events with the host's launch)."""
    for x in raw.get("singles", []):
        if not isinstance(x, dict) or any(k not in x for k in ("K", "N", "batch", "implementation")):
            raise MksimError(f"a single kernel row lacks K, N, batch or implementation: {x!r:.80}")
    rows = []
    for x in K.gpu_singles(raw):
        k, n, b, impl = x["K"], x["N"], x["batch"], x["implementation"]
        pred = predict_single(k, n, b, impl, gpu, profiles)
        rows.append({"implementation": impl, "batch": b, "K": k, "N": n, "weight_B": 2 * k * n, "measured_us": x["us"],
                     "source": x["source"], "predicted_us": pred, "error": pred / x["us"] - 1, "checked": True})
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


def compare(raw: dict, gpu: str, profiles: bool = True) -> list[dict]:
    """Predicted against measured for every case of ``raw`` (``checked``: the chain's outputs were
    right; the MAPE counts only those)."""
    check_raw(raw)
    rows = []
    for c in raw["cases"]:
        pred = predict_case(c["sequence"], c["batch"], c["mode"], c["implementation"], gpu, c.get("trigger"), profiles)
        model, about = model_for(c["implementation"], gpu, profiles)
        rows.append({"name": c["name"], "sequence": c["sequence"], "implementation": c["implementation"],
                     "mode": c["mode"], "trigger": c.get("trigger"), "batch": c["batch"],
                     "n_kernels": c.get("n_kernels"), "checked": c.get("checked", True),
                     "measured_us": c["measured_us"], "predicted_us": pred, "error": pred / c["measured_us"] - 1,
                     "gpu": model, "model": about})
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


def _mode(r: dict) -> str:
    """A row's mode with graph_pdl's trigger (``graph_pdl:late``)."""
    return r["mode"] + (f":{r['trigger']}" if r.get("trigger") else "")


def _mape(rs: list[dict]) -> float | None:
    return statistics.mean(abs(r["error"]) for r in rs) if rs else None


def summary(rows: list[dict], signs: list[dict]) -> dict:
    """MAPE over the checked cases, per implementation and per mode; PDL sign counts."""
    ok = [r for r in rows if r["checked"]]
    counted = [s for s in signs if s["counted"]]
    return {"n": len(ok), "n_unchecked": len(rows) - len(ok), "mape": _mape(ok),
            "by_implementation": {i: _mape([r for r in ok if r["implementation"] == i]) for i in C.IMPLEMENTATIONS},
            "by_mode": {m: _mape([r for r in ok if _mode(r) == m]) for m in dict.fromkeys(_mode(r) for r in ok)},
            "pdl_sign": {"threshold": PDL_THRESHOLD, "counted": len(counted),
                         "right": sum(1 for s in counted if s["sign_right"])}}


def report(raw: dict, gpu: str, profiles: bool = True) -> dict:
    """Everything ``predict`` prints and writes: rows, PDL signs and the summary."""
    rows = compare(raw, gpu, profiles)
    signs = pdl_signs(rows)
    singles = compare_singles(raw, gpu, profiles)
    summ = summary(rows, signs)
    summ["singles"] = {i: _mape([r for r in singles if r["implementation"] == i and r["checked"]])
                       for i in C.IMPLEMENTATIONS}
    return {"gpu": gpu, "models": {i: model_for(i, gpu, profiles)[0] for i in C.IMPLEMENTATIONS},
            "raw_gpu": raw.get("gpu"), "raw_date": raw.get("date"), "raw_commit": raw.get("commit"),
            "synthetic": bool(raw.get("synthetic", False)), "rows": rows, "pdl": signs, "singles": singles,
            "summary": summ}


def format_report(rep: dict) -> str:
    """The report as a plain-text table."""
    lines = [f"predicted with {', '.join(f'{i}: {m}' for i, m in rep['models'].items())}; measured on "
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


def _pct(x: float | None) -> float | None:
    return None if x is None else round(100 * x, 2)


def summary_json(rep: dict, raw_path: str) -> dict:
    """The issue's ``summary.json``: every checked chain (name, implementation, mode, trigger,
    batch, predicted and measured µs, the hardware model and profile it was predicted with), MAPE
    in % overall, per implementation, per mode and per implementation and mode, and PDL's sign
    (right of counted chains)."""
    ok = [r for r in rep["rows"] if r["checked"]]
    s = rep["summary"]
    combos = dict.fromkeys(f"{r['implementation']}/{_mode(r)}" for r in ok)
    return {
        "what": "held-out chains of LLM projections on the H200: mksim's generated kernels and cuBLAS "
                "(torch F.linear), predicted by mksim; the profiles were fitted to single kernels, never to chains",
        "raw": raw_path, "raw_gpu": rep["raw_gpu"], "raw_date": rep["raw_date"], "raw_commit": rep["raw_commit"],
        "synthetic": rep["synthetic"], "models": rep["models"],
        "command": f"python -m validation chains predict {raw_path} --gpu {rep['gpu']} --summary <this file>",
        "cases": [{"name": r["name"], "implementation": r["implementation"], "mode": r["mode"], "trigger": r["trigger"],
                   "batch": r["batch"], "predicted_us": round(r["predicted_us"], 3),
                   "measured_us": round(r["measured_us"], 3), "error_pct": round(100 * r["error"], 2),
                   "gpu": r["gpu"], "model": r["model"]} for r in ok],
        "n": s["n"], "n_unchecked": s["n_unchecked"], "mape_pct": _pct(s["mape"]),
        "by_implementation": {k: _pct(v) for k, v in s["by_implementation"].items()},
        "by_mode": {k: _pct(v) for k, v in s["by_mode"].items()},
        "by_implementation_mode": {k: _pct(_mape([r for r in ok if f"{r['implementation']}/{_mode(r)}" == k]))
                                   for k in combos},
        "pdl_sign": {"right": s["pdl_sign"]["right"], "of": s["pdl_sign"]["counted"],
                     "threshold_pct": 100 * s["pdl_sign"]["threshold"],
                     "chains": [{"name": p["name"], "measured_effect_pct": round(100 * p["measured_effect"], 2),
                                 "predicted_effect_pct": round(100 * p["predicted_effect"], 2),
                                 "counted": p["counted"], "sign_right": p["sign_right"]} for p in rep["pdl"]]},
        "singles_mape_pct": {k: _pct(v) for k, v in s["singles"].items()},
    }
