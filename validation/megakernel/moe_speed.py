"""The MoE megakernel's expert streaming, old against new, on one H200 in one command (< 7 minutes):

    python -m validation.megakernel.moe_speed OUT [--dry-run]

Builds (:data:`BUILDS`, ``MKSIM_KERNEL_DEFINES``; mk_kernel.cu, above ``mk_expert_stream``):

- ``old``: ``-DMK_MOE_EARLY=0 -DMK_MOE_L2PF_B=0``, the kernel as measured in validation/results/h200-moe:
  an expert task's weight rows stream once the task's own dependencies are met (the down projection's
  after its slot's gate/up);
- ``early``: ``-DMK_MOE_L2PF_B=0`` (the default since its run), every expert task's rows stream as soon
  as its layer's top-k has published the route table;
- ``new``: ``-DMK_MOE_L2PF_B=262144`` (the default when it ran, as no defines), ``early`` and each expert
  task's bytes beyond the ring's first pages asked of L2 (cp.async.bulk.prefetch.L2, up to 256 KiB a task)
  as soon as its expert is known.

Cases (:data:`CASES`, most wanted first): qwen3-30b-a3b and olmoe-1b-7b at batch 1, then 8, the megakernel
with the default policy (``plan``) and ``moe_stride``; at batch 1 also ``plan`` with the norms fused into
the matmuls after them (``plan_fn``: ``fuse_norm=True``, a workload option, no kernel change), old and new.
The builds of a case run one after the other in this process. Each: checked against torch (route tables
exactly), timed (median of 20), its trace's ``moe`` part and, per op of a layer, the mean span and the
gap before it over the layers (:func:`layer_phases`). The kernels are compiled first, every build of
both models at once in child processes (cupy's kernel cache; NVRTC takes ~40 s a build on one core).

Watchdogs: every kernel launch (:data:`WATCHDOG_S`), the compiles (``abcase.COMPILE_S``), and no case begun after
:data:`BUDGET_S`; a hung kernel (the GPU context lost) ends the run. Writes ``OUT/moe_speed.json``
(every record, the device, the commit) and ``OUT/summary.json`` (per model, batch and design: µs per
build, new/old and early/old). ``--dry-run``: plan every case on the CPU and write the same files
without timings (what a test runs).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import hwmodels
import mksim
from mksim import models
from validation import suite as vs
from validation.suite.anatomy import op_trace

from . import abcase, gpu, moe_suite
from . import program as P
from .moe_ops import topk_err

GPU = moe_suite.GPU
KV = moe_suite.KV_LEN
BUDGET_S = 6.5 * 60
WATCHDOG_S = 90.0
REPS = 20
# build name -> extra defines (MKSIM_KERNEL_DEFINES)
BUILDS: dict[str, str] = {"old": "-DMK_MOE_EARLY=0 -DMK_MOE_L2PF_B=0", "early": "-DMK_MOE_L2PF_B=0",
                          "new": "-DMK_MOE_L2PF_B=262144"}
MODELS = ("qwen3-30b-a3b", "olmoe-1b-7b")
# (model, batch, design, builds): design "plan" / "moe_stride" (the megakernel's MoE dispatch), "plan_fn"
# (plan, fuse_norm=True)
CASES: tuple[tuple[str, int, str, tuple[str, ...]], ...] = (
    *((m, 1, d, ("old", "new", "early")) for m in MODELS for d in ("plan", "moe_stride")),
    *((m, 1, "plan_fn", ("old", "new")) for m in MODELS),
    *((m, 8, d, ("old", "new", "early")) for m in MODELS for d in ("plan", "moe_stride")),
)


def workload_options(design: str) -> dict[str, Any]:
    """The workload options a ``plan`` design names beyond the suite's (``fuse_silu``): ``plan`` then any
    of ``_fn`` (``fuse_norm``), ``_red`` (``fuse_reduce``), ``_kvN`` (``kv_splits=N``).

    >>> workload_options("plan_fn_kv16"), workload_options("plan")
    ({'fuse_norm': True, 'kv_splits': 16}, {})
    """
    head, *words = design.split("_")
    if head != "plan":
        raise ValueError(f"not a plan design: {design!r}")
    opts: dict[str, Any] = {}
    for w in words:
        if w[:1] in "pd" and w[1:].isdigit():  # the ring's: schedule_options
            continue
        if w == "fn":
            opts["fuse_norm"] = True
        elif w == "red":
            opts["fuse_reduce"] = True
        elif w.startswith("kv") and w[2:].isdigit():
            opts["kv_splits"] = int(w[2:])
        else:
            raise ValueError(f"design {design!r}: unknown word {w!r}")
    return opts


def schedule_options(design: str) -> dict[str, Any]:
    """The ring a ``plan`` design names beyond the suite's: ``_pN`` (pages of N KiB), ``_dN`` (N of them).

    >>> schedule_options("plan_fn_kv16_p30_d4"), schedule_options("plan_fn")
    ({'page_KiB': 30.0, 'prefetch_depth': 4}, {})
    """
    opts: dict[str, Any] = {}
    for w in design.split("_")[1:]:
        if w[:1] == "p" and w[1:].isdigit():
            opts["page_KiB"] = float(w[1:])
        elif w[:1] == "d" and w[1:].isdigit():
            opts["prefetch_depth"] = int(w[1:])
    return opts


def schedule(model: str, T: int, design: str) -> Any:
    """The case's megakernel schedule: the MoE suite's (``moe_suite.build``: the schedules of
    validation/results/h200-moe) for ``plan`` and ``moe_stride``, or the same policy with the workload
    options of :func:`workload_options` (``plan_fn``: the norms fused) and the ring of
    :func:`schedule_options`."""
    if design in ("plan", "moe_stride"):
        return moe_suite.build(model, T, f"megakernel:{design}")
    g = hwmodels.load(moe_suite.GPU)
    opts = vs.kernel_options(model, T, KV, moe_suite.GPU, "megakernel") | schedule_options(design)
    wl = models.workload(models.get(model), batch=T, kv_len=KV, n_sms=g.sm.count, fuse_silu=True,
                         **workload_options(design))
    return mksim.build_schedule(wl, g, "megakernel", **opts)


def layer_phases(ops: dict[str, dict]) -> dict[str, dict]:
    """Per op of a layer (its name without ``L<n>.``), over the layers: the mean span (first task's
    start to last task's end, µs), the mean gap from the op before it in the step's order to its start
    (negative: it began before that one ended), and how many layers. ``ops``: an op trace's ``ops``
    (:func:`validation.suite.anatomy.op_trace`), in the step's order.

    >>> ops = {"L0.a": {"start_us": 0.0, "end_us": 2.0}, "L0.b": {"start_us": 3.0, "end_us": 7.0},
    ...        "L1.a": {"start_us": 8.0, "end_us": 9.0}, "L1.b": {"start_us": 9.5, "end_us": 13.5}}
    >>> layer_phases(ops)["b"]
    {'span_us': 4.0, 'gap_us': 0.75, 'layers': 2}
    """
    span: dict[str, list[float]] = {}
    gap: dict[str, list[float]] = {}
    prev = None
    for name, o in ops.items():
        head, dot, rest = name.partition(".")
        kind = rest if dot and head[:1] == "L" and head[1:].isdigit() else name
        span.setdefault(kind, []).append(o["end_us"] - o["start_us"])
        if prev is not None:
            gap.setdefault(kind, []).append(o["start_us"] - prev)
        prev = o["end_us"]
    return {k: {"span_us": round(statistics.fmean(v), 3),
                "gap_us": round(statistics.fmean(gap[k]), 3) if gap.get(k) else 0.0, "layers": len(v)}
            for k, v in span.items()}


def summarize(records: list[dict]) -> list[dict]:
    """Per model, batch and design: the median µs of each build that ran correct, and new / old and
    early / old where both ran."""
    rows: dict[tuple, dict] = {}
    for r in records:
        key = (r["model"], r["batch"], r["design"])
        row = rows.setdefault(key, {"model": r["model"], "batch": r["batch"], "design": r["design"], "us": {}})
        if r.get("ok") and "measured_us" in r:
            row["us"][r["build"]] = round(r["measured_us"], 1)
    for row in rows.values():
        us = row["us"]
        for b in ("new", "early"):
            if b in us and "old" in us:
                row[f"{b}_over_old"] = round(us[b] / us["old"], 4)
    return list(rows.values())


def _options(model: str, defines: str) -> tuple[str, ...]:
    """The compile options a Runner of ``model`` uses with ``defines`` (its attention instance: Plan.defines)."""
    plan = P.plan(schedule(model, 1, "plan"))
    with gpu.kernel_defines(defines):
        return gpu.compile_options("early", plan.defines)


def run_case(model: str, T: int, design: str, build: str, dry: bool, builds: dict[str, str] | None = None) -> dict:
    defines = (builds or BUILDS)[build]
    rec: dict[str, Any] = {"model": model, "batch": T, "design": design, "build": build, "defines": defines}

    def prepare(s: Any) -> None:
        if "MK_MOE_FTOPK=1" in defines:
            P.check_ftopk(s)

    def measured(r: Any, s: Any, times: list[float]) -> dict[str, Any]:
        summ = r.trace_summary()
        ot = op_trace(r.cp.asnumpy(r.trace), np.asarray(r.plan.program.tasks)[:, 1],
                      [op.name for op in s.workload.ops])
        return {"measured_us": statistics.median(times), "spread_us": max(times) - min(times),
                "trace": {"span_us": summ["span_us"], "moe": summ.get("moe", {}),
                          "matmul": summ["kinds"].get("matmul", {})},
                "phases": layer_phases(ot["ops"])}

    return abcase.run_case(rec, lambda: schedule(model, T, design), defines, dry,
                           predict=lambda s: round(float(mksim.simulate(s, timeline=False).latency_us), 2),
                           reps=REPS, watchdog_s=WATCHDOG_S, prepare=prepare, checked=topk_err, measured=measured)


def run(out: Path, dry: bool = False, budget_s: float = BUDGET_S, cases: tuple | None = None,
        builds: dict[str, str] | None = None) -> dict:
    """Every case of ``cases`` (default :data:`CASES`) with the builds it names (their defines: ``builds``,
    default :data:`BUILDS`); only the builds the cases name are compiled."""
    cases = CASES if cases is None else cases
    builds = BUILDS if builds is None else builds
    out.mkdir(parents=True, exist_ok=True)
    t_end = time.monotonic() + budget_s
    used = {b: builds[b] for _m, _t, _d, bs in cases for b in bs}
    doc: dict[str, Any] = {"commit": abcase.commit(), "device": "" if dry else abcase.device(),
                           "dry_run": dry, "gpu": GPU, "kv_len": KV, "builds": used, "records": []}

    def save() -> None:
        (out / "moe_speed.json").write_text(json.dumps(doc, indent=1, default=float))
        (out / "summary.json").write_text(json.dumps(summarize(doc["records"]), indent=1))

    option_sets = sorted({_options(m, d) for m in {c[0] for c in cases} for d in used.values()})
    doc["compile"] = {"builds": len(option_sets)} if dry else abcase.precompile(option_sets)
    print(json.dumps({"compile": doc["compile"]}), flush=True)
    save()
    hung = False
    for model, T, design, case_builds in cases:
        for build in case_builds:
            if hung:
                break
            if time.monotonic() > t_end:
                doc.setdefault("skipped", []).append(f"{model} b{T} {design} {build}")
                continue
            rec = run_case(model, T, design, build, dry, builds)
            doc["records"].append(rec)
            keep = {k: v for k, v in rec.items() if k not in ("traceback", "trace", "phases")}
            print(json.dumps(keep, default=float), flush=True)
            hung = "hung" in str(rec.get("failed", ""))
            save()
    save()
    return doc


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: python -m validation.megakernel.moe_speed OUT [--dry-run]", file=sys.stderr)
        return 2
    doc = run(Path(argv[0]), dry="--dry-run" in argv[1:])
    bad = [f"{r['model']} b{r['batch']} {r['design']} {r['build']}" for r in doc["records"]
           if "failed" in r or r.get("ok") is False]
    print(json.dumps({"summary": summarize(doc["records"]), "bad": bad, "skipped": doc.get("skipped", [])}))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
