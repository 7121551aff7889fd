"""The tables and lines ``mksim``'s commands print of predictions, built from library data (no argument
handling here; :mod:`mksim.catalog` has those of the GPU models and built-in models).

Data first: :func:`workload_summary` is what ``mksim workload --json`` prints; the ``*_table`` functions
draw such data as rich tables.
"""

from __future__ import annotations

import textwrap
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

import hwmodels
from hwmodels import GPUSpec
from mksim.compare import assumptions
from mksim.console import make_table, si
from mksim.schedule import modes_on
from mksim.search import SearchResult, report_rows
from mksim.sim import CATEGORIES, SimResult
from mksim.target import gpu_spec
from mksim.workload import TaskGraph, Tiling, Workload

__all__ = ["SHORT_CATEGORIES", "TABLE_WIDTH", "absent_lines", "assumes_line", "breakdown_table", "compare_table",
           "floor_line", "gpu_absent_lines", "interval_line", "interval_lines", "search_lines", "search_table",
           "simulate_line", "stack_line", "sweep_table", "workload_summary", "workload_table"]


# -- workloads -------------------------------------------------------------------------------
def workload_summary(wl: Workload, g: GPUSpec, tasks_per_sm: float) -> tuple[dict[str, Any], TaskGraph]:
    """``mksim workload --json``'s summary of ``wl`` tiled on ``g``, and the task graph it counts."""
    graph = TaskGraph(wl, Tiling.for_sms(g.sm.count, tasks_per_sm))
    summary = wl.summary()
    summary.update(gpu=g.name, tasks=len(graph), task_edges=graph.n_edges(),
                   bandwidth_floor_us=wl.bandwidth_floor_us(g.dram.bandwidth_spec_GBps * 1e9),
                   bandwidth_floor_reachable_us=wl.bandwidth_floor_us(g.hbm_bandwidth_Bps),
                   params=wl.model.param_count() if wl.model is not None else None)
    return summary, graph


