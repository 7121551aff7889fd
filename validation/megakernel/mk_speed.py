"""The dense megakernel's speed items of issue 29 (validation/results/h200-mk-speed), on one H200 in one
command (~6 minutes; each run takes 1-3 s, the compiles ~1 minute at once):

    python -m validation.megakernel.mk_speed predict OUT.json       # no GPU: the simulator's µs of every case
    python -m validation.megakernel.mk_speed run OUT [--rounds N] [--budget-s S] [--predicted P] [--dry-run]

Each case is the suite's ``fused`` megakernel (``validation.suite``: the default placement, the norms, RoPE and
SiLU fused into the matmuls, the searched schedule's KV splits) or its ``sentinel`` one (the default schedule with
sync="sentinel") of :data:`CASES`, run as each variant of :data:`VARIANTS` that applies to it
(:data:`KIND_VARIANTS`, :data:`ONLY`): a build (``MKSIM_KERNEL_DEFINES``) and schedule options on top of the case's.

- ``base``: the kernel as it is.
- ``l2g1``: ``-DMK_L2PF_GATE=1`` and ``l2_prefetch_KiB=256``: the L2 prefetcher warp asks L2 for the weight
  rows up to 256 KiB past the producer's position only while the workers' task streams nothing (attention
  partials, reductions, the waits after them): the ~11 µs a layer at llama-3.2-1b batch 1 in which DRAM reads
  only the KV cache, while the ring (full with o_proj's and gate_up's first pages) waits. The gate_up task
  then finds a part of its bytes in L2. Measured once on the kernel before ``MK_MM_FASTDIV`` (no gain: the
  workers bound the matmul then), never since.
- ``l2g2``: ``-DMK_L2PF_GATE=2``, as ``l2g1`` and also while the workers, done with a matmul, wait for a task
  that streams nothing (the gap between the QKV projection and attention).
- ``l2g2_128``, ``l2g2_384``: ``l2g2`` with a lead of 128 or 384 KiB (34 MB over the chip at 256 KiB; the L2
  holds 60 MB).
- ``fence``: ``-DMK_PUB_FENCE=1``, the publisher's fence ``fence.release.gpu`` (MEMBAR.ALL.GPU) instead of
  ``__threadfence()`` (``fence.sc.gpu``: MEMBAR.SC.GPU and an L1 invalidation): a boundary's last task
  publishes after it.
- ``wacq``: ``-DMK_WAIT_ACQ=1``, the waits poll with ``ld.relaxed.gpu`` and acquire once with
  ``fence.acquire.gpu``, instead of an ``ld.acquire.gpu`` (and an L1 invalidation) at every poll.
- ``l2g2_fence``, ``l2g2_fence_wacq``: ``l2g2`` and the fences.
- ``l2g2_p48`` (llama-3.2-1b b1 only, :data:`ONLY`): ``l2g2`` with pages of 48 KiB, 3 of them: fewer pages a
  task, each page's fixed cost in the workers paid less often, once part of the bytes come from L2.
- ``acqrel`` (the sentinel cases): ``-DMK_SENTINEL_FENCE=1``, the fence after a task's polls ``fence.acq_rel.gpu``
  (MEMBAR.ALL.GPU and an L1 invalidation), the default before validation/results/h200-mk-speed, instead of
  ``fence.acquire.gpu`` (the invalidation alone). That run measured it the other way round, as ``sacq``
  (``-DMK_SENTINEL_FENCE=2`` against the then ``base``): 5.1 % faster at llama-3.2-1b b1, 1.3 % at b8, correct
  in both, so ``fence.acquire.gpu`` is the default since and ``base`` builds it.

Order: rounds of every case, each round its variants in turn, forward in even rounds and backward in odd
ones (A B C C B A ...), so that each variant sits beside the others as often; no round begun after the
budget. Each run: checked against torch (every op's own relative error <= 1e-2, as the suite; a sentinel case
also on the outputs only the kernel reset), timed
(median of :data:`REPS` steps), and per op of a layer its mean span and the gap before it
(:func:`validation.megakernel.moe_speed.layer_phases`). The kernels are compiled first, every build of
every model at once in child processes (cupy's kernel cache). Writes ``OUT/mk_speed.json`` (every record,
the device, the commit) and ``OUT/summary.json`` (per case and variant: the runs' µs, their median, the ratio
to ``base``, the simulator's µs and, with ``--predicted``, the µs expected before the run). ``--dry-run``
plans every run on the CPU and writes the same files without timings.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import mksim
from validation import suite as vs
from validation.suite.anatomy import op_trace

from . import abcase, gpu
from . import program as P
from .moe_speed import layer_phases

REPS = 20
WATCHDOG_S = 90.0
BUDGET_S = 330.0
ROUNDS = 3
L2_LEAD_KiB = 256.0
#: variant -> (kernel defines, schedule options on top of the case's schedule)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "base": ("", {}),
    "l2g1": ("-DMK_L2PF_GATE=1", {"l2_prefetch_KiB": L2_LEAD_KiB}),
    "l2g2": ("-DMK_L2PF_GATE=2", {"l2_prefetch_KiB": L2_LEAD_KiB}),
    "l2g2_128": ("-DMK_L2PF_GATE=2", {"l2_prefetch_KiB": 128.0}),
    "l2g2_384": ("-DMK_L2PF_GATE=2", {"l2_prefetch_KiB": 384.0}),
    "fence": ("-DMK_PUB_FENCE=1", {}),
    "wacq": ("-DMK_WAIT_ACQ=1", {}),
    "l2g2_fence": ("-DMK_L2PF_GATE=2 -DMK_PUB_FENCE=1", {"l2_prefetch_KiB": L2_LEAD_KiB}),
    "l2g2_fence_wacq": ("-DMK_L2PF_GATE=2 -DMK_PUB_FENCE=1 -DMK_WAIT_ACQ=1", {"l2_prefetch_KiB": L2_LEAD_KiB}),
    # fewer, larger pages (the workers' fixed cost a page) once part of gate_up's bytes come from L2; 48 KiB x 3
    # fits beside llama-3.2-1b b1's 44 KiB reserve only
    "l2g2_p48": ("-DMK_L2PF_GATE=2", {"l2_prefetch_KiB": L2_LEAD_KiB, "page_KiB": 48.0, "prefetch_depth": 3}),
    "acqrel": ("-DMK_SENTINEL_FENCE=1", {}),  # the sentinel's fence before h200-mk-speed (which ran it as sacq)
}
#: the cases: (model, batch, schedule), the schedule the suite's ``fused`` or ``sentinel`` megakernel
CASES: tuple[tuple[str, int, str], ...] = (("llama-3.2-1b", 1, "fused"), ("llama-3.2-1b", 8, "fused"),
                                          ("llama-3.1-8b", 1, "fused"), ("llama-3.2-1b", 1, "sentinel"),
                                          ("llama-3.2-1b", 8, "sentinel"))
#: the variants a case of each schedule runs, and those run on some cases only (case keys)
KIND_VARIANTS: dict[str, tuple[str, ...]] = {"fused": tuple(v for v in VARIANTS if v != "acqrel"),
                                             "sentinel": ("base", "acqrel")}
ONLY: dict[str, tuple[str, ...]] = {"l2g2_p48": ("llama-3.2-1b/b1",)}


def case_key(model: str, batch: int, kind: str = "fused") -> str:
    """``model/bN`` for the fused schedule, ``model/bN/sentinel`` for the other."""
    return f"{model}/b{batch}" + ("" if kind == "fused" else f"/{kind}")


def applies(variant: str, case: tuple[str, int, str]) -> bool:
    """Whether ``variant`` runs on ``case`` (:data:`KIND_VARIANTS`, :data:`ONLY`)."""
    key = case_key(*case)
    return variant in KIND_VARIANTS[case[2]] and key in ONLY.get(variant, (key,))


def schedule(model: str, batch: int, variant: str, kind: str = "fused") -> Any:
    """The suite's ``fused`` (every fusion, the searched schedule's KV splits) or ``sentinel`` (the default
    schedule with sync="sentinel") megakernel schedule of ``model`` at ``batch``, with the variant's options."""
    opts = dict(VARIANTS[variant][1])
    if kind == "sentinel":
        opts["sync"] = "sentinel"
        case = vs.Case(model, batch, "megakernel", "sentinel", options=tuple(sorted(opts.items())))
    elif kind == "fused":
        case = vs.Case(model, batch, "megakernel", "fused", workload_options=vs.fused_workload_options(),
                       options=tuple(sorted(opts.items())))
    else:
        raise ValueError(f"unknown schedule {kind!r}; give fused or sentinel")
    return vs.build(case)


