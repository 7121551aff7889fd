"""Sweep the megakernel's L2 prefetcher: its lead (``l2_prefetch_KiB``) × the instruction that asks
L2 (``MK_L2PF_KIND``), on the suite's searched schedules, in one process; every variant's ops are
checked against torch and the step timed (:func:`validation.megakernel.gpu.measure`), beside the
simulator's prediction of the same schedule.

Run (on the GPU machine, from the repository root)::

    python -m validation megakernel-l2 [--models llama-3.2-1b,llama-3.1-8b] [--leads 0,256,512,1024,2048]
        [--kinds bulk,line] [--reps 20] [--json OUT]

Kinds (:data:`KINDS`): ``bulk`` (``cp.async.bulk.prefetch.L2``, one lane per 16 KiB), ``line``
(``prefetch.global.L2`` by the warp's lanes, one per 128-byte line), ``line_last`` (the same with
``.L2::evict_last``), ``line32`` (``prefetch.global.L2`` every 32 bytes, in case a prefetch brings
one sector). Lead 0 (the prefetcher off) runs once per model before the others and once after
them, so that the drift of the machine shows.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import mksim
from mksim.errors import MksimError
from mksim.schedule import Schedule

from .gpu import measure

HERE = Path(__file__).resolve().parent
SCHEDULES = HERE.parent / "schedules"   # the suite's searched schedules (validation/suite/schedules.py)
KINDS = {"bulk": "-DMK_L2PF_KIND=0", "line": "-DMK_L2PF_KIND=1", "line_last": "-DMK_L2PF_KIND=2",
         "line32": "-DMK_L2PF_KIND=1 -DMK_L2PF_LINE_B=32"}


def schedule_with_lead(model: str, batch: int, lead_KiB: float) -> Schedule:
    """The suite's searched schedule of ``model`` at ``batch`` with the prefetcher's lead set."""
    d = json.loads((SCHEDULES / f"{model}-b{batch}.json").read_text())
    d["options"] = {**d["options"], "l2_prefetch_KiB": float(lead_KiB)}
    return Schedule.from_json(json.dumps(d))


def predicted_us(s: Schedule) -> float:
    """The simulated step as CUDA events see it (launch latency left out, as the suite predicts)."""
    return mksim.simulate(s, timeline=False).latency_us - s.gpu.launch.launch_latency_us


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation megakernel-l2", description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama-3.2-1b,llama-3.1-8b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--leads", default="0,256,512,1024,2048", help="KiB per SM, comma-separated (0: off)")
    ap.add_argument("--kinds", default="bulk,line", help=f"comma-separated, of {', '.join(KINDS)}")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    leads = [float(x) for x in a.leads.split(",")]
    kinds = a.kinds.split(",")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        ap.error(f"unknown kind {bad[0]!r}; give some of {', '.join(KINDS)}")
    base_defines = os.environ.get("MKSIM_KERNEL_DEFINES", "")
    variants = [(0.0, "off")] if 0.0 in leads else []
    variants += [(lead, k) for k in kinds for lead in leads if lead > 0]
    variants += [(0.0, "off again")] if 0.0 in leads else []
    rows: list[dict] = []
    for model in a.models.split(","):
        for lead, kind in variants:
            # lead 0: the prefetcher's warp returns at once; built as the first kind, one compile less
            defines = KINDS.get(kind, KINDS[kinds[0]])
            os.environ["MKSIM_KERNEL_DEFINES"] = " ".join(filter(None, [base_defines, defines]))
            row: dict = {"model": model, "batch": a.batch, "lead_KiB": lead, "kind": kind,
                         "defines": os.environ["MKSIM_KERNEL_DEFINES"]}
            try:
                s = schedule_with_lead(model, a.batch, lead)
                row["predicted_us"] = predicted_us(s)
                r = measure(s, reps=a.reps, single_ops=False)
                row.update({k: r[k] for k in ("measured_us", "measured_spread_us", "times_us", "max_rel_err",
                                              "worst_op", "ok", "GBps", "trace")})
                print(f"{model} b{a.batch} {kind:9s} lead {lead:6.0f} KiB: measured {r['measured_us']:8.1f} us "
                      f"(p10-p90 {r['measured_spread_us']:.1f}), predicted {row['predicted_us']:8.1f} us, "
                      f"{'ok' if r['ok'] else 'WRONG'} (max rel err {r['max_rel_err']:.1e}, {r['worst_op']})",
                      flush=True)
            except (MksimError, OSError, RuntimeError) as exc:
                row["error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                print(f"{model} b{a.batch} {kind:9s} lead {lead:6.0f} KiB: error: {row['error']}", flush=True)
            rows.append(row)
            if a.json:
                Path(a.json).write_text(json.dumps(rows, indent=1))
    os.environ["MKSIM_KERNEL_DEFINES"] = base_defines
    print("\nmeasured us (predicted us), lead KiB x kind:")
    for model in a.models.split(","):
        got = {(r["lead_KiB"], r["kind"]): r for r in rows if r["model"] == model}
        off = [got[k] for k in ((0.0, "off"), (0.0, "off again")) if k in got and "measured_us" in got[k]]
        print(f"{model} b{a.batch}: off " + ", ".join(f"{r['measured_us']:.1f}" for r in off)
              + (f" ({off[0]['predicted_us']:.1f})" if off else ""))
        for lead in (x for x in leads if x > 0):
            cells = []
            for k in kinds:
                r = got.get((lead, k), {})
                cells.append(f"{k} {r['measured_us']:.1f}" if "measured_us" in r else f"{k} -")
            pred = next((r["predicted_us"] for (ld, _k), r in got.items() if ld == lead and "predicted_us" in r), None)
            print(f"  {lead:6.0f} KiB: " + ", ".join(cells) + (f" ({pred:.1f})" if pred is not None else ""))
    return 0 if all("error" not in r and r.get("ok") for r in rows) else 1

