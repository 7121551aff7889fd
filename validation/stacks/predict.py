"""mksim's predictions of the stacks' whole steps, held against a run's measurements.

    python -m validation stacks predict validation/results/h200-stacks/run2 \\
        --json validation/results/h200-stacks/summary.json --docs docs/stacks.md

Each measured step (``step-<stack>-<model>-b<B>-kv<kv>.json``) is predicted by
``mksim.build_schedule(workload, "<gpu>+<profile>", "graph")`` (the stack runs in one CUDA graph:
graph mode; ``torch`` for ``torch_graph``, ``inductor`` for ``inductor_graph``, the profiles fitted to
the single ops only, ``fit.py``), beside mksim's megakernel of the same case with mksim's own kernels
(``<gpu>+mksim``, megakernel mode) and its speed-up over the measured stack. Models without
single-op files in the run were never used to build a profile: they are marked ``held_out``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import hwmodels
import mksim
from mksim.costs import rates
from mksim.workload import kernel_of
from validation.stacks import hf_host_fit
from validation.stacks.fit import STACK_PROFILE, FitError, kernels
from validation.stacks.records import inside_pct

MEGAKERNEL_PROFILE = "mksim"
#: the mode each stack's step runs in (the profile's ``mode``): the eager transformers stack is launched by the
#: host kernel by kernel, the others are one CUDA graph
STACK_MODE = {"hf": "stream"}
HF_STACKS = ("hf", "hf_compiled")
#: the eager steps measured again on another day, after the predictions were committed (``hf/check``)
CHECK = "check"
TABLE_START, TABLE_END = "<!-- stacks-table:start -->", "<!-- stacks-table:end -->"
LAYER_MODELS = ("llama-3.2-1b", "llama-3.1-8b")
LAYER_START, LAYER_END = "<!-- stacks-layer:start -->", "<!-- stacks-layer:end -->"


@dataclass(frozen=True)
class Step:
    """One measured whole step."""
    stack: str
    model: str
    batch: int
    kv_len: int
    median_us: float
    spread_us: float     # p90 - p10 of the replays
    kernels: int
    busy_us: float       # the kernels' durations summed, from the profiled replay


def load_steps(run: Path) -> list[Step]:
    """The measured steps of ``run``, sorted by stack, model, batch, kv."""
    out = []
    for f in sorted(run.rglob("step-*.json")):  # a run folder may hold a later call's steps in a sub-folder
        d = json.loads(f.read_text())
        try:
            s = d["step_us"]
            out.append(Step(d["stack"], d["model"], int(d["batch"]), int(d["kv_len"]), float(s["median"]),
                            round(float(s["p90"]) - float(s["p10"]), 2), int(d["kernels_per_step_graph"]),
                            float(d["graph_profile"]["gpu_busy_us"])))
        except (KeyError, TypeError, ValueError):
            raise FitError(f"{f}: not a step record (step_us median/p10/p90, kernels_per_step_graph)") from None
    if not out:
        raise FitError(f"{run}: no step-*.json files")
    return sorted(out, key=lambda s: (s.stack, s.model, s.batch, s.kv_len))


def load_hf_steps(folder: Path) -> list[Step]:
    """The transformers stacks' measured steps (``hf.py``'s records: ``step-hf*-*.json`` directly in
    ``folder``), sorted as :func:`load_steps`'s."""
    out = []
    for f in sorted(folder.glob("step-hf*.json")):
        d = json.loads(f.read_text())
        try:
            s = d["step_us"]
            out.append(Step(d["stack"], d["model"], int(d["batch"]), int(d["kv_len"]), float(s["median"]),
                            round(float(s["p90"]) - float(s["p10"]), 2), int(d["kernels_per_step"]),
                            float(d["gpu_busy_us_one_step"])))
        except (KeyError, TypeError, ValueError):
            raise FitError(f"{f}: not a transformers step record (step_us, kernels_per_step)") from None
    if not out:
        raise FitError(f"{folder}: no step-hf*.json files")
    return sorted(out, key=lambda s: (s.stack, s.model, s.batch, s.kv_len))