def order(rounds: int, cases: tuple[tuple[str, int, str], ...] | None = None,
          variants: tuple[str, ...] | None = None) -> list[tuple[int, tuple[str, int, str], str]]:
    """The runs in order: (round, case, variant), of ``cases`` (default :data:`CASES`) and ``variants`` (default
    :data:`VARIANTS`), each case with the variants that apply to it (:func:`applies`).

    >>> order(2, (("llama-3.2-1b", 8, "sentinel"),), ("base", "fence", "acqrel"))
    [(0, ('llama-3.2-1b', 8, 'sentinel'), 'base'), (0, ('llama-3.2-1b', 8, 'sentinel'), 'acqrel'), \
(1, ('llama-3.2-1b', 8, 'sentinel'), 'acqrel'), (1, ('llama-3.2-1b', 8, 'sentinel'), 'base')]
    """
    cases = CASES if cases is None else cases
    variants = tuple(VARIANTS) if variants is None else variants
    return [(r, c, v) for r in range(rounds) for c in cases for v in (variants if r % 2 == 0 else variants[::-1])
            if applies(v, c)]


def predict(cases: tuple[tuple[str, int, str], ...] | None = None) -> dict[str, dict[str, float]]:
    """The simulator's µs (as the suite compares them: launch latency left out) of every case and variant. The
    model has no term for the kernel defines: ``fence``, ``wacq`` and ``acqrel`` are predicted as ``base``, and the
    L2 gate not at all (the schedule option's prefetcher is priced as it runs at any time)."""
    out: dict[str, dict[str, float]] = {}
    for c in CASES if cases is None else cases:
        row = out.setdefault(case_key(*c), {})
        for v in VARIANTS:
            if applies(v, c):
                row[v] = round(vs.predicted_us(schedule(c[0], c[1], v, c[2])), 1)
    return out


