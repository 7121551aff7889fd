"""What the single kernels of a chains raw file measure, and the ``cublas`` profile fitted to them (CPU).

The first run (2026-12-01) timed each single as one launch from Python between CUDA events on an
idle GPU (``event`` singles): the start event completes at once, so the time includes the host's
submission of the launch after it. For cuBLAS, torch.profiler recorded each kernel's own GPU
duration (CUPTI) of the same shapes: :func:`host_gaps` subtracts them, and the gap is a constant of
the launch path, not of the kernel (~25 µs at batch 1, ~31 µs at batch 8, over 64 KiB .. 256 MiB).
mksim's singles have no GPU-only time in that run: they cannot calibrate. Runs after it time
singles in CUDA graphs (``graph`` singles, :func:`validation.chains.runner.single_record`).

:func:`gpu_singles` gives each single's GPU-only time: a graph single's ``alone_us``, else for
cuBLAS the sum of the profiler's durations of its kernels. :func:`fit_cublas` fits the ``matmul``
costs of a profile to them (nothing from the chains); :func:`profile_toml` writes the file.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from collections import defaultdict
from typing import Any

import numpy as np

import hwmodels
import mksim
from hwmodels import KernelCost
from mksim.errors import MksimError

from . import cases as C

GPU = "h200-calibrated"
NVJET = re.compile(r"nvjet_sm\d+_\w+?_(\d+)x(\d+)_(\d+)x(\d+)_")


def _key(x: dict) -> tuple[str, int, int, int]:
    return str(x["implementation"]), int(x["batch"]), int(x["K"]), int(x["N"])


def profiler_us(raw: dict) -> dict[tuple[str, int, int, int], tuple[float, list[str]]]:
    """Per (implementation, batch, K, N): the summed GPU durations of the kernels torch.profiler
    recorded for one call, and their names."""
    out: dict[tuple[str, int, int, int], tuple[float, list[str]]] = {}
    for k in raw.get("kernels", []):
        if k.get("duration_us") is None or "K" not in k:
            continue
        us, names = out.get(_key(k), (0.0, []))
        out[_key(k)] = (us + float(k["duration_us"]), [*names, str(k["name"])])
    return out


def host_gaps(raw: dict) -> list[dict]:
    """For every ``event`` single with profiler durations: measured - GPU-only, per row."""
    prof = profiler_us(raw)
    rows = []
    for x in raw.get("singles", []):
        if x.get("method", "event") != "event" or _key(x) not in prof:
            continue
        gpu = prof[_key(x)][0]
        rows.append({"implementation": x["implementation"], "batch": x["batch"], "K": x["K"], "N": x["N"],
                     "event_us": x["measured_us"], "gpu_us": gpu, "gap_us": x["measured_us"] - gpu})
    return rows


def gap_summary(rows: list[dict]) -> dict[str, dict]:
    """Median, min and max host gap per ``<implementation> b<batch>``."""
    groups: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        groups[f"{r['implementation']} b{r['batch']}"].append(r["gap_us"])
    return {k: {"n": len(v), "median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)}
            for k, v in groups.items()}


def gpu_singles(raw: dict) -> list[dict]:
    """Every single with a GPU-only time: ``us`` and where it comes from (``graph``: replay of it
    alone less an empty kernel's; ``profiler``: CUPTI durations of its kernels, one call)."""
    prof = profiler_us(raw)
    out = []
    for x in raw.get("singles", []):
        if not x.get("checked", True):
            continue
        base = {"implementation": x["implementation"], "batch": int(x["batch"]), "K": int(x["K"]), "N": int(x["N"])}
        if x.get("method") == "graph":
            out.append({**base, "us": float(x["alone_us"]), "source": "graph"})
        elif _key(x) in prof:
            out.append({**base, "us": prof[_key(x)][0], "source": "profiler", "kernels": prof[_key(x)][1]})
    return out


def with_matmul(gpu: hwmodels.GPUSpec, cost: KernelCost) -> hwmodels.GPUSpec:
    """``gpu`` with ``cost`` as its ``[runtime.kernels.matmul]`` table (a candidate profile)."""
    per_kind = {**gpu.kernels.per_kind, "matmul": cost}
    return dataclasses.replace(gpu, kernels=dataclasses.replace(gpu.kernels, per_kind=per_kind))


def predict_alone(k: int, n: int, batch: int, gpu: hwmodels.GPUSpec) -> float:
    """One ``K x N`` kernel alone, as mksim predicts it with cuBLAS's options (the mode's
    defaults): the simulated graph of one op less the launch latency (GPU time only)."""
    wl = C.chain_workload(C.Sequence("single", "llama-3.2-1b", ((k, n),)), batch)
    res = mksim.simulate(mksim.build_schedule(wl, gpu, "graph"), timeline=False)
    return res.latency_us - gpu.launch.launch_latency_us


def residuals(rows: list[dict], gpu: hwmodels.GPUSpec) -> np.ndarray:
    """predicted / measured - 1 for every row."""
    return np.array([predict_alone(r["K"], r["N"], r["batch"], gpu) / r["us"] - 1 for r in rows])


def inflight_from_kernels(raw: dict) -> tuple[float | None, str]:
    """Bytes one cuBLAS block keeps in flight, from the names of the kernels it launched for the
    chains' shapes: an ``nvjet_sm90_tst_<M>x<N>_<K>x<S>`` kernel keeps a ring of S stages of the
    weight tile (max(M, N) x K bf16); one 384-thread block per SM (its shared memory holds the
    ring). The ring of the kernel cuBLAS picks for most chain shapes (the mode), in KiB."""
    chain = {sh for s in C.SEQUENCES.values() for sh in s.shapes}
    rings = []
    for k in raw.get("kernels", []):
        m = NVJET.search(str(k.get("name", "")))
        if k.get("implementation") != "cublas" or not m or (k.get("K"), k.get("N")) not in chain:
            continue
        tm, tn, tk, st = (int(v) for v in m.groups())
        rings.append(max(tm, tn) * tk * 2 * st / 1024)
    if not rings:
        return None, "no nvjet kernel recorded for the chains' shapes"
    mode = statistics.mode(rings)
    return mode, (f"{rings.count(mode)} of {len(rings)} cuBLAS kernels of the chains' shapes keep a ring of "
                  f"{mode:g} KiB (stages x weight tile x 2 B, from the nvjet kernel names; the rest "
                  f"{', '.join(f'{r:g}' for r in sorted(set(rings) - {mode})) or 'none'} KiB)")


@dataclasses.dataclass(frozen=True)
class Fit:
    """A fitted ``matmul`` cost and how well it reproduces the singles it was fitted to."""
    cost: KernelCost
    rows: list[dict]
    residuals: list[float]
    inflight_note: str

    @property
    def rms(self) -> float:
        return float(np.sqrt(np.mean(np.square(self.residuals))))

    @property
    def mape(self) -> float:
        return float(np.mean(np.abs(self.residuals)))

    def worst(self) -> tuple[dict, float]:
        i = int(np.argmax(np.abs(self.residuals)))
        return self.rows[i], self.residuals[i]


def fit_cublas(raw: dict, gpu: str = GPU) -> Fit:
    """``task_fixed_us`` and ``consume_GBps`` of cuBLAS's matmul tasks on ``gpu``, least squares on
    the relative residuals of every cuBLAS single with a GPU-only time (both batches; no per-row
    terms: cuBLAS's times at batch 8 are its times at batch 1 within the spread), with
    ``inflight_KiB`` from the launch shapes (:func:`inflight_from_kernels`)."""
    from scipy.optimize import minimize  # type: ignore[import-untyped]  # scipy: only when fitting

    rows = [r for r in gpu_singles(raw) if r["implementation"] == "cublas"]
    if len(rows) < 3:
        raise MksimError(f"{len(rows)} cuBLAS singles with a GPU-only time; a fit needs at least 3")
    base = hwmodels.load(gpu)
    inflight, note = inflight_from_kernels(raw)

    def cost(p: np.ndarray) -> KernelCost:
        return KernelCost(task_fixed_us=float(p[0]), consume_GBps=float(math.exp(p[1])), inflight_KiB=inflight)

    def loss(p: np.ndarray) -> float:
        if p[0] < 0:
            return 1e9
        return float(np.sum(np.square(residuals(rows, with_matmul(base, cost(p))))))

    starts = [np.array([f, math.log(c)]) for f in (1.0, 3.0) for c in (20.0, 80.0)]
    best = min((minimize(loss, s, method="Nelder-Mead", options={"xatol": 1e-3, "fatol": 1e-6}) for s in starts),
               key=lambda r: r.fun)
    c = cost(best.x)
    c = KernelCost(task_fixed_us=round(c.task_fixed_us or 0.0, 3), consume_GBps=round(c.consume_GBps or 0.0, 2),
                   inflight_KiB=inflight)
    res = residuals(rows, with_matmul(base, c))
    return Fit(cost=c, rows=rows, residuals=[float(x) for x in res], inflight_note=note)


def profile_toml(fit: Fit, raw: dict, raw_path: str, gpu: str = GPU) -> str:
    """The ``cublas`` profile's text: every value with its source and a note."""
    srcs = sorted({r["source"] for r in fit.rows})
    w, wr = fit.worst()
    how = (f"{len(fit.rows)} cuBLAS single kernels (F.linear, bf16; batch 1 and 8; the chains' 10 shapes and a "
           f"sweep 64 KiB .. 256 MiB at K = 2048), GPU-only time from {' + '.join(srcs)}; least squares on "
           f"relative residuals of mksim's prediction of each alone on {gpu}: fixed + bytes / rate; residual rms "
           f"{fit.rms:.1%}, mean |error| {fit.mape:.1%}, largest {wr:+.1%} ({w['K']}x{w['N']} b{w['batch']}: "
           f"{w['us']:.2f} us)")
    c = fit.cost
    gaps = gap_summary(host_gaps(raw))
    gap_txt = "; ".join(f"{k}: {v['median_us']:.1f} us ({v['min_us']:.1f}-{v['max_us']:.1f})" for k, v in gaps.items())
    lines = [
        "# Implementation profile: cuBLAS (through torch.nn.functional.linear, bf16, torch 2.11) on our H200.",
        "# Fitted to single kernels only (no chain), by",
        f"#   python -m validation chains fit {raw_path} --out hwmodels/profiles/cublas.toml",
        "# GPU-only single times: the run's singles were timed as one launch between events, which includes",
        f"# the host's submission of F.linear ({gap_txt}; validation/chains/calibrate.py), so each",
        "# single's own time is the sum of its kernels' durations that torch.profiler recorded (split-K",
        "# shapes launch a reduce kernel too). cuBLAS's per-op host cost and its kernels per op have no",
        "# field here: a stream of F.linear is paced by the host (README of the chains results).",
        "schema_version = 1",
        'profile = "cublas"',
        'full_name = "cuBLAS (torch F.linear) matmuls"',
        f'measured_on = "{gpu}"',
        'kind = "stack"',
        "",
        "[runtime.kernels.matmul]",
        f'task_fixed_us = {{ value = {c.task_fixed_us:g}, source = "singles", note = "{how}" }}',
        f'consume_GBps = {{ value = {c.consume_GBps:g}, source = "singles", note = "{how}" }}',
    ]
    if c.inflight_KiB is not None:
        lines.append(f'inflight_KiB = {{ value = {c.inflight_KiB:g}, source = "launch_shapes", note = '
                     f'"{fit.inflight_note}; one 384-thread block per SM (164-226 KB of shared memory); not fitted" }}')
    lines += [
        "",
        "[sources.singles]",
        'kind = "measured"',
        f'title = "cuBLAS single kernels of the chains run on {raw.get("gpu")}"',
        f'date = "{str(raw.get("date", ""))[:10]}"',
        f'note = "raw: {raw_path} (singles + kernels: torch.profiler durations, one call per shape after a '
        f'warm-up, the L2 evicted by the other shapes\' calls in between); commit {raw.get("commit")}"',
        "",
        "[sources.launch_shapes]",
        'kind = "measured"',
        'title = "kernels cuBLAS launches per F.linear shape (torch.profiler: name, grid, block, shared memory)"',
        f'date = "{str(raw.get("date", ""))[:10]}"',
        f'note = "raw: {raw_path} kernels"',
    ]
    return "\n".join(lines) + "\n"


def fit_report(fit: Fit) -> str:
    """One line per single: measured, predicted, error; then the fit."""
    out = [f"{'single':28s} {'source':9s} {'GPU us':>8s} {'error':>7s}"]
    for r, e in zip(fit.rows, fit.residuals, strict=True):
        out.append(f"cublas b{r['batch']} {r['K']:6d} x {r['N']:6d}     {r['source']:9s} {r['us']:8.2f} {e:+7.1%}")
    c = fit.cost
    out.append(f"task_fixed_us {c.task_fixed_us:g}, consume_GBps {c.consume_GBps:g}, inflight_KiB {c.inflight_KiB}; "
               f"rms {fit.rms:.1%}, mean |error| {fit.mape:.1%}")
    return "\n".join(out)


def check_fit_input(raw: Any) -> None:
    if not isinstance(raw, dict) or not isinstance(raw.get("singles"), list):
        raise MksimError("not a chains raw file (no 'singles' list); give the chains.json `run` wrote")