def workload_table(wl: Workload, g: GPUSpec, graph: TaskGraph) -> Table:
    t = make_table(f"{wl.name} on {g.full_name}", ("op kind", "ops", "tasks", "weights", "KV cache", "FLOPs"),
                   left=("op kind",))
    by_kind: dict[str, list[float]] = {}
    for i, op in enumerate(wl.ops):
        acc = by_kind.setdefault(op.kind, [0, 0, 0.0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += int(graph.n_tiles[i])
        acc[2] += op.weight_bytes
        acc[3] += op.kv_read_bytes + op.kv_write_bytes
        acc[4] += op.flops
    for kind, (n, tasks, wb, kv, fl) in by_kind.items():
        t.add_row(kind, str(n), str(tasks), si(wb, "B"), si(kv, "B"), si(fl, "FLOP"))
    t.add_row("total", str(len(wl.ops)), str(len(graph)), si(wl.weight_bytes, "B"), si(wl.kv_bytes, "B"),
              si(wl.flops, "FLOP"), style="bold")
    return t


def floor_line(wl: Workload, g: GPUSpec, summary: dict[str, Any]) -> str:
    return (f"bytes a step must move: {si(wl.min_dram_bytes, 'B')}; bandwidth floor on {g.name}: "
            f"{summary['bandwidth_floor_us']:.1f} µs at the spec {g.dram.bandwidth_spec_GBps:g} GB/s, "
            f"{summary['bandwidth_floor_reachable_us']:.1f} µs at the reachable "
            f"{g.hbm_bandwidth_Bps / 1e9:.0f} GB/s")


# -- simulation ---------------------------------------------------------------------------------
#: The breakdown categories' column headings in :func:`compare_table` (short, on two lines, so the
#: breakdown fits 80 columns beside the longest mode name).
SHORT_CATEGORIES = {"memory": "memory", "compute": "compute", "launch": "launch", "barrier wait": "barrier\nwait",
                    "dependency wait": "dep.\nwait", "bubble": "bubble", "tail idle": "tail\nidle"}
#: The width :func:`compare_table` keeps to: a terminal's, whatever the console's.
TABLE_WIDTH = 80


def _us(v: float) -> str:
    """µs in at most 6 characters up to a second (one decimal below 10 ms)."""
    return f"{v:.1f}" if abs(v) < 1e4 else f"{v:.0f}"


def absent_lines(d: dict[str, Any], width: int = TABLE_WIDTH) -> list[str]:
    """The modes a comparison left out (``d["absent"]``) and why, in lines of at most ``width``
    characters (a mode's reason goes on indented).

    >>> absent_lines({"absent": {"graph_pdl": "l40s has no programmatic dependent launch"}})
    ['graph_pdl left out: l40s has no programmatic dependent launch']
    """
    lines: list[str] = []
    for mode, why in d.get("absent", {}).items():
        lines += textwrap.wrap(f"{mode} left out: {why}", width, subsequent_indent="  ", break_on_hyphens=False)
    return lines


def gpu_absent_lines(gpu: str | GPUSpec, width: int = TABLE_WIDTH) -> list[str]:
    """:func:`absent_lines` for every mode ``gpu`` cannot run (what ``mksim search`` and ``mksim sweep``
    leave out there).

    >>> gpu_absent_lines("h200-datasheet"), len(gpu_absent_lines("l40s"))
    ([], 2)
    """
    g = gpu_spec(gpu)
    return absent_lines({"absent": modes_on(g)[1]}, width)


def compare_table(d: dict[str, Any]) -> RenderableType:
    """:func:`mksim.compare.compare_modes`'s result as two tables that fit 80 columns: a row per mode
    and design (latency, tokens/s, HBM utilisation, speed-up), the modes the GPU lacks with the
    reason, then where each row's time went (µs per category, averaged over SMs)."""
    t = make_table(f"{d['workload']} on {d['gpu']} (bandwidth floor {d['bandwidth_floor_us']:.1f} µs)",
                   ("mode", "latency µs", "tokens/s", "HBM util", "vs stream"), left=("mode",))
    for mode, row in d["modes"].items():
        label = mode + (f" ({row['policy']})" if row["policy"] and mode.startswith("megakernel") else "")
        t.add_row(label, _us(row["latency_us"]), f"{row['tokens_per_s']:.0f}", f"{row['hbm_util']:.0%}",
                  f"{row['speedup_vs_stream']:.2f}×")
    parts: list[RenderableType] = [t]
    if "assumes" in d:
        parts.append(Text(textwrap.fill(d["assumes"]["text"], TABLE_WIDTH)))
    if "interval" in d:
        for line in interval_lines(d):
            parts.append(Text(textwrap.fill(line, TABLE_WIDTH)))
    st = d.get("stack")
    if st:
        parts.append(Text(textwrap.fill(stack_line(st), TABLE_WIDTH)))
    absent = absent_lines(d)
    if absent:
        parts.append(Text("\n".join(absent), no_wrap=True))
    b = Table(title="where the time went (µs, averaged over SMs)", box=box.SIMPLE_HEAD, show_edge=False,
              padding=(0, 1, 0, 0), pad_edge=False)
    b.add_column("mode", justify="left")
    for c in CATEGORIES:
        b.add_column(SHORT_CATEGORIES.get(c, c), justify="right")
    for mode, row in d["modes"].items():
        b.add_row(mode, *(_us(row["breakdown_us"][c]) for c in CATEGORIES))
    parts.append(b)
    return Group(*parts)


def _span(iv: list[float | None] | None, fmt: str = ".1f", unit: str = "") -> str:
    """``" (lo-hi unit)"`` of an interval, ``""`` where it is unknown."""
    if iv is None:
        return ""
    lo, hi = iv
    return f" ({format(lo or 0.0, fmt)}-{'∞' if hi is None else format(hi, fmt)}{unit})"


def interval_lines(d: dict[str, Any]) -> list[str]:
    """The lines under a comparison that say how sure its latencies are: one per mode family
    (``d["intervals"]``: chain and persistent modes) where their intervals differ, else one.

    >>> b = {"half_width_pct": 10.0, "text": "x"}
    >>> interval_lines({"interval": b, "intervals": {"chain": b, "persistent": b}})
    ['90 % interval: latency / (1 ± 10.0 %), from x']
    >>> interval_lines({"interval": b, "intervals": {"chain": {**b, "half_width_pct": 5.0}, "persistent": b}})
    ['chain modes: 90 % interval: latency / (1 ± 5.0 %), from x', 'persistent modes (the megakernel): 90 % \
interval: latency / (1 ± 10.0 %), from x']
    """
    fams = d.get("intervals") or {}
    if len({(b["half_width_pct"], b["text"]) for b in fams.values()}) <= 1:
        return [interval_line(d["interval"])]
    words = {"chain": "chain modes", "persistent": "persistent modes (the megakernel)"}
    return [f"{words.get(f, f)}: {interval_line(b)}" for f, b in fams.items()]


def interval_line(basis: dict[str, Any]) -> str:
    """The line under a comparison that says how sure its latencies are.

    >>> interval_line({"half_width_pct": None, "text": "interval unknown: no profile"})
    'interval unknown: no profile'
    >>> interval_line({"half_width_pct": 10.0, "text": "the p90 |error| on 5 cases"})
    '90 % interval: latency / (1 ± 10.0 %), from the p90 |error| on 5 cases'
    """
    if basis["half_width_pct"] is None:
        return str(basis["text"])
    return f"90 % interval: latency / (1 ± {basis['half_width_pct']:.1f} %), from {basis['text']}"


def stack_line(st: dict[str, Any]) -> str:
    """The ``stack`` line of ``mksim compare --impl``: the stack's latency and interval, the
    megakernel's speed-up over it with its interval and verdict ("tie" where the interval holds 1)."""
    line = (f"stack {st['impl']}: its kernels in one CUDA graph on {st['gpu']}: {st['latency_us']:.1f} µs"
            f"{_span(st.get('interval_us'))}")
    if st["megakernel_speedup"]:
        v = st.get("verdict") or ""
        say = ("a tie: the interval holds 1" if v == "tie" else
               f"the megakernel is {'faster' if v.startswith('faster') else 'slower'}"
               + (" (interval unknown)" if "unknown" in v else ""))
        line += (f"; the megakernel above: {st['megakernel_speedup']:.2f}×"
                 f"{_span(st.get('speedup_interval'), '.2f', '×')}, {say}")
    basis = st.get("interval")
    tail = ""
    if basis:
        tail = ("; stack interval unknown" if basis["half_width_pct"] is None else
                f"; stack ± {basis['half_width_pct']:.1f} % from {basis['cases']} cases"
                + (": a transfer, unvalidated" if basis["transfer"] else ""))
    return line + f" ({st['assumes']['text']}{tail})"


def simulate_line(res: SimResult) -> str:
    """The result in one line, then what it assumes (hardware file, implementation profile)."""
    line = assumes_line(res.gpu)  # empty for a GPU built in code, not from a file
    assumes = "\n" + line if line else ""
    return (f"{res.workload} on {res.gpu}, {res.mode}" + (f" ({res.policy})" if res.policy else "")
            + f": [bold]{res.latency_us:.1f} µs[/bold], {res.tokens_per_s:.0f} tokens/s, HBM {res.hbm_util:.0%}"
            f" (floor {res.bandwidth_floor_us:.1f} µs)" + assumes)


def breakdown_table(res: SimResult) -> Table:
    t = make_table("where the time went (µs, averaged over SMs)", ("category", "µs", "share"), left=("category",))
    for k, v in res.breakdown_us.items():
        t.add_row(k, f"{v:.1f}", f"{v / res.latency_us:.0%}")
    return t


def sweep_table(rows: list[dict[str, Any]], model: str, gpu: str) -> RenderableType:
    """The sweep's latencies (:func:`mksim.report.sweep_rows`), then the modes ``gpu`` lacks and why."""
    cols = ["batch", "kv_len", "stream_us", "graph_us", "graph_pdl_us", "persistent_barrier_us", "megakernel_us",
            "megakernel_speedup_vs_graph_pdl"]
    if rows and "graph_pdl_us" not in rows[0]:  # a GPU without graph_pdl (compare_modes' "absent")
        cols = [c for c in cols if "graph_pdl" not in c]
    t = make_table(f"{model} on {gpu}: latency (µs) by batch and context",
                   [c.replace("_us", "").replace("megakernel_speedup_vs_graph_pdl", "MK vs PDL") for c in cols])
    for r in rows:
        t.add_row(*(str(r[c]) if isinstance(r[c], int) else (f"{r[c]:.2f}×" if "speedup" in c else f"{r[c]:.1f}")
                    for c in cols))
    notes = [assumes_line(gpu), *gpu_absent_lines(gpu)]
    return Group(t, *(Text(n, no_wrap=True) for n in notes if n))


# -- search ---------------------------------------------------------------------------------------
def search_table(res: SearchResult, shape: str | None = None) -> Table:
    """The best schedule and the baselines (:func:`mksim.search.report_rows`), titled by ``shape`` (default
    the step the search says it searched, ``res.shape``); a step split over GPUs adds each row's
    communication (its collective ops' span)."""
    fixed = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in res.fixed.items())
    rows = report_rows(res)
    comm = any("communication_us" in r for r in rows)
    t = make_table(f"{shape or res.shape}{', fixed ' + fixed if fixed else ''}: search ({res.n_complete} complete, "
                   f"{res.n_pruned} pruned trials in study {res.study_name!r})",
                   ("schedule", "latency µs", "smem KiB/SM", "best's speed-up", *["communication µs"] * comm),
                   left=("schedule",))
    for r in rows:
        t.add_row(r["schedule"], f"{r['latency_us']:.1f}", f"{r['smem_KiB']:g}", f"{r['speedup']:.3f}×",
                  *[f"{r['communication_us']:.1f}" if "communication_us" in r else ""] * comm)
    return t


def assumes_line(gpu: str | GPUSpec) -> str:
    """What a prediction on ``gpu`` assumes (:func:`mksim.compare.assumptions`), wrapped at 80 columns;
    empty for a GPU built in code that no file describes."""
    try:
        g = gpu_spec(gpu)
    except hwmodels.HardwareError:
        return ""
    return textwrap.fill(assumptions(g)["text"], TABLE_WIDTH)


def search_lines(res: SearchResult) -> list[str]:
    """The best candidate in words, then the Pareto front if there is one."""
    c = res.best["candidate"]
    lines = [f"best: mode {c['mode']}" + (f", policy {c['policy']} {c['policy_options'] or ''}" if c["policy"] else "")
             + f", options {c['options']}" + (f", grain {c['grain']}" if c["grain"] else "")
             + (f", small ops {c['small_grain']}x" if c["small_grain"] != 1.0 else "")
             + (f", KV splits {c['kv_split_mult']}x" if c["kv_split_mult"] != 1.0 else "")]
    if res.pareto:
        lines.append("Pareto front (latency µs, smem KiB): " + ", ".join(f"({p['latency_us']:.1f}, {p['smem_KiB']:g})"
                                                                         for p in res.pareto))
    return lines


def compare_footer(d: dict[str, Any]) -> str:
    """What ``mksim compare`` says under its table: what the breakdown's columns are, and for a step split
    over GPUs each mode's communication (its collective ops' span) as a share of its step."""
    footer = "breakdown columns: µs of the step, averaged over SMs; they sum to the latency"
    shares = {m: r["communication_share"] for m, r in d["modes"].items() if "communication_share" in r}
    if not shares:
        return footer
    return footer + "\ncommunication (collective ops' span, share of the step): " + ", ".join(
        f"{m} {v:.1%}" for m, v in shares.items())
