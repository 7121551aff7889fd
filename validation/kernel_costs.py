"""Per-task costs of the generated kernels' device functions, fitted to single ops.

The validation runner times every distinct op of a ``graph``-mode case alone, as one kernel, and
keeps its tasks' compute times from the kernel's trace (``Runner.time_ops`` in
:mod:`validation.megakernel.gpu`; ``cases[i]["measurement"]["single_ops"]`` of a suite's
``measured.json``). One record per op::

    {"op", "kind", "N", "K", "tiles", "us", "spread_us", "streamed_B", "GBps",
     "task_us_mean", "task_us_max", "task_B_mean", "start_spread_us"}

and, added here from the case, ``"batch"`` (rows per task; 1 where absent). :func:`fit` turns them
into the ``[runtime.kernels.<kind>]`` task costs the simulator applies (docs/model.md, "What a task
costs"), per op kind, in the form the kind's description declares (``mksim.workload.KINDS``:
``streams``, ``per_row``, and so ``cost_fields``):

- kinds that stream bytes (``matmul``, ``attn_partial``): the line ``task_us_mean = fixed +
  task_B_mean / consume`` over the shapes measured, by least squares on relative residuals (task
  times span 1 to 250 µs; plain least squares would follow the largest alone). With one byte size
  only, fixed and rate cannot be told apart: the task's time is taken as all consumption
  (``fixed = 0``, the rate its bytes over its time), so that it scales with its bytes;
- the others: ``fixed`` = the mean of ``task_us_mean``;
- kinds whose tasks do every row of the batch (``embed``, ``rmsnorm``, ``matmul``, ``rope_kv``,
  ``silu_mul``), measured at more than one batch: each row beyond the first adds ``row`` to the
  fixed part (plain least squares, a line in rows) and, for ``matmul``, ``bytes / consume_row``
  to the consumption (relative least squares, as above). Attention tasks do one sequence each;
- kinds whose bytes go through the weight ring (``pages``: ``matmul``), measured at more than one
  page size (each record's ``page_KiB`` and ``depth``: the ring it ran with; 32 KiB and 4 where a
  record has none, as every run before they were recorded): the workers consume a page no faster
  than the ring delivers one, ``bulk_copy_latency + page / bulk_copy_rate + page_us``
  (:func:`mksim.costs.ring_page_us`, with the GPU's bulk-copy numbers and the profile's copies in
  flight; a ring of one page: that, then the page's consumption), so a task takes
  ``fixed + bytes * max(1 / consume, ring's time per page / page)`` (:func:`mksim.costs.device_task_us`).
  ``page_us`` is searched (0 to 2 µs); at each value the records the ring holds back lose their
  consumption term and the rest is least squares as above, until that split settles. Where no
  record is held back, ``page_us`` is 0 (the data bound it from above only, the note says so).

Mixture-of-experts single ops (``validation.megakernel.moe_ops``): ``topk`` (one task: the layer's
routing, the simulator's serial point) and ``combine`` (a row kind) are fitted as above. The expert
matmuls (records with ``experts_op``: their tasks' time and bytes over the slots their route table
made active) run the matmul's device function, so they are not fitted into a table of their own
(the simulator prices them with the ``matmul`` table) nor into the dense ``matmul`` fit, whose
predictions they would move: :func:`expert_check` holds them against the ``matmul`` table instead.

A coefficient that comes out negative is fixed at 0 and the rest refitted. ``spread`` is the
larger of the fit's largest relative residual and the median within-op spread of the task times
(``task_us_max / task_us_mean - 1``); the note names the shapes and the residuals.

Never fit these to full steps: those are the held-out validation.

Inputs: a suite's ``measured.json`` (``cases[i].measurement.single_ops``), the rows that
``python -m validation megakernel --single-ops --json F`` writes (each row's ``single_ops``, with
its model, batch and ring), or plain lists of records.

Run ``python -m validation kernel-costs MEASURED.json [...] --out FILE``: it writes the
``[runtime.kernels.<kind>]`` tables as TOML lines; ``--profile hwmodels/profiles/mksim.toml``
writes them into the implementation profile itself (its other tables, its header and its sources
kept; a key these records cannot determine — the row terms from one batch, ``page_us`` from one
page size — is kept from the profile and named). ``--kinds attn_partial,attn_reduce`` fits those
kinds only, from the records of those kinds, and leaves the profile's other tables as they are: for
a change to one device function, its single ops measured again without refitting the rest. The
header then keeps the command of the other tables and adds this one after it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

import hwmodels
from mksim.costs import DeviceCost, Rates, device_task_us, rates, ring_page_us
from mksim.errors import MksimError
from mksim.workload import KINDS as OP_KINDS

# the kinds the generated kernels run (the only ones with single ops to fit), and their fit forms
KINDS = tuple(k.name for k in OP_KINDS.values() if k.opcode is not None)
STREAMING = tuple(k for k in KINDS if OP_KINDS[k].streams)
PER_ROW = tuple(k for k in KINDS if OP_KINDS[k].per_row)
PAGED = tuple(k for k in KINDS if OP_KINDS[k].pages)
NEEDED = ("op", "kind", "task_us_mean", "task_B_mean")
PAGE_KiB, DEPTH = 32.0, 4  # the ring of a record that names none: every run before records named theirs
PAGE_US_MAX = 2.0  # the per-page cost searched, µs


def fit(single_ops: list[dict], *, dram_bound_GBps: float | None = None,
        ring: Rates | None = None) -> dict[str, dict[str, dict]]:
    """``[runtime.kernels.<kind>]`` task costs from single-op records (see the module docstring).

    Returns ``{kind: {key: {"value", "spread", "note"}}}`` for the kinds present (keys
    ``task_fixed_us``, ``consume_GBps``, ...: ``hwmodels.KernelCost``); records of kinds without
    a device function are left out.
    ``dram_bound_GBps``: records whose op streamed at least this many GB/s over the whole chip are
    DRAM-bound (their tasks wait for DRAM, not for their workers) and are left out of the fits of
    the streaming kinds, named in the note.
    ``ring``: the simulator's rates of the GPU and profile the kernels ran on
    (:func:`mksim.costs.rates`: their bulk copies and the ring's copies in flight); with it, and
    records at more than one page size, the kinds whose bytes go through the pages get ``page_us``.

    >>> recs = [{"op": f"m{b}", "kind": "matmul", "task_B_mean": b, "task_us_mean": 1.0 + b / 25e3}
    ...         for b in (65536, 262144)]
    >>> {k: round(v["value"], 3) for k, v in fit(recs)["matmul"].items()}
    {'task_fixed_us': 1.0, 'consume_GBps': 25.0}
    """
    recs = [_checked(r, i) for i, r in enumerate(_as_list(single_ops))]
    # ops timed with L2 flushed before each launch (as they run in a step) are what a fit wants;
    # records without the key come from runs that timed them warm
    if any(r.get("l2") == "flushed" for r in recs):
        recs = [r for r in recs if r.get("l2") == "flushed"]
    recs = [r for r in recs if not r.get("experts_op")]  # held against the matmul table: expert_check
    out: dict[str, dict[str, dict]] = {}
    for kind in KINDS:
        rs = [r for r in recs if r["kind"] == kind]
        if not rs:
            continue
        left_out: list[dict] = []
        if kind in STREAMING and dram_bound_GBps is not None:
            left_out = [r for r in rs if r.get("GBps", 0.0) >= dram_bound_GBps]
            rs = [r for r in rs if r.get("GBps", 0.0) < dram_bound_GBps]
            if not rs:
                raise MksimError(f"every {kind} record streamed at {dram_bound_GBps:g} GB/s or more (DRAM-bound); "
                                 "lower --dram-bound-GBps or measure smaller shapes")
        out[kind] = _fit_kind(kind, rs, left_out, ring)
    return out


def _as_list(single_ops: Any) -> list:
    if not isinstance(single_ops, list) or not single_ops:
        raise MksimError("no single-op records: expected a non-empty list (graph-mode cases of a measured.json "
                         "measured with single ops)")
    return single_ops


def _checked(r: Any, i: int) -> dict:
    if not isinstance(r, dict):
        raise MksimError(f"single-op record {i} is {type(r).__name__}, not an object")
    for key in NEEDED:
        if key not in r:
            raise MksimError(f"single-op record {i} ({r.get('op', '?')}) has no {key!r}")
    if not isinstance(r["kind"], str):
        raise MksimError(f"single-op record {i} ({r['op']}): kind must be a string, got {r['kind']!r}")
    for key, least in (("task_us_mean", 0.0), ("task_B_mean", 0.0), ("batch", 1.0), ("page_KiB", 0.5),
                       ("depth", 1.0)):
        if key in ("page_KiB", "depth") and r.get(key) is None:
            continue
        v = r.get(key, 1)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < least \
                or (key == "task_us_mean" and v <= 0):
            raise MksimError(f"single-op record {i} ({r['op']}): {key} = {v!r}; expected a "
                             f"{'non-negative' if key in ('task_B_mean', 'batch') else 'positive'} number"
                             + (f" of at least {least:g}" if least > 0 else ""))
    return r


def _lstsq(cols: dict[str, np.ndarray], t: np.ndarray, w: np.ndarray) -> dict[str, float]:
    """Least squares ``t ≈ Σ c_j col_j`` weighted by ``w``, every coefficient >= 0 (a negative one
    is fixed at 0 and the rest refitted); columns the data cannot tell apart are dropped last first."""
    names = list(cols)
    while True:
        A = np.column_stack([cols[n] for n in names]) * w[:, None]
        if np.linalg.matrix_rank(A) < len(names):  # e.g. more batches of one shape only
            names.pop()
            continue
        coef = np.linalg.lstsq(A, t * w, rcond=None)[0]
        neg = [n for n, c in zip(names, coef, strict=True) if c < 0]
        if not neg:
            return {n: float(c) for n, c in zip(names, coef, strict=True)} | {n: 0.0 for n in cols if n not in names}
        names.remove(min(neg, key=lambda n: coef[names.index(n)]))
        if not names:
            return {n: 0.0 for n in cols}


def _fit_kind(kind: str, rs: list[dict], left_out: list[dict], ring: Rates | None = None) -> dict[str, dict]:
    t = np.array([r["task_us_mean"] for r in rs], dtype=float)
    B = np.array([r["task_B_mean"] for r in rs], dtype=float)
    rows = np.array([r.get("batch", 1) if kind in PER_ROW else 1 for r in rs], dtype=float)
    page = np.array([(r.get("page_KiB") or PAGE_KiB) * 1024 for r in rs], dtype=float)
    depth = np.array([r.get("depth") or DEPTH for r in rs], dtype=float)
    extra = rows - 1
    by_rows = bool(np.ptp(rows) > 0)
    streams = kind in STREAMING and bool(B.max() > 0)
    paged = (streams and kind in PAGED and ring is not None and ring_page_us(1.0, ring) > 0
             and len(set(page.tolist())) > 1)
    how: str
    page_us: float | None = None
    if streams:
        one_size = len(set(B.tolist())) == 1
        cols: dict[str, np.ndarray] = {}
        if not one_size or paged:
            cols["fixed"] = np.ones_like(t)
        cols["per_B"] = B
        if by_rows:
            if not one_size or paged:
                cols["row"] = extra
            cols["row_per_B"] = B * extra
        if paged:
            assert ring is not None
            c, page_us, held = _fit_pages(cols, t, B, rows, page, depth, ring)
            sizes = ", ".join(f"{k:g}" for k in sorted({p / 1024 for p in page[held]}))
            how = ("least squares on relative residuals: fixed + bytes x max(1 / rate, the ring's time per page / "
                   f"page), page_us searched: {int(held.sum())} of {len(t)} held back by the ring"
                   + (f" ({sizes} KiB pages)" if sizes else "; none held back: page_us bounded from above only"))
        else:
            c = _lstsq(cols, t, 1.0 / t)
            how = ("one byte size only: the task's time taken as all consumption (fixed 0)" if one_size else
                   "least squares on relative residuals: fixed + bytes / rate")
    else:
        cols = {"fixed": np.ones_like(t)}
        if by_rows:
            cols["row"] = extra
        c = _lstsq(cols, t, np.ones_like(t))
        how = "mean of the task times" if not by_rows else "least squares: fixed + (rows - 1) * row"
    fitted = _predict(c, B, rows, page, depth, ring if paged else None, page_us or 0.0)
    rel = fitted / t - 1
    within = statistics.median(max(r.get("task_us_max", r["task_us_mean"]) / r["task_us_mean"] - 1, 0.0) for r in rs)
    worst = int(np.argmax(np.abs(rel)))
    spread = max(float(np.abs(rel).max()), within)
    shapes = ", ".join(dict.fromkeys(_shape(r) for r in rs))
    batches = ", ".join(str(b) for b in sorted({r.get("batch", 1) for r in rs}))
    rings = ""
    if paged:
        pairs = sorted({(p / 1024, d) for p, d in zip(page, depth, strict=True)})
        rings = "; rings " + ", ".join(f"{p:g}x{d:g}" for p, d in pairs)
    note = (f"{len(rs)} single ops ({shapes}; batch {batches}{rings}); {how}; residual rms "
            f"{_pct(np.sqrt(np.mean(rel ** 2)))}, largest {_pct(rel[worst], sign=True)} ({_case(rs[worst])}); "
            f"task times within an op +{_pct(within)} (median of max/mean)")
    if left_out:
        note += "; left out as DRAM-bound: " + ", ".join(f"{_case(r)} at {r['GBps']:.0f} GB/s" for r in left_out)
    out = {"task_fixed_us": c.get("fixed", 0.0)}
    if by_rows:
        out["task_row_us"] = c.get("row", 0.0)
    if streams:
        if c.get("per_B", 0.0) > 0:
            out["consume_GBps"] = 1.0 / c["per_B"] / 1e3  # B/µs -> GB/s
        if by_rows and c.get("row_per_B", 0.0) > 0:
            out["consume_row_GBps"] = 1.0 / c["row_per_B"] / 1e3
    if page_us is not None:
        out["page_us"] = page_us
    return {k: {"value": v, "spread": spread, "note": note} for k, v in out.items()}


def _cost(c: dict[str, float]) -> DeviceCost:
    """The simulator's cost of a kind from the fit's coefficients (per byte in µs)."""
    per, row_per = c.get("per_B", 0.0), c.get("row_per_B", 0.0)
    return DeviceCost(fixed_us=c.get("fixed", 0.0), row_us=c.get("row", 0.0),
                      consume_Bpus=1.0 / per if per > 0 else math.inf,
                      row_consume_Bpus=1.0 / row_per if row_per > 0 else math.inf)


def _predict(c: dict[str, float], B: np.ndarray, rows: np.ndarray, page: np.ndarray, depth: np.ndarray,
             ring: Rates | None, page_us: float) -> np.ndarray:
    """Each record's task time as the simulator costs it (:func:`mksim.costs.device_task_us`), with
    the ring of the record where ``ring`` is given."""
    cost = _cost(c)
    out = np.empty(len(B))
    for i in range(len(B)):
        per_page = ring_page_us(page[i], ring, page_us) if ring is not None else 0.0
        out[i] = device_task_us(0.0, B[i], rows[i], cost, 1.0, page[i], per_page, int(depth[i]))[0]
    return out


def _fit_pages(cols: dict[str, np.ndarray], t: np.ndarray, B: np.ndarray, rows: np.ndarray, page: np.ndarray,
               depth: np.ndarray, ring: Rates) -> tuple[dict[str, float], float, np.ndarray]:
    """The coefficients and ``page_us`` of a kind whose bytes go through the ring (module docstring),
    and which records the ring holds back at that ``page_us``."""
    copy = np.array([ring_page_us(p, ring) for p in page])
    extra = rows - 1
    one = depth < 2  # a ring of one page: its copy, then its consumption

    def at(q: float) -> tuple[float, dict[str, float], np.ndarray]:
        ring_B = (copy + q) / page
        c = _lstsq(cols, t, 1.0 / t)
        held = np.zeros(len(t), dtype=bool)
        for it in range(25):
            per = c.get("per_B", 0.0) + c.get("row_per_B", 0.0) * extra
            now = ring_B + np.where(one, per, 0.0) > per
            if it > 0 and (now == held).all():
                break
            held = now
            keep = ~held | one  # records that keep their consumption term
            sub = {n: v if n in ("fixed", "row") else v * keep for n, v in cols.items()}
            c = _lstsq(sub, t - B * ring_B * held, 1.0 / t)
        rel = _predict(c, B, rows, page, depth, ring, q) / t - 1
        return float(np.sqrt(np.mean(rel ** 2))), c, held

    grid = np.linspace(0.0, PAGE_US_MAX, 201)
    best = min(grid, key=lambda q: at(float(q))[0])
    fine = np.linspace(max(best - 0.01, 0.0), best + 0.01, 41)
    q = float(min(fine, key=lambda x: at(float(x))[0]))
    _, c, held = at(q)
    if not held.any():
        q = 0.0
        _, c, held = at(q)
    return c, q, held


def expert_check(recs: list[dict], cost: DeviceCost, ring: Rates | None = None, page_us: float = 0.0) -> list[dict]:
    """The expert matmuls' single ops (``experts_op`` records) against a ``matmul`` cost: per record,
    the measured time of an active slot's task, the cost's at the rows the kernel computes
    (``task_rows``: every token's) and at those the simulator charges (``group_rows_mean``), and
    the relative errors of both. ``ring`` (the simulator's rates): each record's ring held as
    :func:`_predict` holds it.

    >>> from mksim.costs import DeviceCost
    >>> r = {"op": "L0.experts_down", "kind": "matmul", "experts_op": True, "task_us_mean": 2.0,
    ...      "task_B_mean": 25e3, "task_rows": 1, "group_rows_mean": 1.0, "batch": 1}
    >>> c = expert_check([r], DeviceCost(fixed_us=1.0, row_us=0.0, consume_Bpus=25e3, row_consume_Bpus=math.inf))
    >>> c[0]["table_us"], c[0]["error"]
    (2.0, 0.0)
    """
    out = []
    for r in recs:
        if not r.get("experts_op") or "task_us_mean" not in r:
            continue
        page = (r.get("page_KiB") or PAGE_KiB) * 1024
        depth = int(r.get("depth") or DEPTH)
        per_page = ring_page_us(page, ring, page_us) if ring is not None else 0.0

        def at(rows: float, r: dict = r, page: float = page, depth: int = depth, per_page: float = per_page) -> float:
            return float(device_task_us(0.0, r["task_B_mean"], rows, cost, 1.0, page, per_page, depth)[0])

        rows, sim_rows = float(r.get("task_rows", r.get("batch", 1))), float(r.get("group_rows_mean", 1.0))
        t = float(r["task_us_mean"])
        out.append({"op": r["op"], "model": r.get("model"), "batch": r.get("batch", 1), "measured_us": t,
                    "table_us": at(rows), "error": at(rows) / t - 1, "sim_rows": sim_rows,
                    "table_sim_rows_us": at(sim_rows), "sim_error": at(sim_rows) / t - 1,
                    "exit_us": r.get("exit_us_mean")})
    return out


def _shape(r: dict) -> str:
    """``qkv_proj 3072x2048`` (N x K), ``attn_partial 52429 B`` (bytes per task), ``silu_mul 8192``."""
    name = str(r["op"]).rsplit(".", 1)[-1]
    if r.get("K"):
        return f"{name} {r['N']}x{r['K']}"
    if r["task_B_mean"] > 1024:
        return f"{name} {r['task_B_mean']:.0f} B"
    return f"{name} {r['N']}" if r.get("N") else name


def _case(r: dict) -> str:
    where = f" {r['model']}" if r.get("model") else ""
    return f"{_shape(r)}{where} b{r.get('batch', 1)}: {r['task_us_mean']:.2f} us"


def _pct(x: float, sign: bool = False) -> str:
    return f"{x:+.1%}" if sign else f"{x:.1%}"


# -- reading measurements, writing the fragment ---------------------------------------------------
def records(docs: list[Any]) -> list[dict]:
    """Single-op records of suite ``measured.json`` documents (``cases[i].measurement.single_ops``),
    of the rows ``python -m validation megakernel --json`` writes (``rows[i].single_ops``) or of
    plain lists of records; each record of a case or row is given its ``batch`` and ``model``, and
    the ring its kernel ran with (``page_KiB``, ``depth``) where the record does not name it."""
    out: list[dict] = []
    for doc in docs:
        if isinstance(doc, list):
            for item in doc:
                out += _of_run(item, item) if isinstance(item, dict) and "single_ops" in item else [item]
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list):
            raise MksimError("expected a validation measured.json (with \"cases\"), the --json rows of python -m "
                             "validation.megakernel, or a list of single-op records")
        for case in doc["cases"]:
            out += _of_run(case.get("measurement") or {}, case)
    return out


def _of_run(m: dict, case: dict) -> list[dict]:
    """The single-op records of one measurement (``validation.megakernel.gpu.measure``'s result)."""
    kernel = m.get("kernel") or {}
    ring = {"page_KiB": kernel["page_B"] / 1024} if kernel.get("page_B") else {}
    if kernel.get("depth"):
        ring["depth"] = kernel["depth"]
    return [{"batch": case.get("batch", 1), "model": case.get("model"), **ring, **r} for r in m.get("single_ops") or []]


def _num(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.6g}"


def fragment(params: dict[str, dict[str, dict]], source: str = "calibration", header: str = "") -> str:
    """TOML ``[runtime.kernels.<kind>]`` tables of :func:`fit`'s costs, in the style of the
    calibrated overlay."""
    lines = [f"# {line}" for line in header.splitlines()] if header else []
    for kind, costs in params.items():
        lines += ["", f"[runtime.kernels.{kind}]"]
        for key, p in costs.items():
            note = p["note"].replace("\\", "\\\\").replace('"', '\\"')
            lines.append(f'{key} = {{ value = {_num(p["value"])}, source = "{source}", spread = {p["spread"]:.4f}, '
                         f'note = "{note}" }}')
    return "\n".join(lines) + "\n"


def undetermined(kind: str, recs: list[dict]) -> set[str]:
    """The keys of ``kind`` that its records cannot determine: the row terms where they are all of
    one batch, ``page_us`` where they all ran one page size.

    >>> sorted(undetermined("matmul", [{"kind": "matmul", "batch": 1}]))
    ['consume_row_GBps', 'page_us', 'task_row_us']
    """
    rs = [r for r in recs if r.get("kind") == kind]
    out = set()
    if len({r.get("batch", 1) for r in rs}) < 2:
        out |= {"task_row_us", "consume_row_GBps"}
    if len({r.get("page_KiB") or PAGE_KiB for r in rs}) < 2:
        out.add("page_us")
    return out & set(OP_KINDS[kind].cost_fields)


#: How a profile's header names the command that fitted it: today's, and the module path profiles
#: fitted before ``python -m validation`` name (kept as they ran; replaced on the next fit).
COMMAND_PREFIXES = ("#   python -m validation kernel-costs", "#   python -m validation.kernel_costs")


def write_profile(path: Path, params: dict[str, dict[str, dict]], recs: list[dict], command: str,
                  source: str = "calibration", add_command: bool = False) -> list[str]:
    """Put the fitted ``[runtime.kernels.<kind>]`` tables into the implementation profile at
    ``path``, in place: each fitted kind's table is replaced, every other line (header, the ring's
    copies in flight, sources, validation record) kept, and the header's ``python -m
    validation kernel-costs`` commands made ``command`` (``add_command``: ``command`` added after
    them, for a refit of some kinds only). A key of a fitted kind that ``recs``
    cannot determine (:func:`undetermined`) is kept from the profile; returns those keys
    (``matmul.task_row_us``). The profile is checked (every value in its range) before it is
    written; a bad one is refused in one line."""
    lines = path.read_text().splitlines()
    kept: list[str] = []
    for kind, costs in params.items():
        body = fragment({kind: costs}, source).strip().splitlines()[1:]
        header = f"[runtime.kernels.{kind}]"
        if header in lines:
            i = lines.index(header)
            j = i + 1
            while j < len(lines) and lines[j].strip() and not lines[j].startswith(("[", "#")):
                j += 1
            old = {ln.split("=", 1)[0].strip(): ln for ln in lines[i + 1:j] if "=" in ln}
            for key in sorted(undetermined(kind, recs) - set(costs)):
                if key in old:
                    body.append(old[key])
                    kept.append(f"{kind}.{key}")
            lines[i + 1:j] = body
        else:
            tables = [k for k, ln in enumerate(lines) if ln.startswith("[runtime.kernels")]
            j = (tables[-1] + 1) if tables else len(lines)
            while j < len(lines) and lines[j].strip() and not lines[j].startswith("["):
                j += 1
            lines[j:j] = ["", header, *body]
    cmd = [k for k, ln in enumerate(lines) if ln.startswith(COMMAND_PREFIXES)]
    if cmd:
        blocks = []
        for k in cmd:
            end = k + 1
            while end < len(lines) and lines[end].startswith("#     "):
                end += 1
            blocks.append((k, end))
        if add_command:
            end = blocks[-1][1]
            lines[end:end] = _wrapped(command)
        else:
            for k, end in reversed(blocks[1:]):
                del lines[k:end]
            lines[blocks[0][0]:blocks[0][1]] = _wrapped(command)
    new = path.with_name(path.name + ".new")
    new.write_text("\n".join(lines) + "\n")
    try:
        hwmodels.load("h200-calibrated", profile=str(new))
    except hwmodels.HardwareError as exc:
        new.unlink()
        raise MksimError(f"the refitted profile does not load: {exc}".splitlines()[0]) from None
    new.replace(path)
    return kept


def only_kinds(recs: list[dict], kinds: str) -> list[dict]:
    """The records of the comma-separated op ``kinds``; an unknown kind, or one the records do not
    have, is refused in one line.

    >>> [r["op"] for r in only_kinds([{"op": "a", "kind": "matmul"}, {"op": "b", "kind": "attn_reduce"}],
    ...                              "attn_reduce")]
    ['b']
    """
    want = [k.strip() for k in kinds.split(",") if k.strip()]
    if not want:
        raise MksimError("--kinds is empty; give op kinds such as attn_partial,attn_reduce")
    unknown = [k for k in want if k not in OP_KINDS]
    if unknown:
        raise MksimError(f"--kinds: unknown op kind {unknown[0]!r}; known: {', '.join(sorted(OP_KINDS))}")
    have = {r["kind"] for r in recs}
    missing = [k for k in want if k not in have]
    if missing:
        raise MksimError(f"--kinds: the records have no single op of kind {missing[0]!r}")
    return [r for r in recs if r["kind"] in want]


def _wrapped(command: str, width: int = 100) -> list[str]:
    """``command`` as profile header lines (``#   `` then continuations ``#     ``, ending in ``\\``)."""
    out: list[str] = []
    line = "#   "
    for word in command.split():
        if len(line) + len(word) + 2 > width and line.strip("# "):
            out.append(line + " \\")
            line = "#     "
        line += ("" if line.endswith(" ") else " ") + word
    return out + [line]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation kernel-costs", description=__doc__.splitlines()[0])
    ap.add_argument("measured", nargs="+", type=Path,
                    help="measured.json files (or folders holding one), python -m validation megakernel --json files")
    ap.add_argument("--out", type=Path, default=None, help="write the TOML lines here (default: standard output)")
    ap.add_argument("--profile", type=Path, default=None,
                    help="write the tables into this implementation profile instead (hwmodels/profiles/mksim.toml)")
    ap.add_argument("--gpu", default="h200-calibrated+mksim",
                    help="the GPU and profile whose bulk copies and ring the page cost is fitted beside "
                         "(default: h200-calibrated+mksim)")
    ap.add_argument("--source", default="calibration", help="the source id the lines name (default: calibration)")
    ap.add_argument("--dram-bound-GBps", type=float, default=None,
                    help="leave out of the streaming kinds' fits the ops that streamed at least this fast")
    ap.add_argument("--kinds", default=None,
                    help="comma-separated op kinds: fit only these (the profile's other tables are kept)")
    a = ap.parse_args(argv)
    try:
        docs = []
        for p in a.measured:
            f = p / "measured.json" if p.is_dir() else p
            try:
                docs.append(json.loads(f.read_text()))
            except (OSError, json.JSONDecodeError) as exc:
                raise MksimError(f"{f}: cannot read ({exc.__class__.__name__}: {exc})".splitlines()[0]) from None
        try:
            ring = rates(hwmodels.load(a.gpu))
        except hwmodels.HardwareError as exc:
            raise MksimError(f"--gpu {a.gpu}: {exc}".splitlines()[0]) from None
        recs = all_recs = records(docs)
        if a.kinds is not None:
            recs = only_kinds(recs, a.kinds)
        params = fit(recs, dram_bound_GBps=a.dram_bound_GBps, ring=ring)
        names = " ".join(str(p) for p in a.measured)
        if a.profile is not None:
            command = f"python -m validation kernel-costs {names} --profile {a.profile}" + (
                f" --dram-bound-GBps {a.dram_bound_GBps:g}" if a.dram_bound_GBps is not None else "") + (
                f" --gpu {a.gpu}" if a.gpu != "h200-calibrated+mksim" else "") + (
                f" --kinds {a.kinds}" if a.kinds is not None else "")
            kept = write_profile(a.profile, params, recs, command, a.source, add_command=a.kinds is not None)
    except MksimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = sys.stdout
    if a.profile is not None:
        print(f"wrote the [runtime.kernels.<kind>] tables of {', '.join(params)} into {a.profile}"
              + (f"; kept from it (these records cannot determine them): {', '.join(kept)}" if kept else ""))
    else:
        text = fragment(params, a.source, "[runtime.kernels.<kind>] task costs fitted to single ops by python -m "
                                          f"validation kernel-costs\nfrom {', '.join(str(p) for p in a.measured)}; "
                                          "put these tables in the overlay")
        if a.out:
            a.out.write_text(text)
        else:
            sys.stdout.write(text)
            report = sys.stderr
    for kind, costs in params.items():
        for key, p in costs.items():
            print(f"{kind + '.' + key:30s} {p['value']:10.4g}   spread {p['spread']:.1%}", file=report)
    if any(r.get("experts_op") for r in all_recs):
        mm = params.get("matmul")
        cost = (_cost({"fixed": mm["task_fixed_us"]["value"], "row": mm.get("task_row_us", {}).get("value", 0.0),
                       "per_B": 1e-3 / mm["consume_GBps"]["value"],
                       "row_per_B": 1e-3 / mm["consume_row_GBps"]["value"] if "consume_row_GBps" in mm else 0.0})
                if mm else ring.device.get("matmul"))
        page_us = mm["page_us"]["value"] if mm and "page_us" in mm else (cost.page_us if cost else 0.0)
        if cost is not None:
            print("expert matmuls (active slots) against the matmul table: measured, at the kernel's rows, at the "
                  "simulator's", file=report)
            for c in expert_check(all_recs, cost, ring, page_us):
                print(f"  {c['op']:22s} {c['model'] or '':14s} b{c['batch']}: {c['measured_us']:7.2f} us; "
                      f"{c['table_us']:7.2f} ({c['error']:+.0%}); {c['table_sim_rows_us']:7.2f} at "
                      f"{c['sim_rows']:.2f} rows ({c['sim_error']:+.0%})", file=report)
    return 0