def _options(model: str, defines: str) -> tuple[str, ...]:
    """The compile options a Runner of ``model`` uses with ``defines`` (its attention instance)."""
    with gpu.kernel_defines(defines):
        return gpu.compile_options("early", P.attn_defines(mksim.models.get(model)))


def run_one(case: tuple[str, int, str], variant: str, dry: bool) -> dict:
    model, batch, kind = case
    defines, opts = VARIANTS[variant]
    rec: dict[str, Any] = {"model": model, "batch": batch, "schedule": kind, "variant": variant, "defines": defines,
                           "options": opts}

    def measured(r: Any, s: Any, times: list[float]) -> dict[str, Any]:
        summ = r.trace_summary()
        ot = op_trace(r.cp.asnumpy(r.trace), np.asarray(r.plan.program.tasks)[:, 1], [op.name for op in s.workload.ops])
        return {"measured_us": statistics.median(times),
                "spread_us": float(np.percentile(times, 90) - np.percentile(times, 10)),  # p90 - p10, as the suite
                "trace": {"span_us": summ["span_us"], "kinds": summ["kinds"]}, "phases": layer_phases(ot["ops"])}

    return abcase.run_case(rec, lambda: schedule(model, batch, variant, kind), defines, dry,
                           predict=lambda s: round(vs.predicted_us(s), 2), reps=REPS, watchdog_s=WATCHDOG_S,
                           rel_err_max=vs.REL_ERR_MAX, recycled=kind == "sentinel", measured=measured)


