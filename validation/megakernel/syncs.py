"""The megakernel's syncs on the GPU: counter, flag and sentinel, each checked, timed and predicted.

Run on a machine with an NVIDIA GPU::

    python3 -m validation megakernel-syncs run --out DIR [--timeout 150] [--quick] [--reps 20]

Cases (:data:`CASES`): llama-3.2-1b at batch 1 and 4 and llama-3.1-8b at batch 1, the default
megakernel schedule with each sync of :data:`SYNCS` (``--quick``: llama-3.2-1b batch 1, counter and
sentinel, 5 timed runs). Every case is checked against torch first (``gpu.measure``: every op's
output, and with ``sentinel`` once more on the output set the kernel itself reset), then timed.
``DIR/syncs.json`` is rewritten after every case: one row per case with the measured and
predicted µs, the check's errors and the per-kind wait times of the trace; a case that fails
records its error in one line and the others go on. Cases not begun by ``--timeout`` seconds are
recorded as skipped (a case's kernels give up their own waits after 2 s; ``--watchdog-s`` bounds a
kernel from the host).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mksim
from mksim.errors import MksimError

from .gpu import measure as gpu_measure
from .program import check_supported, kernel_options

GPU = "h200-mk-kernels"  # the suite's hardware model: the calibrated H200 and our device functions' costs
KV_LEN = 1024
SYNCS: tuple[str, ...] = ("counter", "sentinel", "flag")
CASES: tuple[tuple[str, int], ...] = (("llama-3.2-1b", 1), ("llama-3.2-1b", 4), ("llama-3.1-8b", 1))
QUICK_CASES: tuple[tuple[str, int], ...] = (("llama-3.2-1b", 1),)
QUICK_SYNCS, QUICK_REPS = ("counter", "sentinel"), 5
FORMAT = "mksim-megakernel-syncs"


def build(model: str, batch: int, sync: str, gpu: str = GPU):
    """The default megakernel schedule of ``model`` at ``batch`` with ``sync``, as the kernel runs it."""
    wl = mksim.models.workload(model, batch=batch, kv_len=KV_LEN)
    s = mksim.build_schedule(wl, gpu, "megakernel", sync=sync, **kernel_options(model, batch, KV_LEN, gpu))
    check_supported(s)
    return s


def row_of(model: str, batch: int, sync: str, predicted_us: float, r: dict) -> dict:
    """One case's row of ``syncs.json`` from what ``gpu.measure`` returned."""
    kinds = r.get("trace", {}).get("kinds", {})
    return {"model": model, "batch": batch, "sync": sync, "predicted_us": predicted_us,
            "measured_us": r["measured_us"], "measured_spread_us": r["measured_spread_us"],
            "error_pct": 100 * (predicted_us - r["measured_us"]) / r["measured_us"], "GBps": r["GBps"],
            "ok": bool(r["ok"]), "max_rel_err": r["max_rel_err"], "worst_op": r["worst_op"],
            "recycled_max_rel_err": r.get("recycled_max_rel_err"),
            "wait_us": {k: v["wait_us"] for k, v in kinds.items()},
            "span_us": r.get("trace", {}).get("span_us"), "kernel": r.get("kernel", {}), "error": None}


