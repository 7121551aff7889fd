"""Check and time one model's decode step in several modes: a quick look on the GPU.

Run: python -m validation megakernel [--model llama-3.2-1b] [--batch 1] [--modes megakernel,graph]
[--json OUT] [--reps 20] [--pdl-trigger early|late] [--opt sync=sentinel]. The standard suite and its
report are ``mksim validate``. Every mode's schedule is built and checked before any GPU work: one the
generated kernels cannot run as predicted (dynamic dispatch, dies, native movement, an unknown sync,
...) is refused in one line (``error: ...``, exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields

import mksim
from mksim.console import parse_options
from mksim.errors import MksimError
from mksim.schedule import Options
from mksim.workload import Build

from .gpu import kernel_options, measure
from .program import check_supported

# the options of build_llm_workload a quick look may set (the rest are its own arguments)
_FIXED = ("cfg", "batch", "kv_len", "phase", "prefill_tokens", "weight_dtype", "n_sms")


def workload_option(key: str, text: str) -> int | float | bool:
    """``--wl KEY=VALUE`` as the keyword argument of :func:`mksim.workload.build_llm_workload`,
    typed by the argument's default: 0|1 for a flag, a number otherwise.

    >>> workload_option("fuse_norm", "1"), workload_option("kv_splits", "16")
    (True, 16)
    """
    params = {f.name: f.default for f in fields(Build)}  # the build choices (the step's are flags of their own)
    known = [n for n in params if n not in _FIXED]
    if key not in known:
        raise ValueError(f"unknown workload option {key!r}; give one of {', '.join(known)}")
    default = params[key]
    try:
        if isinstance(default, bool):
            if text not in ("0", "1"):
                raise ValueError
            return text == "1"
        return float(text) if isinstance(default, float) else int(text)
    except ValueError:
        kind = "0 or 1" if isinstance(default, bool) else "a number"
        raise ValueError(f"{key} takes {kind}, not {text!r}") from None


def case_schedule(model: str, batch: int, kv_len: int, gpu: str, mode: str, wl_opts: dict, opts: dict):
    """The schedule a quick look (or an A/B plan's case) runs: ``model`` at ``batch`` in ``mode``
    with the workload options ``wl_opts`` (:func:`workload_option` values) and the schedule
    options ``opts`` over the kernel's needs (:func:`kernel_options`), checked against what the
    generated kernels run (:func:`check_supported`). Raises :class:`MksimError` in one line."""
    base = kernel_options(model, batch, kv_len, gpu)
    Options.checked(opts)  # names and types, in one line
    base.update(opts)
    wl = mksim.models.workload(model, batch=batch, kv_len=kv_len, **wl_opts)
    s = mksim.build_schedule(wl, gpu, mode, **base)
    check_supported(s)
    return s


def measure_row(s, *, reps: int, single_ops: bool = False, raw_trace: str | None = None,
                pdl_trigger: str = "early") -> dict:
    """Check and time schedule ``s`` (:func:`validation.megakernel.gpu.measure`), with its
    prediction (without the launch latency, as it is compared): the row ``--json`` keeps."""
    pred = mksim.simulate(s, timeline=False).latency_us - s.gpu.launch.launch_latency_us
    r = measure(s, reps=reps, single_ops=single_ops, raw_trace=raw_trace, pdl_trigger=pdl_trigger)
    r["predicted_us"] = pred
    return r


def row_lines(mode: str, r: dict) -> list[str]:
    """What the quick look prints of a measured row: the step, its trace per op kind, single ops."""
    out = [f"{mode:18s} measured {r['measured_us']:9.1f} us (spread {r['measured_spread_us']:.1f}), predicted "
           f"{r['predicted_us']:9.1f} us, {r['GBps']:6.0f} GB/s, max rel err {r['max_rel_err']:.1e} ({r['worst_op']}), "
           f"end to end {r['e2e_rel_err']:.1e}" + (f", kernel-reset set {r['recycled_max_rel_err']:.1e}"
                                                   if r.get("recycled_max_rel_err") is not None else ""),
           f"   trace: span {r['trace']['span_us']:.1f} us; " + "; ".join(
               f"{k} n={v['tasks']} wait {v['wait_us']:.2f} compute {v['compute_us']:.2f} publish {v['publish_us']:.2f}"
               f" ({v['GBps_per_sm']:.0f} GB/s/SM)" for k, v in r["trace"]["kinds"].items())]
    for o in r["single_ops"]:
        out.append(f"   alone: {o['op']:16s} {o['kind']:12s} N={o['N']:6d} K={o['K'] or 0:5d} tiles={o['tiles']:4d} "
                   f"{o['us']:8.2f} us {o['GBps']:6.0f} GB/s")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m validation megakernel", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--kv-len", type=int, default=1024)
    ap.add_argument("--gpu", default="h200-calibrated")
    ap.add_argument("--modes", default="megakernel,persistent_barrier,graph_pdl,graph,stream")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--traces", default=None, help="directory for each mode's raw per-task trace (.npz)")
    ap.add_argument("--single-ops", action="store_true", help="also time each op alone (chain modes)")
    ap.add_argument("--pdl-trigger", choices=("early", "late"), default="early",
                    help="graph_pdl: trigger the next kernel's launch at the kernel's start (early, the default) "
                         "or after its main loop (late)")
    ap.add_argument("--opt", action="append", default=[], help="schedule option KEY=VALUE")
    ap.add_argument("--wl", action="append", default=[],
                    help="workload option KEY=VALUE of mksim.workload.build_llm_workload (kv_splits=16, fuse_norm=1, "
                         "split_qkv=1, ...)")
    a = ap.parse_args(argv)
    try:
        opts = parse_options(a.opt)
        Options.checked(opts)  # names and types, in one line
    except MksimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    wl_opts = {}
    for kv in a.wl:
        k, _, v = kv.partition("=")
        try:
            wl_opts[k] = workload_option(k, v)
        except ValueError as exc:
            ap.error(f"--wl {kv}: {exc}")
    schedules = {}
    for mode in a.modes.split(","):  # every schedule built and checked before any GPU work
        try:
            schedules[mode] = case_schedule(a.model, a.batch, a.kv_len, a.gpu, mode, wl_opts, opts)
        except MksimError as exc:
            print(f"error: {mode}: {exc}", file=sys.stderr)
            sys.exit(2)
    rows = []
    for mode, s in schedules.items():
        try:
            raw = None
            if a.traces:
                os.makedirs(a.traces, exist_ok=True)
                raw = os.path.join(a.traces, f"{a.model}-b{a.batch}-{mode}.npz")
            r = measure_row(s, reps=a.reps, single_ops=a.single_ops, raw_trace=raw, pdl_trigger=a.pdl_trigger)
        except MksimError as exc:
            print(f"{mode}: {exc}", flush=True)
            rows.append({"mode": mode, "error": str(exc)})
            continue
        r.update(mode=mode, model=a.model, batch=a.batch, kv_len=a.kv_len, wl=wl_opts, options=opts,
                 pdl_trigger=a.pdl_trigger)
        rows.append(r)
        print("\n".join(row_lines(mode, r)), flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    sys.exit(0 if all("error" not in r for r in rows) else 1)