def summarize(records: list[dict], expected: dict | None = None) -> dict[str, dict[str, dict]]:
    """Per case and variant: the µs of its runs that checked, their median, the ratio of that to ``base``'s,
    whether every run checked, the largest relative error, the simulator's µs and the one ``expected``."""
    out: dict[str, dict[str, dict]] = {}
    for r in records:
        row = out.setdefault(case_key(r["model"], r["batch"], r.get("schedule", "fused")), {}).setdefault(
            r["variant"], {"runs_us": [], "ok": True, "max_rel_err": 0.0})
        if "predicted_us" in r:
            row["simulator_us"] = r["predicted_us"]
        if "measured_us" in r and r.get("ok"):
            row["runs_us"].append(round(r["measured_us"], 1))
        if "refused" in r or "failed" in r or r.get("ok") is False:
            row["ok"] = False
            why = r.get("refused") or r.get("failed") or f"max rel err {r['max_rel_err']:.2e}"
            row.setdefault("errors", []).append(why)
        if "max_rel_err" in r:
            row["max_rel_err"] = max(row["max_rel_err"], r["max_rel_err"])
    for key, rows in out.items():
        for v, row in rows.items():
            if row["runs_us"]:
                row["median_us"] = round(statistics.median(row["runs_us"]), 1)
            if expected and v in expected.get(key, {}):
                row["expected_us"] = expected[key][v]
        base = rows.get("base", {}).get("median_us")
        for row in rows.values():
            if base and "median_us" in row:
                row["vs_base"] = round(row["median_us"] / base, 4)
    return out


def run(out: Path, dry: bool = False, rounds: int = ROUNDS, budget_s: float = BUDGET_S,
        expected: dict | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    t_end = time.monotonic() + budget_s
    doc: dict[str, Any] = {"commit": abcase.commit(), "device": "" if dry else abcase.device(),
                           "dry_run": dry, "gpu": vs.GPU, "kv_len": vs.KV_LEN, "reps": REPS,
                           "variants": {k: list(v) for k, v in VARIANTS.items()}, "records": []}

    def save() -> None:
        (out / "mk_speed.json").write_text(json.dumps(doc, separators=(",", ":"), default=float))  # one line
        (out / "summary.json").write_text(json.dumps(summarize(doc["records"], expected), indent=1))

    option_sets = sorted({_options(c[0], VARIANTS[v][0]) for c in CASES for v in VARIANTS if applies(v, c)})
    doc["compile"] = {"builds": len(option_sets)} if dry else abcase.precompile(option_sets)
    print(json.dumps({"compile": doc["compile"]}), flush=True)
    save()
    for rnd, case, variant in order(rounds):
        if time.monotonic() > t_end:
            doc.setdefault("skipped", []).append(f"round {rnd} {case_key(*case)} {variant}")
            continue
        rec = run_one(case, variant, dry)
        rec["round"] = rnd
        doc["records"].append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k not in ("traceback", "trace", "phases")}, default=float),
              flush=True)
        save()
        if "hung" in str(rec.get("failed", "")):  # the GPU context is gone: nothing after it would run
            break
    save()
    return doc


USAGE = ("usage: python -m validation.megakernel.mk_speed predict OUT.json\n"
         "       python -m validation.megakernel.mk_speed run OUT [--rounds N] [--budget-s S] [--predicted P]"
         " [--dry-run]")


def _flag(argv: list[str], name: str, default: str | None) -> str | None:
    if name in argv:
        i = argv.index(name)
        if i + 1 >= len(argv):
            raise ValueError(f"{name} needs a value")
        return argv[i + 1]
    return default


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("predict", "run"):
        print(USAGE, file=sys.stderr)
        return 2
    if argv[0] == "predict":
        Path(argv[1]).write_text(json.dumps({"simulator_us": predict()}, indent=1) + "\n")
        return 0
    try:
        rounds = int(_flag(argv, "--rounds", str(ROUNDS)) or ROUNDS)
        budget = float(_flag(argv, "--budget-s", str(BUDGET_S)) or BUDGET_S)
        pred = _flag(argv, "--predicted", None)
        if rounds < 1 or budget <= 0:
            raise ValueError("--rounds and --budget-s must be positive")
        expected = json.loads(Path(pred).read_text())["expected_us"] if pred else None
    except (ValueError, OSError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    doc = run(Path(argv[1]), dry="--dry-run" in argv[2:], rounds=rounds, budget_s=budget, expected=expected)
    bad = [f"{case_key(r['model'], r['batch'], r['schedule'])} {r['variant']}" for r in doc["records"]
           if "failed" in r or "refused" in r or r.get("ok") is False]
    print(json.dumps({"summary": summarize(doc["records"], expected), "bad": bad, "skipped": doc.get("skipped", [])}))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
