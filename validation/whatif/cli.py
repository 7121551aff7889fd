"""What-if on silicon: the persistent modes on N of the H200's SMs, measured and predicted.

    python -m validation whatif run --out DIR [--only TEXT ...] [--reps 20]   # on the GPU machine
    python -m validation whatif summarize DIR [--out FILE]                     # predictions, MAPE

Each case is one model step (decode, kv_len 1024) in ``megakernel`` or ``persistent_barrier`` mode,
scheduled with the overlay ``h200-mk-kernels-smNNN.toml`` of this folder (``h200-mk-kernels`` with
``chip.sm.count = N``), exactly as the validation suite builds its cases
(:func:`validation.suite.build`: the workload tiled for N SMs, the kernel's options): N queues, so the
generated kernel launches a persistent grid of N blocks, one per SM, on the real 132-SM chip.
``run`` checks every op against torch and times the step (:func:`validation.megakernel.gpu.measure`),
writing ``DIR/measured.json`` (compact) after every case; ``summarize`` predicts the same schedules
with mksim on this machine and writes ``summary.json`` with the MAPE (every ``DIR/measured*.json``: a
case measured in several runs counts with the mean of its runs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from mksim.errors import MksimError
from validation.megakernel.gpu import measure
from validation.suite import Case, build, predicted_us

HERE = Path(__file__).resolve().parent
SMS = (33, 66, 100, 132)
MODES = ("megakernel", "persistent_barrier")
CASES = (("llama-3.2-1b", 1), ("llama-3.1-8b", 1), ("llama-3.2-1b", 4), ("llama-3.1-8b", 4))  # measured in this order
MEASURED, SUMMARY = "measured.json", "summary.json"
TOLERANCE = 1e-2  # bf16 outputs against torch, as the suite


def overlay(n: int) -> Path:
    """The hardware overlay for ``n`` SMs (a path: the loader resolves it as a file)."""
    return HERE / f"h200-mk-kernels-sm{n:03d}.toml"


def case_name(model: str, batch: int, mode: str, sms: int) -> str:
    return f"{model}/b{batch}/{mode}/sm{sms}"


def cases(only: list[str] | None = None) -> list[tuple[str, int, str, int]]:
    """(model, batch, mode, SMs) of every case, in order; ``only``: names containing one of these."""
    out = [(m, b, mode, n) for m, b in CASES for mode in MODES for n in SMS]
    return [c for c in out if not only or any(s in case_name(*c) for s in only)]


def schedule(model: str, batch: int, mode: str, sms: int):
    return build(Case(model, batch, mode), gpu=str(overlay(sms)))


def run(out: Path, only: list[str] | None = None, reps: int = 20) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for model, batch, mode, sms in cases(only):
        name = case_name(model, batch, mode, sms)
        row: dict[str, Any] = {"name": name, "model": model, "batch": batch, "mode": mode, "sms": sms}
        t0 = time.monotonic()
        try:
            s = schedule(model, batch, mode, sms)
            row["queues"] = len(s.queues)
            r = measure(s, reps=reps, single_ops=False)
            row.update({k: r[k] for k in ("measured_us", "measured_spread_us", "times_us", "max_rel_err",
                                           "worst_op", "e2e_rel_err", "bytes_moved", "GBps", "kernel", "trace")})
            row["correct"] = bool(r["max_rel_err"] <= TOLERANCE)
            try:  # simpy may be missing on the GPU machine: summarize predicts anyway
                row["predicted_us_device"] = predicted_us(s)
            except ImportError:
                pass
        except MksimError as exc:
            row["error"] = str(exc).splitlines()[0]
        row["elapsed_s"] = round(time.monotonic() - t0, 1)
        rows.append(row)
        (out / MEASURED).write_text(json.dumps(rows, separators=(",", ":")) + "\n")
        if "error" in row:
            print(f"{name:44s} error: {row['error']}", flush=True)
        else:
            print(f"{name:44s} blocks {row['kernel']['blocks']:3d} measured {row['measured_us']:8.1f} us "
                  f"(spread {row['measured_spread_us']:.1f}) max rel err {row['max_rel_err']:.1e} "
                  f"{row['elapsed_s']:.0f} s", flush=True)
    return rows


def summarize(runs: list[list[dict]]) -> dict:
    """Every case measured correctly in at least one run, predicted on this machine: the mean of its
    runs against the prediction, and the MAPE (overall, per SM count)."""
    seen: dict[str, list[dict]] = {}
    for rows in runs:
        for r in rows:
            if not r.get("error") and r.get("correct"):
                seen.setdefault(r["name"], []).append(r)
    out = []
    order = [case_name(*c) for c in cases()]
    for name in sorted(seen, key=lambda n: order.index(n) if n in order else len(order)):
        rs = seen[name]
        r = rs[0]
        s = schedule(r["model"], r["batch"], r["mode"], r["sms"])
        blocks = {x["kernel"]["blocks"] for x in rs}
        if blocks != {len(s.queues)}:
            raise MksimError(f"{name}: {len(s.queues)} queues predicted but {sorted(blocks)} blocks ran")
        pred = predicted_us(s)
        meas = [x["measured_us"] for x in rs]
        mean = sum(meas) / len(meas)
        out.append({"name": name, "model": r["model"], "batch": r["batch"], "mode": r["mode"], "sms": r["sms"],
                    "hardware": overlay(r["sms"]).stem, "predicted_us": round(pred, 1), "measured_us": round(mean, 1),
                    "measured_runs_us": [round(m, 1) for m in meas],
                    "error_pct": round(100 * (pred / mean - 1), 2)})

    def mape(sel: list[dict]) -> float | None:
        return round(sum(abs(c["error_pct"]) for c in sel) / len(sel), 2) if sel else None

    return {"what": "what-if on silicon: persistent modes on N SMs of the H200, predicted with "
                    "h200-mk-kernels and chip.sm.count = N", "target_mape_pct": 10.0, "runs": len(runs),
            "cases": out, "mape_pct": mape(out),
            "mape_pct_by_sms": {str(n): mape([c for c in out if c["sms"] == n]) for n in SMS},
            "mape_pct_by_mode": {m: mape([c for c in out if c["mode"] == m]) for m in MODES},
            "mean_error_pct": round(sum(c["error_pct"] for c in out) / len(out), 2) if out else None,
            "matmul_task_lines": matmul_task_lines(runs)}


def matmul_task_lines(runs: list[list[dict]]) -> list[dict]:
    """Per model, batch and mode, the line ``compute_us = fixed_us + bytes / GBps`` through the mean
    matmul task of each SM count (from the kernel's trace; least squares over the runs' points): what
    a matmul task costs in the generated kernel as its size changes with N (the tasks of N SMs are
    132 / N times those of 132).

    >>> r = lambda n, us: {"model": "m", "batch": 1, "mode": "x", "correct": True,
    ...                    "trace": {"kinds": {"matmul": {"compute_us": us, "GBps_per_sm": 1e-3 * 1e6 / n / us}}}}
    >>> matmul_task_lines([[r(33, 2 + 1e6 / 33 / 1e3), r(132, 2 + 1e6 / 132 / 1e3)]])[0]["fixed_us"]
    2.0
    """
    pts: dict[tuple, list[tuple[float, float]]] = {}
    for rows in runs:
        for r in rows:
            if r.get("error") or not r.get("correct"):
                continue
            m = r["trace"]["kinds"]["matmul"]
            pts.setdefault((r["model"], r["batch"], r["mode"]), []).append(
                (m["GBps_per_sm"] * m["compute_us"] * 1e3, m["compute_us"]))  # (bytes, us)
    out = []
    for (model, batch, mode), xy in pts.items():
        if len({round(b) for b, _ in xy}) < 2:
            continue
        n = len(xy)
        mb, mu = sum(b for b, _ in xy) / n, sum(u for _, u in xy) / n
        slope = sum((b - mb) * (u - mu) for b, u in xy) / sum((b - mb) ** 2 for b, _ in xy)  # us per byte
        out.append({"model": model, "batch": batch, "mode": mode, "points": n,
                    "fixed_us": round(mu - slope * mb, 2), "GBps": round(1e-3 / slope, 1)})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m validation whatif", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--only", nargs="*")
    r.add_argument("--reps", type=int, default=20)
    s = sub.add_parser("summarize")
    s.add_argument("dir", type=Path)
    s.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "run":
            rows = run(a.out, a.only, a.reps)
            sys.exit(0 if rows and all("error" not in x and x["correct"] for x in rows) else 1)
        files = sorted(a.dir.glob("measured*.json"))
        if not files:
            raise MksimError(f"{a.dir}: no measured*.json (write them with: python -m validation whatif run)")
        summary = summarize([json.loads(f.read_text()) for f in files])
        (a.out or a.dir / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
        for c in summary["cases"]:
            print(f"{c['name']:44s} predicted {c['predicted_us']:8.1f} measured {c['measured_us']:8.1f} "
                  f"{c['error_pct']:+6.1f} %")
        print(f"MAPE {summary['mape_pct']} % over {len(summary['cases'])} cases ({summary['runs']} runs); "
              f"by SMs {summary['mape_pct_by_sms']}; by mode {summary['mape_pct_by_mode']}; "
              f"mean signed {summary['mean_error_pct']} %")
    except (MksimError, OSError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)

