"""The steps a quick look measured, predicted: each row of ``python -m validation megakernel
--json`` files rebuilt as the runner built it (model, batch, mode, its ``--opt`` and ``--wl``
options, the kernel's needs) and simulated on a model, e.g. after ``python -m
validation kernel-costs ... --profile`` refitted one. No GPU needed.

Run: python -m validation megakernel-predict FILE [...] [--gpu h200-calibrated+mksim] [--profile FILE]
[--json OUT].
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import hwmodels
import mksim
from mksim.errors import MksimError

from .program import kernel_options

RUN_GPU = "h200-calibrated"  # the runner's default --gpu: what it asked the kernel's needs of


def predict_rows(rows: list[dict], gpu: str | hwmodels.GPUSpec) -> list[dict]:
    """Each measured row (rows with an ``error`` are left out) with its step predicted on ``gpu``:
    ``{"model", "batch", "mode", "page_KiB", "depth", "measured_us", "predicted_us", "error_pct"}``,
    the prediction without the launch latency, as the runner compares them."""
    out = []
    for r in rows:
        if "error" in r or "measured_us" not in r:
            continue
        model, batch, kv_len = r["model"], int(r["batch"]), int(r.get("kv_len", 1024))
        opts = {**kernel_options(model, batch, kv_len, RUN_GPU), **(r.get("options") or {})}
        wl = mksim.models.workload(model, batch=batch, kv_len=kv_len, **(r.get("wl") or {}))
        s = mksim.build_schedule(wl, gpu, r["mode"], **opts)
        pred = mksim.simulate(s, timeline=False).latency_us - s.gpu.launch.launch_latency_us
        out.append({"model": model, "batch": batch, "mode": r["mode"], "page_KiB": s.options.page_KiB,
                    "depth": s.options.prefetch_depth, "measured_us": r["measured_us"], "predicted_us": pred,
                    "error_pct": 100 * (pred / r["measured_us"] - 1)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation megakernel-predict", description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="--json files of python -m validation megakernel")
    ap.add_argument("--gpu", default="h200-calibrated+mksim", help="the model (default: h200-calibrated+mksim)")
    ap.add_argument("--profile", type=Path, default=None, help="an implementation profile file to apply to --gpu")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    a = ap.parse_args(argv)
    rows: list[dict] = []
    try:
        try:
            gpu = hwmodels.load(a.gpu, profile=str(a.profile) if a.profile else None)
        except hwmodels.HardwareError as exc:
            raise MksimError(str(exc).splitlines()[0]) from None
        for f in a.files:
            try:
                doc = json.loads(f.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise MksimError(f"{f}: cannot read ({exc.__class__.__name__}: {exc})".splitlines()[0]) from None
            if not isinstance(doc, list):
                raise MksimError(f"{f}: expected the list of rows python -m validation megakernel --json writes")
            rows += [{**p, "file": f.name} for p in predict_rows(doc, gpu)]
    except MksimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for p in sorted(rows, key=lambda p: (p["model"], p["batch"], p["mode"], p["page_KiB"], p["depth"])):
        print(f"{p['model']:13s} b{p['batch']:<2d} {p['mode']:18s} {p['page_KiB']:4g} KiB x {p['depth']:<2d} "
              f"measured {p['measured_us']:9.1f} us  predicted {p['predicted_us']:9.1f} us  {p['error_pct']:+6.1f} %")
    if rows:
        print(f"{len(rows)} steps on {gpu.name}: MAPE {np.mean([abs(p['error_pct']) for p in rows]):.1f} %")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0