def fit_models(run: Path) -> dict[str, list[str]]:
    """Per stack, the models whose single-op files built its profile."""
    out: dict[str, set[str]] = {}
    for f in run.rglob("ops-*.json"):
        d = json.loads(f.read_text())
        out.setdefault(d["stack"], set()).add(d["model"])
    return {k: sorted(v) for k, v in out.items()}


def predict_step(model: str, batch: int, kv_len: int, gpu: str,
                 mode: str = "graph") -> tuple[float, int, mksim.SimResult]:
    """mksim's step on ``gpu`` (a profile applied) in ``mode`` (the stack's): latency, kernels, the result."""
    wl = mksim.models.workload(model, batch=batch, kv_len=kv_len)
    s = mksim.build_schedule(wl, gpu, mode)
    r = mksim.simulate(s, timeline=False)
    return float(r.latency_us), len(s.graph.ops), r


def megakernel_us(model: str, batch: int, kv_len: int, gpu: str) -> float:
    wl = mksim.models.workload(model, batch=batch, kv_len=kv_len)
    return float(mksim.simulate(mksim.build_schedule(wl, f"{gpu}+{MEGAKERNEL_PROFILE}", "megakernel"),
                                timeline=False).latency_us)


def summarise(run: Path, gpu: str = "h200-calibrated", hf: Path | None = None) -> dict[str, Any]:
    """The summary (per case, MAPE, misses, the target; plus the megakernel and per-stack errors);
    ``hf``: a folder of the transformers stacks' steps too (its profiles' single modules under it)."""
    steps = load_steps(run) + (load_hf_steps(hf) if hf is not None else [])
    fitted = fit_models(run) | (fit_models(hf) if hf is not None else {})
    hf_runs = hf_host_fit.raw_files(hf) if hf is not None and any(hf.glob(hf_host_fit.RAW_GLOB)) else None
    hf_date = None
    if hf is not None and hf_runs is not None:   # host costs from hf_host.py's runs: their fit models too
        for stack, models in hf_host_fit.fit_models(hf).items():
            fitted[stack] = sorted(set(fitted.get(stack, [])) | set(models))
        hf_date = str(json.loads(hf_runs[-1].read_text())["env"].get("date_utc", ""))[:10] or None
    env = json.loads((run / "environment.json").read_text()) if (run / "environment.json").is_file() else {}
    mk: dict[tuple[str, int, int], float] = {}
    cases = []
    for st in steps:
        prof = STACK_PROFILE[st.stack]
        pred, n_k, res = predict_step(st.model, st.batch, st.kv_len, f"{gpu}+{prof}", STACK_MODE.get(st.stack, "graph"))
        key = (st.model, st.batch, st.kv_len)
        if key not in mk:
            mk[key] = megakernel_us(*key, gpu)
        err = (pred - st.median_us) / st.median_us * 100
        cases.append({
            "model": st.model, "batch": st.batch, "kv_len": st.kv_len, "stack": st.stack,
            "predicted_us": round(pred, 1), "measured_us": st.median_us, "measured_spread_us": st.spread_us,
            "kernels_per_step": st.kernels, "predicted_kernels_per_step": n_k, "error_pct": round(err, 1),
            "held_out": st.model not in fitted.get(st.stack, []),
            "measured_kernel_us": st.busy_us,
            "measured_gap_us_per_kernel": round((st.median_us - st.busy_us) / st.kernels, 3) if st.kernels else None,
            "predicted_kernel_us": round(sum(o["time_us"] for o in res.per_op), 1),
            "megakernel_us": round(mk[key], 1), "megakernel_speedup": round(st.median_us / mk[key], 2)})
    node_us = float(rates(hwmodels.load(gpu)).graph_node_us)
    misses = [miss(c, node_us) for c in cases if abs(c["error_pct"]) > 10]
    errs = np.array([abs(c["error_pct"]) for c in cases])
    by_stack = {s: round(float(np.mean([abs(c["error_pct"]) for c in cases if c["stack"] == s])), 1)
                for s in sorted({c["stack"] for c in cases})}
    held_by_stack = {s: round(float(np.mean([abs(c["error_pct"]) for c in cases if c["stack"] == s
                                             and c["held_out"]])), 1)
                     for s in sorted({c["stack"] for c in cases if c["held_out"]})}
    held = [c for c in cases if c["held_out"]]
    coverage = {s: inside_pct([c["error_pct"] for c in cases if c["stack"] == s and c["held_out"]],
                              [c["error_pct"] for c in cases if c["stack"] == s and not c["held_out"]])
                for s in held_by_stack if any(c["stack"] == s and not c["held_out"] for c in cases)}
    check = []
    if hf is not None and (hf / CHECK).is_dir():
        for st in load_hf_steps(hf / CHECK):
            c = next(c for c in cases if (c["stack"], c["model"], c["batch"], c["kv_len"]) ==
                     (st.stack, st.model, st.batch, st.kv_len))
            check.append({"stack": st.stack, "model": st.model, "batch": st.batch, "kv_len": st.kv_len,
                          "predicted_us": c["predicted_us"], "measured_us": st.median_us,
                          "measured_spread_us": st.spread_us, "held_out": c["held_out"],
                          "error_pct": round((c["predicted_us"] - st.median_us) / st.median_us * 100, 1)})
    return {
        "gpu": f"{env.get('gpu', 'NVIDIA H200')} ({gpu})", "date": env.get("date_utc", "")[:10],
        "run": str(run), "hf_run": str(hf) if hf is not None else None,
        "hf_host": hf_runs is not None, "hf_date": hf_date,
        "command": f"python -m validation stacks predict {run}" + (f" --hf {hf}" if hf is not None else "")
        + " --json SUMMARY",
        "predicted_with": {s: f"mksim.build_schedule(workload, '{gpu}+{p}', '{STACK_MODE.get(s, 'graph')}')"
                           for s, p in STACK_PROFILE.items()}
        | {"megakernel": f"mksim.build_schedule(workload, '{gpu}+{MEGAKERNEL_PROFILE}', 'megakernel')"},
        "fit_models": fitted, "held_out_models": sorted({c["model"] for c in held}),
        "note": "profiles fitted to the single ops of fit_models only (never to whole steps); held-out models "
                "never used to build a profile; measured_us is the median of 50 graph replays, "
                "measured_spread_us p90 - p10" + ("; the transformers stacks' steps are hf_run's (hf_host.py's: the "
                                                  "median over its rounds, one step a round; hf.py's: over 50 steps)"
                                                  if hf is not None else ""),
        "cases": cases, "mape_pct": round(float(errs.mean()), 1), "max_abs_error_pct": round(float(errs.max()), 1),
        "mape_pct_by_stack": by_stack, "mape_pct_held_out_by_stack": held_by_stack,
        "mape_pct_held_out": round(float(np.mean([abs(c["error_pct"]) for c in held])), 1) if held else None,
        "held_out_inside_p90_pct_by_stack": coverage,
        "coverage_note": "per stack, the share of held-out cases whose |error| is within the p90 |error| of the "
                         "fitted models' cases (the interval's coverage on cases no fit saw)",
        "cases_beyond_10_pct": sum(1 for e in errs if e > 10), "cases_beyond_20_pct": sum(1 for e in errs if e > 20),
        "misses": misses,
        "check": check, "check_note": "the eager steps measured again on 2026-12-04 (another machine and day), after "
                                      "validation/results/h200-stacks/hf/predicted-hf.json was committed: how far "
                                      "the host's speed moves between runs" if check else None,
        "models": sorted({c["model"] for c in cases}),
        "target": "MAPE <= 10 %, no case beyond 20 %, over at least 6 dense models (this run has "
                  f"{len({c['model'] for c in cases})})"}


