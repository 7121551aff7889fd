"""Implementation profiles of the stacks (``hwmodels/profiles/torch.toml``, ``inductor.toml``), fitted
to the single-op files of a run (``ops-<stack>-<model>-b<B>-kv<kv>.json``) and never to whole steps.

    python -m validation stacks profile validation/results/h200-stacks/run2 --stack torch_graph \\
        --out hwmodels/profiles/torch.toml

How (docs/stacks.md, "The profiles"):

0. **Cold inputs.** Each unit runs after an L2 eviction, so its first kernel reads its inputs from
   DRAM; in a step they are in L2, written by the kernel before. That kernel is taken
   ``first_load_us - l2 latency`` of the hardware file faster (0.44 µs on h200-calibrated).
1. **Op kinds.** Every op label of a stack maps to one of mksim's op kinds (:func:`kind_of`): the
   norms and the residual add before them to ``rmsnorm``, RoPE, the KV write (and Qwen3's q/k norm) to
   ``rope_kv``, the projections and the LM head to ``matmul``, the RoPE table torch computes once a
   step to ``embed``; an attention op's first kernel to ``attn_partial``, its others to
   ``attn_reduce``. ``kernels_per_op_count`` of a kind is the stack's kernels of that kind per step
   over mksim's ops of that kind per step (:func:`mksim.models.workload` of the same model), the mean
   over the files.
2. **Fixed-cost kinds** (no streamed bytes): every kernel of an op costs the same,
   ``task_fixed_us`` (+ rows), the kind's kernel time per step over its kernels per step, fitted as
   ``fixed + (rows - 1) * row`` (rows = batch) over the files; mksim runs an op of the kind as
   ``kernels_per_op_count`` such kernels (:func:`mksim.workload.expand_kernels`).
3. **Continuation kernels of streaming ops** (a split-K reduction, o_proj's residual add): kind
   ``elementwise``, ``fixed + (rows - 1) * row`` fitted to all of them.
4. **Streaming kinds** (``matmul``, ``attn_partial``): the first kernel of each op (the GEMM, the
   attention kernel) is fitted as ``a + bytes / rate + w * dirty`` (relative residuals), where
   ``dirty`` is the part of the op's bytes that evicts lines the L2 eviction before the op left dirty
   (the eviction writes 256 MiB; the first ``l2.size`` bytes read after it each write one back):
   single ops run cold pay this, a step does not, so it is fitted (shared by the kinds) and removed.
   ``a + bytes / rate`` is then what the kernel takes in a step; mksim's ``task_fixed_us`` and
   ``consume_GBps`` are calibrated so that mksim's own graph-mode kernel of the op (its tiling, its
   first-load latency) takes that (:func:`calibrate_stream`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

import hwmodels
import mksim
from mksim.costs import rates
from mksim.workload import CONTINUATION_KIND, Workload

STACK_PROFILE = {"torch_graph": "torch", "inductor_graph": "inductor", "hf": "hf", "hf_compiled": "hf-compiled"}
STREAMING = ("matmul", "attn_partial")
_LABEL_KIND = {
    "embed": "embed", "rope_table": "embed", "prologue": "embed",
    "residual_add": "rmsnorm", "attn_norm": "rmsnorm", "mlp_norm": "rmsnorm", "final_norm": "rmsnorm",
    "after_down": "rmsnorm",
    "qkv": "matmul", "o_proj": "matmul", "gate_up": "matmul", "down": "matmul", "lm_head": "matmul",
    "unmapped_gemm": "matmul",
    "qk_norm": "rope_kv", "rope": "rope_kv", "kv_write": "rope_kv",
    "attention": "attn_partial", "silu_mul": "silu_mul"}
GEMM_KEYS = ("gemm", "nvjet", "cublas", "cutlass", "xmma", "gemv")


def main_gemm(name: str) -> bool:
    """A GEMM kernel of a projection: not a split-K reduction, not a CUDA-core float32 GEMM (the RoPE
    table's, ``simt_sgemm``), not Triton's or an attention kernel.

    >>> main_gemm("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"), main_gemm("cublasLt::splitKreduce_kernel")
    (True, False)
    """
    n = name.lower()
    return (any(k in n for k in GEMM_KEYS) and "reduce" not in n and "simt_sgemm" not in n
            and not n.startswith("triton") and not any(k in n for k in ("sdpa", "flash", "fmha", "attention")))


class FitError(ValueError):
    """A run folder the fit cannot use (one line)."""


def kind_of(label: str) -> str:
    """mksim's op kind of a stack op label (fused labels: their first part).

    >>> kind_of("residual_add+attn_norm"), kind_of("rope+kv_write"), kind_of("lm_head")
    ('rmsnorm', 'rope_kv', 'matmul')
    """
    first = label.split("+")[0]
    if first not in _LABEL_KIND:
        raise FitError(f"stack op {label!r} has no mksim op kind; known: {', '.join(sorted(_LABEL_KIND))}")
    return _LABEL_KIND[first]


def load_ops(run: Path, stack: str) -> list[dict[str, Any]]:
    """The single-op records of ``stack`` in ``run``, sorted by file name."""
    files = sorted(run.glob(f"ops-{stack}-*.json"))
    if not files:
        raise FitError(f"{run}: no ops-{stack}-*.json files (single-op profiles of the stack)")
    out = []
    for f in files:
        d = json.loads(f.read_text())
        if d.get("stack") != stack or not isinstance(d.get("ops"), dict):
            raise FitError(f"{f}: not a single-op record of {stack}")
        d["_file"] = f.name
        out.append(d)
    return out


@dataclass
class Kernel:
    """One kernel of a single-op record, as the fit sees it."""
    file: str
    model: str
    batch: int
    kv_len: int
    op: str
    kind: str
    first: bool          # its op's first kernel (a continuation kernel otherwise)
    us: float            # us_cold
    count: int           # times per step
    bytes: float | None  # the op's bytes, on the first kernel of a streaming kind
    dirty: float = 0.0   # of those, bytes that evicted a dirty L2 line (see the module docstring)
    extra_us: float = 0.0  # the first kernel of an op of several GEMMs (transformers' q, k, v): the others' time
    n_extra: int = 0       # ... and how many they are
    extra: bool = False    # one of those others (its time is in its op's first kernel)


def kernels(rec: dict[str, Any], l2_B: float, cold_us: float = 0.0) -> list[Kernel]:
    """The kernels of one record in launch order, each with its kind (the attention op's kernels
    after the first are ``attn_reduce``) and, for a streaming kernel, the bytes that evicted dirty
    lines: the eviction runs before each unit, and each streaming kernel of the unit takes what the
    ones before it in the unit left (``l2_B`` in all). The first kernel of each unit read its inputs
    from DRAM, where in a step they are in L2: ``cold_us`` less (at most half its time)."""
    out: list[Kernel] = []
    left: dict[str, float] = defaultdict(lambda: l2_B)
    for label, op in rec["ops"].items():
        kind = kind_of(label)
        gemms = [i for i, k in enumerate(op["kernels"]) if main_gemm(k["name"])] if kind == "matmul" else []
        extra = set(gemms[1:]) if gemms[:1] == [0] else set()
        for i, k in enumerate(op["kernels"]):
            kk = kind if i == 0 or kind != "attn_partial" else "attn_reduce"
            b = op["bytes"] if i == 0 and kind in STREAMING else None
            dirty = 0.0
            us = float(k["us_cold"])
            if op["unit"] not in left:   # the unit's first kernel
                us = max(us - cold_us, us / 2)
            if b is not None:
                dirty = min(float(b), left[op["unit"]])
            left[op["unit"]] -= dirty
            out.append(Kernel(rec["_file"], rec["model"], rec["batch"], rec["kv_len"], label, kk,
                              i == 0 or kk != kind, us, int(op["count_per_step"]), b, dirty, extra=i in extra))
        if extra:   # an op of several GEMMs streams its bytes through all of them: one streaming part
            first = next(k for k in reversed(out) if k.op == label and k.first)
            first.extra_us = sum(k.us for k in out if k.op == label and k.extra and k.file == rec["_file"])
            first.n_extra = len(extra)
    return out


@dataclass
class Value:
    """One fitted number of a profile, with what it was fitted to."""
    value: float
    note: str
    spread: float | None = None


@dataclass
class Fit:
    """A profile: per kind, its keys; plus the residuals of each fitted part (for the notes and tests)."""
    stack: str
    tables: dict[str, dict[str, Value]] = field(default_factory=dict)
    residuals: dict[str, list[tuple[str, float, float]]] = field(default_factory=dict)  # kind -> (what, meas, fit)
    files: list[str] = field(default_factory=list)


def _lstsq(x: np.ndarray, y: np.ndarray, relative: bool = False) -> np.ndarray:
    w = 1.0 / y if relative else np.ones_like(y)
    coef, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    return coef


def _rms_rel(meas: list[float], fit: list[float]) -> tuple[float, float]:
    rel = [(f - m) / m for m, f in zip(meas, fit, strict=True) if m > 0]
    return float(np.sqrt(np.mean(np.square(rel)))), max(rel, key=abs) if rel else 0.0


def fit_profile(run: Path, stack: str, gpu: str = "h200-calibrated") -> Fit:
    """The profile of ``stack`` from the single-op files in ``run`` (module docstring)."""
    if stack not in STACK_PROFILE:
        raise FitError(f"unknown stack {stack!r}; expected one of {', '.join(STACK_PROFILE)}")
    g = hwmodels.load(gpu)
    l2_B = g.l2.size_MiB * 2**20
    recs = load_ops(run, stack)
    fit = Fit(stack, files=[r["_file"] for r in recs])
    r0 = rates(g)
    cold_us = r0.first_load_us - r0.l2_latency_us
    ks = [k for r in recs for k in kernels(r, l2_B, cold_us)]
    cold = (f"; each unit's first kernel taken {cold_us:.2f} us faster (its inputs came from DRAM, in a step from "
            f"L2: {gpu}'s first load - L2 latency)")
    # 1. kernels per op, per kind: the stack's per step over mksim's per step
    per_file: dict[str, list[float]] = defaultdict(list)
    per_step_us: dict[tuple[str, str], float] = defaultdict(float)
    for r in recs:
        wl = mksim.models.workload(r["model"], batch=r["batch"], kv_len=r["kv_len"])
        n_ops: dict[str, int] = defaultdict(int)
        for op in wl.ops:
            n_ops[op.kind] += 1
        n_k: dict[str, int] = defaultdict(int)
        for k in ks:
            if k.file == r["_file"]:
                n_k[k.kind] += k.count
                per_step_us[(r["_file"], k.kind)] += k.us * k.count
        for kind, n in n_k.items():
            if kind not in n_ops:
                raise FitError(f"{r['_file']}: kernels of kind {kind} but {r['model']} has no such op")
            per_file[kind].append(n / n_ops[kind])
    kpo = {kind: float(np.mean(v)) for kind, v in per_file.items()}
    # 2. fixed-cost kinds: every kernel the kind's mean cost
    for kind in sorted(kpo):
        if kind in STREAMING:
            continue
        rows = []
        for r in recs:
            if (r["_file"], kind) in per_step_us:
                n = sum(k.count for k in ks if k.file == r["_file"] and k.kind == kind)
                rows.append((r["batch"], per_step_us[(r["_file"], kind)] / n, f"{r['model']} b{r['batch']} "
                             f"kv{r['kv_len']}"))
        f0, f1, note = _fit_rows(rows)
        fit.tables[kind] = {"task_fixed_us": Value(round(f0, 3), f"{len(rows)} files ({_files(fit)}): the kind's "
                                                   f"kernel time per step over its kernels per step; {note}{cold}")}
        if mksim.workload.get_kind(kind).per_row:
            fit.tables[kind]["task_row_us"] = Value(round(f1, 4), "same fit")
        fit.residuals[kind] = [(w, float(t), float(f0 + (b - 1) * f1)) for b, t, w in rows]
    # 3. continuation kernels of the streaming ops
    cont = [k for k in ks if not k.first and not k.extra and k.kind == kind_of(k.op) and k.kind in STREAMING]
    rows = [(k.batch, k.us, f"{k.model} b{k.batch} kv{k.kv_len} {k.op}") for k in cont]
    f0, f1, note = _fit_rows(rows)
    fit.tables[CONTINUATION_KIND] = {
        "task_fixed_us": Value(round(f0, 3), f"{len(cont)} kernels after the first of a streaming op (split-K "
                               f"reductions, residual adds; {_files(fit)}): {note}{cold}"),
        "task_row_us": Value(round(f1, 4), "same fit")}
    fit.residuals[CONTINUATION_KIND] = [(w, float(t), float(f0 + (b - 1) * f1)) for b, t, w in rows]
    # 4. streaming kinds: a + bytes / rate + w * dirty, w shared
    st = [k for k in ks if k.first and k.kind in STREAMING]
    kinds = [kd for kd in STREAMING if any(k.kind == kd for k in st)]
    cols = 2 * len(kinds) + 1
    xs = np.zeros((len(st), cols))
    for i, k in enumerate(st):
        j = kinds.index(k.kind)
        xs[i, 2 * j], xs[i, 2 * j + 1], xs[i, -1] = 1.0, float(k.bytes or 0.0) / 1e6, k.dirty / 1e6
    # an op of several GEMMs: their time together, less what mksim charges its other kernels (continuations)
    ys = np.array([k.us + k.extra_us - k.n_extra * (f0 + (k.batch - 1) * f1) for k in st])
    coef = _lstsq(xs, ys, relative=True)
    w_us_per_MB = float(coef[-1])
    for j, kind in enumerate(kinds):
        a, s = float(coef[2 * j]), float(coef[2 * j + 1])
        mine = [i for i, k in enumerate(st) if k.kind == kind]
        rms, worst = _rms_rel([ys[i] for i in mine], [float(xs[i] @ coef) for i in mine])
        targets = [(st[i], a + float(st[i].bytes or 0.0) / 1e6 * s) for i in mine]
        fixed, consume, cal = calibrate_stream(kind, targets, g)
        ops = sorted({f"{st[i].op}" for i in mine})
        note = (f"{len(mine)} single ops ({', '.join(ops)}; {_files(fit)}), the op's first kernel: least squares "
                f"on relative residuals of a + bytes / rate + w * dirty bytes: a = {a:.2f} us, rate = "
                f"{1e3 / s if s > 0 else math.inf:.0f} GB/s, w = {w_us_per_MB * 1e3:.3f} us/GB (L2 left dirty by "
                f"the eviction, shared by the streaming kinds, removed); residual rms {rms:.1%}, largest "
                f"{worst:+.1%}{cold}; then mksim's graph-mode kernel of each op calibrated to a + bytes / rate: {cal}")
        fit.tables[kind] = {"task_fixed_us": Value(round(fixed, 3), note), "consume_GBps": Value(round(consume, 2),
                                                                                               "same fit")}
        fit.residuals[kind] = [(f"{k.model} b{k.batch} kv{k.kv_len} {k.op}", k.us, float(xs[i] @ coef))
                               for i, k in zip(mine, [st[i] for i in mine], strict=True)]
    for kind, v in kpo.items():
        fewer = "; fewer than one (an op fused into another kind's kernel): one" if v < 1 else ""
        fit.tables.setdefault(kind, {})["kernels_per_op_count"] = Value(
            round(max(v, 1.0), 3), f"the stack's {kind} kernels per step over mksim's {kind} ops per step, mean of "
            f"{len(per_file[kind])} files (" + ", ".join(f"{x:.2f}" for x in per_file[kind]) + f"){fewer}")
    return fit


def _fit_rows(rows: list[tuple[int, float, str]]) -> tuple[float, float, str]:
    """``fixed + (batch - 1) * row`` by least squares over (batch, us, what) rows; row >= 0."""
    x = np.array([[1.0, b - 1.0] for b, _, _ in rows])
    y = np.array([t for _, t, _ in rows])
    f0, f1 = _lstsq(x, y)
    if f1 < 0:
        f0, f1 = float(np.mean(y)), 0.0
    rms, worst = _rms_rel(list(y), list(x @ [f0, f1]))
    return float(f0), float(f1), (f"least squares: fixed + (batch - 1) * row; residual rms {rms:.1%}, largest "
                                  f"{worst:+.1%}")


def _files(fit: Fit) -> str:
    models = sorted({f.split("-", 2)[2].rsplit("-b", 1)[0] for f in fit.files})
    return f"{', '.join(models)} at batch 1, 8 and kv 1024, 4096"


def single_op_workload(op: mksim.workload.Op, batch: int, kv_len: int) -> Workload:
    """One op of a model alone (its inputs taken as given), as a workload."""
    return Workload(name=op.name, ops=(replace(op, inputs=()),), tokens=batch,
                    batch=batch, kv_len=kv_len)


_MKSIM_OP = {"qkv": "qkv_proj", "o_proj": "o_proj", "gate_up": "gate_up_proj", "down": "down_proj",
             "lm_head": "lm_head", "attention": "attn_partial"}


def _span_us(kind: str, targets: list[tuple[Kernel, float]], g: Any, fixed: float, consume_GBps: float) -> list[float]:
    """mksim's graph-mode span of each target's op alone, with ``kind`` costing ``fixed`` and
    ``consume_GBps``."""
    cost = hwmodels.KernelCost(task_fixed_us=fixed, consume_GBps=consume_GBps)
    gg = replace(g, kernels=replace(g.kernels, per_kind={kind: cost}))
    out = []
    for k, _ in targets:
        wl = mksim.models.workload(k.model, batch=k.batch, kv_len=k.kv_len)
        name = _MKSIM_OP[k.op]
        op = next(o for o in wl.ops if o.name.split(".")[-1] == name)
        single = single_op_workload(op, k.batch, k.kv_len)
        r = mksim.simulate(mksim.build_schedule(single, gg, "graph"), timeline=False)
        out.append(float(r.per_op[0]["time_us"]))
    return out


def calibrate_stream(kind: str, targets: list[tuple[Kernel, float]], g: Any) -> tuple[float, float, str]:
    """``task_fixed_us`` and ``consume_GBps`` of ``kind`` with which mksim's graph-mode kernel of each
    target op takes its target time: with the span taken as ``o + fixed + B / consume`` (``o``, ``B``
    per op from two simulations), a least-squares solve on relative residuals, then checked by a
    third simulation (its residuals are in the returned note)."""
    c1, c2 = 5.0, 10.0
    s1 = np.array(_span_us(kind, targets, g, 0.0, c1))
    s2 = np.array(_span_us(kind, targets, g, 0.0, c2))
    beta = (s1 - s2) / (1 / c1 - 1 / c2)          # per op: span grows by beta / consume
    o = s1 - beta / c1
    t = np.array([tt for _, tt in targets])
    x = np.column_stack([np.ones_like(t), beta])
    fixed, inv_c = _lstsq_rel_offset(x, t, o)
    fixed = max(float(fixed), 0.0)
    consume = 1.0 / inv_c if inv_c > 0 else 1e5
    check = np.array(_span_us(kind, targets, g, fixed, consume))
    rms, worst = _rms_rel(list(t), list(check))
    return fixed, consume, f"mksim span vs target rms {rms:.1%}, largest {worst:+.1%}"


def _lstsq_rel_offset(x: np.ndarray, t: np.ndarray, o: np.ndarray) -> np.ndarray:
    w = 1.0 / t
    coef, *_ = np.linalg.lstsq(x * w[:, None], (t - o) * w, rcond=None)
    return coef


def to_toml(fit: Fit, run: Path, gpu: str = "h200-calibrated") -> str:
    """The profile file's text."""
    name = STACK_PROFILE[fit.stack]
    full = {"torch": "plain torch (eager ops) in one CUDA graph", "inductor":
            "torch.compile (Inductor, default mode) in one CUDA graph"}[name]
    lines = [f"# Implementation profile: {full}, fitted to the single ops of",
             f"# {run}/ops-{fit.stack}-*.json by",
             f"#   python -m validation stacks profile {run} --stack {fit.stack} --out hwmodels/profiles/{name}.toml",
             "# never to whole steps. How: validation/stacks/fit.py and docs/stacks.md (\"The profiles\").",
             "# Apply it with --gpu h200-calibrated+" + name + " (chain modes: an op of k kernels runs as k kernels).",
             "schema_version = 1", f'profile = "{name}"', f'full_name = "{full}"', f'measured_on = "{gpu}"',
             'kind = "stack"', ""]
    order = ["embed", "rmsnorm", "matmul", "rope_kv", "attn_partial", "attn_reduce", "silu_mul", CONTINUATION_KIND]
    for kind in sorted(fit.tables, key=lambda k: order.index(k) if k in order else 99):
        lines.append(f"[runtime.kernels.{kind}]")
        for key, v in fit.tables[kind].items():
            lines.append(f"{key} = {{ value = {_num(v.value)}, source = \"singleops\", note = {json.dumps(v.note)} }}")
        lines.append("")
    lines += ["[sources.singleops]", 'kind = "measured"',
              f'title = "single ops of the {fit.stack} stack on NVIDIA H200 (torch 2.11.0+cu130, CUDA 13.0)"',
              'date = "2026-12-01"',
              f'note = "raw results: {run}/ops-{fit.stack}-*.json (each op, or compiled function, run alone after a '
              f'256 MiB L2 eviction, 5 reps, torch.profiler kernel durations; validation/stacks/ops.py)"', ""]
    return "\n".join(lines)


def _num(v: float) -> str:
    return repr(float(v)) if not float(v).is_integer() else str(int(v))