def run(out_dir: Path | str, *, timeout_s: float = 150.0, quick: bool = False, reps: int = 20,
        watchdog_s: float = 10.0, measure: Callable[..., dict] | None = None,
        say: Callable[[str], None] = print) -> dict:
    """Run the cases (see the module's documentation) and write ``out_dir/syncs.json``; returns it.
    ``measure``: :func:`validation.megakernel.gpu.measure` unless given (tests pass a fake one)."""
    measure = measure or gpu_measure
    cases, syncs = CASES, SYNCS
    if quick:
        cases, syncs, reps = QUICK_CASES, QUICK_SYNCS, QUICK_REPS
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict = {"format": FORMAT, "gpu_model": GPU, "kv_len": KV_LEN, "reps": reps, "quick": quick, "rows": []}
    t_end = time.monotonic() + timeout_s
    for model, batch in cases:
        for sync in syncs:
            row: dict = {"model": model, "batch": batch, "sync": sync, "error": None}
            if time.monotonic() > t_end:
                row["error"] = f"skipped: {timeout_s:g} s were up"
            else:
                t0 = time.monotonic()
                try:
                    s = build(model, batch, sync)
                    pred = mksim.simulate(s, timeline=False).latency_us - s.gpu.launch.launch_latency_us
                    row = row_of(model, batch, sync, pred, measure(s, reps=reps, watchdog_s=watchdog_s))
                except Exception as exc:  # noqa: BLE001 - a failing case is one line; the others go on
                    text = str(exc).splitlines()[0] if str(exc) else ""
                    row["error"] = text if isinstance(exc, MksimError) else f"{type(exc).__name__}: {text}"
                row["wall_s"] = time.monotonic() - t0
            doc["rows"].append(row)
            (out / "syncs.json").write_text(json.dumps(doc, indent=1) + "\n")
            say(line(row))
    doc["comparison"] = compare(doc["rows"])
    (out / "syncs.json").write_text(json.dumps(doc, indent=1) + "\n")
    for c in doc["comparison"]:
        say(f"{c['model']} b{c['batch']}: " + ", ".join(f"{k} {v:+.1f} us" for k, v in c["vs_counter_us"].items())
            + " against counter")
    return doc


def line(row: dict) -> str:
    """A case in one line of progress."""
    head = f"{row['model']} b{row['batch']} {row['sync']:8s}"
    if row["error"]:
        return f"{head} error: {row['error']}"
    rec = row["recycled_max_rel_err"]
    return (f"{head} measured {row['measured_us']:8.1f} us (p10-p90 {row['measured_spread_us']:.1f}), predicted "
            f"{row['predicted_us']:8.1f} us ({row['error_pct']:+.1f} %), {row['GBps']:.0f} GB/s, max rel err "
            f"{row['max_rel_err']:.1e}" + (f", recycled {rec:.1e}" if rec is not None else "")
            + ("" if row["ok"] else " NOT OK") + f" [{row['wall_s']:.0f} s]")


def compare(rows: list[dict]) -> list[dict]:
    """Per model and batch, each checked sync's measured µs less the counter's."""
    out = []
    keys = sorted({(r["model"], r["batch"]) for r in rows}, key=lambda k: [(r["model"], r["batch"]) for r in rows]
                  .index(k))
    for model, batch in keys:
        got = {r["sync"]: r["measured_us"] for r in rows
               if (r["model"], r["batch"]) == (model, batch) and not r["error"] and r["ok"]}
        if "counter" in got:
            out.append({"model": model, "batch": batch, "measured_us": got,
                        "vs_counter_us": {k: v - got["counter"] for k, v in got.items() if k != "counter"}})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m validation megakernel-syncs", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the cases on this machine's GPU")
    r.add_argument("--out", required=True)
    r.add_argument("--timeout", type=float, default=150.0, help="begin no case after this many seconds")
    r.add_argument("--quick", action="store_true", help="llama-3.2-1b b1, counter and sentinel, 5 runs (~30 s)")
    r.add_argument("--reps", type=int, default=20)
    r.add_argument("--watchdog-s", type=float, default=10.0)
    a = ap.parse_args(argv)
    if a.timeout <= 0 or a.reps < 1 or a.watchdog_s <= 0:
        print("error: --timeout and --watchdog-s must be > 0 and --reps >= 1", file=sys.stderr)
        sys.exit(2)
    doc = run(a.out, timeout_s=a.timeout, quick=a.quick, reps=a.reps, watchdog_s=a.watchdog_s,
              say=lambda m: print(m, flush=True))
    ok = [r for r in doc["rows"] if not r["error"] and r["ok"]]
    print(f"{len(ok)} of {len(doc['rows'])} cases checked and timed; median wall "
          f"{statistics.median([r.get('wall_s', 0) for r in doc['rows']]):.0f} s", flush=True)
    sys.exit(0 if len(ok) == len(doc["rows"]) else 1)