def miss(c: dict[str, Any], node_us: float) -> dict[str, Any]:
    """Which effect a case beyond 10 % lacks, from its own measurement: kernels the profile does not
    know (a held-out model's ops), or launch boundaries shorter than the hardware file's."""
    out = {"model": c["model"], "batch": c["batch"], "kv_len": c["kv_len"], "stack": c["stack"],
           "error_pct": c["error_pct"], "error_us": round(c["predicted_us"] - c["measured_us"], 1)}
    if c["stack"] == "hf":
        if not c["kernels_per_step"]:
            per = c["predicted_us"] / c["predicted_kernels_per_step"]
            out["effect"] = (f"the host: the eager step is its host's ({per:.1f} us a kernel predicted; the measured "
                             "step's kernels were not counted)")
            return out
        out["effect"] = (f"the host: the eager step is its host's ({c['measured_us'] / c['kernels_per_step']:.1f} us "
                         f"a kernel measured, {c['predicted_us'] / c['predicted_kernels_per_step']:.1f} us "
                         f"predicted; the kernels ran {c['measured_kernel_us']:.0f} us of it)")
        return out
    if c["stack"] == "hf_compiled":
        rest_m = c["measured_us"] - c["measured_kernel_us"]
        rest_p = c["predicted_us"] - c["predicted_kernel_us"]
        out["effect"] = (f"the host before the graph's launch: kernel time {c['predicted_kernel_us']:.0f} us "
                         "predicted, "
                         f"{c['measured_kernel_us']:.0f} us in the profiled step; the rest of the step {rest_p:.0f} us "
                         f"predicted, {rest_m:.0f} us measured (the host's part of the compiled small models does not "
                         "extrapolate to the whole model)")
        return out
    dk = c["kernels_per_step"] - c["predicted_kernels_per_step"]
    if abs(dk) > 0.1 * c["kernels_per_step"]:
        out["effect"] = (f"kernels: {c['kernels_per_step']} measured, {c['predicted_kernels_per_step']} predicted: "
                         "ops of this model the profile's models do not have")
        return out
    gap = c["measured_gap_us_per_kernel"]
    part = (node_us - gap) * c["predicted_kernels_per_step"]
    out["effect"] = (f"launch boundaries: the step's kernels are {gap:.2f} us apart (step - kernel time, per kernel), "
                     f"the hardware file's graph node {node_us:.2f} us: {part:.0f} us of the {out['error_us']:.0f} us; "
                     f"kernel time {c['predicted_kernel_us']:.0f} us predicted, {c['measured_kernel_us']:.0f} us in "
                     "the profiled replay")
    return out


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(summary: dict[str, Any]) -> str:
    """The cases as a Markdown table, then the error summary."""
    rows = ["| stack | model | B | kv | measured µs (p90-p10) | predicted µs | error | kernels meas / pred | "
            "measured gap µs/kernel | megakernel µs | speed-up |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in summary["cases"]:
        model = c["model"] + (" (held out)" if c["held_out"] else "")
        rows.append(f"| {c['stack']} | {model} | {c['batch']} | {c['kv_len']} | {c['measured_us']:.1f} "
                    f"({c['measured_spread_us']:.1f}) | {c['predicted_us']:.1f} | {c['error_pct']:+.1f} % | "
                    f"{c['kernels_per_step'] or '-'} / {c['predicted_kernels_per_step']} | "
                    f"{_num(c['measured_gap_us_per_kernel'])} | {c['megakernel_us']:.1f} | "
                    f"{c['megakernel_speedup']:.2f}x |")
    by = ", ".join(f"{k} {v} %" for k, v in summary["mape_pct_by_stack"].items())
    rows += ["", f"MAPE {summary['mape_pct']} % over {len(summary['cases'])} cases ({by}); held out "
             f"({', '.join(summary['held_out_models'])}): {summary['mape_pct_held_out']} %; largest error "
             f"{summary['max_abs_error_pct']} %; {summary['cases_beyond_10_pct']} cases beyond 10 %, "
             f"{summary['cases_beyond_20_pct']} beyond 20 %."
             + (" Held-out cases within the p90 |error| of the fitted ones: " + ", ".join(
                 f"{k} {v:.0f} %" for k, v in summary["held_out_inside_p90_pct_by_stack"].items()) + "."
                if summary.get("held_out_inside_p90_pct_by_stack") else "")]
    if summary["misses"]:
        rows += ["", "Beyond 10 %:", ""] + [f"- {m['stack']} {m['model']} b{m['batch']} kv{m['kv_len']} "
                                            f"({m['error_pct']:+.1f} %): {m['effect']}" for m in summary["misses"]]
    return "\n".join(rows)


def measured_layer(run: Path, stack: str, model: str, batch: int, kv_len: int) -> dict[str, tuple[int, float]]:
    """Per mksim op kind, the kernels and summed ``us_cold`` of one layer's single ops in ``run``
    (the ops that run once a layer; empty where the run has no single-op file of the case)."""
    f = run / f"ops-{stack}-{model}-b{batch}-kv{kv_len}.json"
    if not f.is_file():
        return {}
    rec = {**json.loads(f.read_text()), "_file": f.name}
    layers = mksim.models.get(model).num_layers
    out: dict[str, tuple[int, float]] = {}
    for k in kernels(rec, 0.0):
        if k.count == layers:
            n, us = out.get(k.kind, (0, 0.0))
            out[k.kind] = (n + 1, us + k.us)
    return out


def per_layer(model: str, batch: int, kv_len: int, gpu: str = "h200-calibrated", run: Path | None = None) -> str:
    """What each stack spends on one layer (layer 0), by mksim op kind, as predicted: kernels, the
    kernels' time, the launch boundaries between them (``launch.graph_node_us`` each) and the DRAM
    bytes the op streams; beside them, where ``run`` has the case's single-op file, the kernels and
    time of the layer's single ops as measured (alone, cold)."""
    rows = ["| stack | op kind | kernels | kernel µs | boundaries µs | MB streamed | measured: kernels | "
            "single ops µs (cold) |", "|---|---|---|---|---|---|---|---|"]
    for stack, prof in STACK_PROFILE.items():
        if stack in HF_STACKS:   # the per-layer table is of our own stacks' single ops
            continue
        wl = mksim.models.workload(model, batch=batch, kv_len=kv_len)
        s = mksim.build_schedule(wl, f"{gpu}+{prof}", "graph")
        r = mksim.simulate(s, timeline=False)
        node = s.gpu.launch.graph_node_us
        ops = {op.name: op for op in s.workload.ops}
        model_kind = {op.name: op.kind for op in wl.ops}
        agg: dict[str, list[float]] = {}
        for p in r.per_op:
            op = ops[p["op"]]
            if op.layer != 0:
                continue
            kind = model_kind[kernel_of(op)]
            a = agg.setdefault(kind, [0, 0.0, 0.0])
            a[0] += 1
            a[1] += p["time_us"]
            a[2] += (op.weight_bytes + op.kv_read_bytes + op.kv_write_bytes) / 1e6
        meas = measured_layer(run, stack, model, batch, kv_len) if run is not None else {}
        tot = [sum(v[i] for v in agg.values()) for i in range(3)]
        mtot = (sum(n for n, _ in meas.values()), sum(us for _, us in meas.values()))
        for kind, (n, us, mb) in [*agg.items(), ("all", tot)]:
            m = mtot if kind == "all" else meas.get(kind)
            mcell = f"{m[0]} | {m[1]:.1f}" if m else "- | -"
            rows.append(f"| {stack} | {kind} | {n:.0f} | {us:.1f} | {n * node:.1f} | {mb:.2f} | {mcell} |")
    return "\n".join(rows)


def update_docs(path: Path, summary: dict[str, Any], gpu: str = "h200-calibrated") -> None:
    """Rewrite the generated parts of ``path`` between their markers (each must be there)."""
    text = path.read_text()
    parts = {(TABLE_START, TABLE_END): table(summary),
             (LAYER_START, LAYER_END): "\n\n".join(f"{m}, batch 1, KV 1024:\n\n"
                                                  + per_layer(m, 1, 1024, gpu, Path(summary["run"]))
                                                  for m in LAYER_MODELS)}
    for (a, b), body in parts.items():
        if a not in text or b not in text:
            raise FitError(f"{path}: markers {a} ... {b} missing")
        i, j = text.index(a), text.index(b)
        text = text[:i] + f"{a}\n{body}\n" + text[j:]
    path.write_text(text)
