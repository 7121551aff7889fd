"""The ``mksim`` command line.

Errors in input (unknown names, bad files, impossible parameters, wrong arguments)
print one line, ``error: ...``, and exit with status 2.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from mksim.errors import MksimError

try:  # typer >= 0.20 vendors click as typer._click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click_exc

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Simulate GPU megakernels and kernel chains.")
hw_app = typer.Typer(no_args_is_help=True, help="Hardware models of GPU generations.")
app.add_typer(hw_app, name="hw")

# Wide enough that tables do not wrap when printed to a pipe or a log file.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# -- hw ------------------------------------------------------------------------------
@hw_app.command("list")
def hw_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the GPU models mksim knows (built-in and calibrated)."""
    import hwmodels

    rows = []
    for name in hwmodels.available():
        g = hwmodels.load(name)
        rows.append({"name": name, "full_name": g.full_name, "architecture": g.architecture,
                     "sms": g.sm.count, "clock_MHz": g.sm.clock_boost_MHz,
                     "bf16_dense_TFLOPs": g.compute.tensor_bf16_dense_TFLOPs,
                     "dram_GBps": g.dram.bandwidth_spec_GBps, "dram_GB": g.dram.capacity_GB,
                     "l2_MiB": g.l2.size_MiB, "dies": g.interconnect.dies_count,
                     "extends": g.extends})
    if as_json:
        return _emit_json(rows)
    t = Table(title="GPU models")
    for col in ("name", "GPU", "arch", "SMs", "clock MHz", "bf16 TFLOP/s", "DRAM GB/s", "DRAM GB",
                "L2 MiB", "dies"):
        t.add_column(col, justify="left" if col in ("name", "GPU", "arch") else "right")
    for r in rows:
        t.add_row(r["name"], r["full_name"], r["architecture"], str(r["sms"]), f"{r['clock_MHz']:g}",
                  f"{r['bf16_dense_TFLOPs']:g}", f"{r['dram_GBps']:g}", f"{r['dram_GB']:g}",
                  f"{r['l2_MiB']:g}", str(r["dies"]))
    out.print(t)


@hw_app.command("show")
def hw_show(name: str = typer.Argument(..., help="GPU name (mksim hw list) or a .toml path."),
            as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show every number of a GPU model with its unit and source."""
    import hwmodels

    g = hwmodels.load(name)
    nums = g.numbers()
    if as_json:
        return _emit_json({
            "name": g.name, "full_name": g.full_name, "vendor": g.vendor, "architecture": g.architecture,
            "extends": g.extends, "path": g.path,
            "numbers": {k: {"value": v, "source": g.provenance.get(k)} for k, v in nums.items()},
            "sources": {s.id: {"kind": s.kind, "title": s.title, "url": s.url, "date": s.date,
                               "note": s.note} for s in g.sources.values()},
        })
    t = Table(title=f"{g.full_name} ({g.name})")
    for col in ("key", "value", "source"):
        t.add_column(col)
    for k, v in nums.items():
        if v is None:
            t.add_row(k, "-", "not on this GPU")
            continue
        s = g.source_of(k)
        t.add_row(k, f"{v:g}", f"{s.kind}: {s.id}")
    out.print(t)
    for s in g.sources.values():
        out.print(f"[bold]{s.id}[/bold] ({s.kind}{', ' + s.date if s.date else ''}): {s.title}"
                  f"{' <' + s.url + '>' if s.url else ''}")


# -- models and workloads ------------------------------------------------------------
@app.command("models")
def models_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the built-in models."""
    from mksim import models

    rows = [dict(models.get(n).to_dict(), params=models.get(n).param_count()) for n in models.names()]
    if as_json:
        return _emit_json(rows)
    t = Table(title="Built-in models")
    for col in ("name", "params", "layers", "hidden", "ffn", "heads", "kv heads", "head dim", "vocab",
                "tied"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for r in rows:
        t.add_row(r["name"], f"{r['params'] / 1e9:.2f} B", str(r["num_layers"]), str(r["hidden_size"]),
                  str(r["intermediate_size"]), str(r["num_heads"]), str(r["num_kv_heads"]),
                  str(r["head_dim"]), str(r["vocab_size"]), "yes" if r["tie_word_embeddings"] else "no")
    out.print(t)


def _workload(model: str, batch: int, kv_len: int, phase: str, prefill_tokens: int, dtype: str,
              n_sms: int):
    from pathlib import Path

    from mksim import models

    params = dict(batch=batch, kv_len=kv_len, phase=phase, prefill_tokens=prefill_tokens,
                  weight_dtype=dtype, n_sms=n_sms)
    if model.endswith(".json") or Path(model).is_file():
        return models.from_hf_config(model, **params)
    return models.workload(model, **params)


@app.command("workload")
def workload_cmd(
    model: str = typer.Option(..., "--model", "-m", help="Built-in model name or a HF config.json."),
    gpu: str = typer.Option("h200", "--gpu", "-g", help="GPU for the bandwidth floor and tiling."),
    batch: int = typer.Option(1, "--batch", "-b", help="Sequences per step."),
    kv_len: int = typer.Option(1024, "--kv-len", help="Tokens already in each sequence's KV cache."),
    phase: str = typer.Option("decode", "--phase", help="decode or prefill."),
    prefill_tokens: int = typer.Option(0, "--prefill-tokens", help="New tokens per sequence (prefill)."),
    dtype: str = typer.Option("bf16", "--dtype", help="Weight dtype: bf16, fp16 or fp8."),
    tasks_per_sm: float = typer.Option(1.0, "--tasks-per-sm", help="Task granularity: tasks per SM per op."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Summarise a workload: bytes, FLOPs, ops, tasks and the bandwidth floor on a GPU."""
    import hwmodels
    from mksim.workload import TaskGraph, Tiling

    g = hwmodels.load(gpu)
    wl = _workload(model, batch, kv_len, phase, prefill_tokens, dtype, g.sm.count)
    graph = TaskGraph(wl, Tiling.for_sms(g.sm.count, tasks_per_sm))
    spec_Bps = g.dram.bandwidth_spec_GBps * 1e9
    summary = wl.summary()
    summary.update(gpu=g.name, tasks=len(graph), task_edges=graph.n_edges(),
                   bandwidth_floor_us=wl.bandwidth_floor_us(spec_Bps),
                   bandwidth_floor_reachable_us=wl.bandwidth_floor_us(g.hbm_bandwidth_Bps),
                   params=wl.model.param_count() if wl.model is not None else None)
    if as_json:
        return _emit_json(summary)
    from mksim._format import si

    t = Table(title=f"{wl.name} on {g.full_name}")
    for col in ("op kind", "ops", "tasks", "weights", "KV cache", "FLOPs"):
        t.add_column(col, justify="left" if col == "op kind" else "right")
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
    out.print(t)
    out.print(f"bytes a step must move: {si(wl.min_dram_bytes, 'B')}; bandwidth floor on {g.name}: "
              f"{summary['bandwidth_floor_us']:.1f} µs at the spec {g.dram.bandwidth_spec_GBps:g} GB/s, "
              f"{summary['bandwidth_floor_reachable_us']:.1f} µs at the reachable "
              f"{g.hbm_bandwidth_Bps / 1e9:.0f} GB/s")


# -- simulation -----------------------------------------------------------------------
def _parse_opts(opts: list[str], flag: str = "--opt") -> dict[str, Any]:
    """``--opt key=value`` pairs as schedule options (numbers parsed)."""
    out: dict[str, Any] = {}
    for item in opts:
        if "=" not in item:
            raise MksimError(f"{flag} takes key=value, got {item!r}")
        k, v = item.split("=", 1)
        for cast in (int, float):
            try:
                out[k] = cast(v)
                break
            except ValueError:
                continue
        else:
            out[k] = {"true": True, "false": False}.get(v.lower(), v)
    return out


def _compare_rows(results: dict[str, Any]) -> dict[str, Any]:
    base = results["stream"].latency_us
    return {mode: {"latency_us": r.latency_us, "tokens_per_s": r.tokens_per_s, "hbm_util": r.hbm_util,
                   "speedup_vs_stream": base / r.latency_us, "policy": r.policy,
                   "breakdown_us": r.breakdown_us}
            for mode, r in results.items()}


# Megakernel designs `mksim compare --designs` adds as rows: name -> [(row, schedule options)]
DESIGN_ROWS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "sentinel": [("megakernel:sentinel", {"sync": "sentinel"})],
    "dynamic": [("megakernel:dynamic", {"dispatch": "dynamic"})],
    "dies": [("megakernel:dies", {"dies": True}), ("megakernel:die", {"dies": True, "policy": "die"})],
    "movement": [("megakernel:native", {"movement": "native"})],
}


def _designs(text: str | None) -> list[str]:
    if not text:
        return []
    names = [d.strip() for d in text.split(",") if d.strip()]
    if names == ["all"]:
        return list(DESIGN_ROWS)
    for d in names:
        if d not in DESIGN_ROWS:
            from mksim.errors import UnknownNameError

            raise UnknownNameError("design", d, [*DESIGN_ROWS, "all"])
    return list(dict.fromkeys(names))


def compare_modes(model: str, gpu: str, batch: int = 1, kv_len: int = 1024, phase: str = "decode",
                  prefill_tokens: int = 0, dtype: str = "bf16", policy: str | None = None,
                  designs: str | None = None, opts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Simulate every mode on one workload; returns ``{"modes": {...}, ...}`` as ``--json`` prints.
    ``opts`` are schedule options of the megakernel row; ``designs`` (``"sentinel,dynamic"``,
    ``"all"``) adds a megakernel row per design (:data:`DESIGN_ROWS`)."""
    import hwmodels
    from mksim.schedule import MODES

    g = hwmodels.load(gpu)
    wl = _workload(model, batch, kv_len, phase, prefill_tokens, dtype, g.sm.count)
    order = sorted(MODES, key=lambda m: m != "megakernel")  # the longest job first: the pool ends sooner
    mk = {**({"policy": policy} if policy else {}), **(opts or {})}
    jobs = [(wl, g, mode, mk if mode == "megakernel" else {}) for mode in order]
    rows = list(order)
    for d in _designs(designs):
        for row, kw in DESIGN_ROWS[d]:
            jobs.append((wl, g, "megakernel", {**mk, **kw}))
            rows.append(row)
    done = dict(zip(rows, _map(_simulate_summary, jobs)))
    results = {m: done[m] for m in [*MODES, *rows[len(order):]]}
    return {"model": model, "gpu": g.name, "workload": wl.name, "batch": batch, "kv_len": kv_len,
            "phase": phase, "bandwidth_floor_us": wl.bandwidth_floor_us(g.dram.bandwidth_spec_GBps * 1e9),
            "modes": _compare_rows(results)}


class _Summary:
    """The part of a SimResult a comparison needs (small to send between processes)."""

    def __init__(self, r: Any):
        self.latency_us, self.tokens_per_s, self.hbm_util = r.latency_us, r.tokens_per_s, r.hbm_util
        self.policy, self.breakdown_us = r.policy, r.breakdown_us


def _simulate_summary(job: tuple) -> _Summary:
    from mksim.schedule import build_schedule
    from mksim.sim import simulate

    wl, g, mode, kw = job
    return _Summary(simulate(build_schedule(wl, g, mode, **kw)))


def _map(fn: Any, jobs: list) -> list:
    """Run independent simulations on the machine's cores (forked workers), else one by one."""
    import multiprocessing as mp
    import os

    workers = min(len(jobs), os.cpu_count() or 1)
    if workers > 1 and "fork" in mp.get_all_start_methods():
        try:
            with mp.get_context("fork").Pool(workers) as pool:
                return pool.map(fn, jobs, chunksize=1)
        except OSError:  # no process support here: fall back to serial
            pass
    return [fn(j) for j in jobs]


@app.command("compare")
def compare_cmd(
    model: str = typer.Option("llama-3.2-1b", "--model", "-m", help="Built-in model name or a HF config.json."),
    gpu: str = typer.Option("h200", "--gpu", "-g", help="GPU name (mksim hw list) or a .toml path."),
    batch: int = typer.Option(1, "--batch", "-b"),
    kv_len: int = typer.Option(1024, "--kv-len"),
    phase: str = typer.Option("decode", "--phase"),
    prefill_tokens: int = typer.Option(0, "--prefill-tokens"),
    dtype: str = typer.Option("bf16", "--dtype"),
    policy: Optional[str] = typer.Option(None, "--policy", help="Megakernel placement policy."),
    opt: list[str] = typer.Option([], "--opt", help="Schedule option key=value of the megakernel rows (repeatable)."),
    designs: Optional[str] = typer.Option(None, "--designs", help="Add a megakernel row per design, comma-separated: "
                                                                  "sentinel, dynamic (or all)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Every execution mode side by side: latency, tokens/s, HBM utilisation, breakdown."""
    from mksim.sim import CATEGORIES

    d = compare_modes(model, gpu, batch, kv_len, phase, prefill_tokens, dtype, policy, designs, _parse_opts(opt))
    if as_json:
        return _emit_json(d)
    t = Table(title=f"{d['workload']} on {d['gpu']} (bandwidth floor {d['bandwidth_floor_us']:.1f} µs)")
    for col in ("mode", "latency µs", "tokens/s", "HBM util", "vs stream", *CATEGORIES):
        t.add_column(col, justify="left" if col == "mode" else "right")
    for mode, row in d["modes"].items():
        label = mode + (f" ({row['policy']})" if row["policy"] and mode.startswith("megakernel") else "")
        t.add_row(label, f"{row['latency_us']:.1f}", f"{row['tokens_per_s']:.0f}", f"{row['hbm_util']:.0%}",
                  f"{row['speedup_vs_stream']:.2f}×", *(f"{row['breakdown_us'][c]:.1f}" for c in CATEGORIES))
    out.print(t)
    out.print("breakdown columns: µs of the step, averaged over SMs; they sum to the latency")


@app.command("simulate")
def simulate_cmd(
    model: str = typer.Option("llama-3.2-1b", "--model", "-m"),
    gpu: str = typer.Option("h200", "--gpu", "-g"),
    mode: str = typer.Option("megakernel", "--mode"),
    policy: Optional[str] = typer.Option(None, "--policy", help="Megakernel placement policy."),
    batch: int = typer.Option(1, "--batch", "-b"),
    kv_len: int = typer.Option(1024, "--kv-len"),
    phase: str = typer.Option("decode", "--phase"),
    prefill_tokens: int = typer.Option(0, "--prefill-tokens"),
    dtype: str = typer.Option("bf16", "--dtype"),
    opt: list[str] = typer.Option([], "--opt", help="Schedule option key=value (repeatable)."),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="Simulate this schedule JSON file."),
    save: Optional[str] = typer.Option(None, "--save", help="Write the schedule as JSON here."),
    trace: Optional[str] = typer.Option(None, "--trace", help="Write a Perfetto (Chrome) trace here."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Simulate one mode (or a schedule file) and show where the time went."""
    import hwmodels
    from mksim.schedule import Schedule, build_schedule
    from mksim.sim import simulate

    if schedule:
        sched = Schedule.from_json(schedule)
    else:
        g = hwmodels.load(gpu)
        wl = _workload(model, batch, kv_len, phase, prefill_tokens, dtype, g.sm.count)
        opts = _parse_opts(opt)
        if "policy" in opts:  # --opt policy=die is --policy die
            if policy and opts["policy"] != policy:
                raise MksimError(f"two policies: --policy {policy} and --opt policy={opts['policy']}; give one")
            policy = opts.pop("policy")
        sched = build_schedule(wl, g, mode, policy=policy, **opts)
    if save:
        sched.to_json(save)
    res = simulate(sched)
    if trace:
        res.to_perfetto(trace)
    if as_json:
        return _emit_json(res.to_dict())
    out.print(f"{res.workload} on {res.gpu}, {res.mode}" + (f" ({res.policy})" if res.policy else "")
              + f": [bold]{res.latency_us:.1f} µs[/bold], {res.tokens_per_s:.0f} tokens/s, HBM {res.hbm_util:.0%}"
              f" (floor {res.bandwidth_floor_us:.1f} µs)")
    t = Table(title="where the time went (µs, averaged over SMs)")
    t.add_column("category")
    t.add_column("µs", justify="right")
    t.add_column("share", justify="right")
    for k, v in res.breakdown_us.items():
        t.add_row(k, f"{v:.1f}", f"{v / res.latency_us:.0%}")
    out.print(t)
    if trace:
        out.print(f"trace written to {trace} (open in https://ui.perfetto.dev)")


@app.command("sweep")
def sweep_cmd(
    model: str = typer.Option("llama-3.2-1b", "--model", "-m"),
    gpu: str = typer.Option("h200", "--gpu", "-g"),
    batch: str = typer.Option("1,2,4,8,16,32,64", "--batch", "-b", help="Comma-separated batch sizes."),
    kv_len: str = typer.Option("1024", "--kv-len", help="Comma-separated KV lengths."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    html: Optional[str] = typer.Option(None, "--html", help="Write a plotly chart here."),
) -> None:
    """Each mode's latency and the megakernel's speed-up over graph_pdl as batch (or context) grows."""
    def ints(text: str, what: str) -> list[int]:
        try:
            vals = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise MksimError(f"--{what} takes comma-separated integers, got {text!r}") from None
        if not vals:
            raise MksimError(f"--{what} needs at least one value")
        return vals

    rows = []
    for b in ints(batch, "batch"):
        for kv in ints(kv_len, "kv-len"):
            d = compare_modes(model, gpu, b, kv)
            m = d["modes"]
            rows.append({"batch": b, "kv_len": kv, **{f"{k}_us": v["latency_us"] for k, v in m.items()},
                         "megakernel_speedup_vs_graph_pdl": m["graph_pdl"]["latency_us"] / m["megakernel"]["latency_us"]})
    if html:
        from mksim.report import sweep_figure_html

        sweep_figure_html(rows, model, gpu, html)
    if as_json:
        return _emit_json({"model": model, "gpu": gpu, "rows": rows})
    t = Table(title=f"{model} on {gpu}: latency (µs) by batch and context")
    cols = ["batch", "kv_len", "stream_us", "graph_us", "graph_pdl_us", "persistent_barrier_us", "megakernel_us",
            "megakernel_speedup_vs_graph_pdl"]
    for c in cols:
        t.add_column(c.replace("_us", "").replace("megakernel_speedup_vs_graph_pdl", "MK vs PDL"), justify="right")
    for r in rows:
        t.add_row(*(str(r[c]) if isinstance(r[c], int) else (f"{r[c]:.2f}×" if "speedup" in c else f"{r[c]:.1f}")
                    for c in cols))
    out.print(t)


# -- search --------------------------------------------------------------------------------
@app.command("search")
def search_cmd(
    model: str = typer.Option("llama-3.2-1b", "--model", "-m"),
    gpu: str = typer.Option("h200", "--gpu", "-g"),
    batch: int = typer.Option(1, "--batch", "-b"),
    kv_len: int = typer.Option(1024, "--kv-len"),
    trials: int = typer.Option(100, "--trials", help="Finished trials the study should hold (baselines included)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Stop this run after so many seconds."),
    seed: int = typer.Option(0, "--seed"),
    storage: Optional[str] = typer.Option(None, "--storage",
                                          help="Optuna RDB URL (default: sqlite:///<study>.db here); a "
                                               "postgresql:// URL lets several machines fill one study; 'memory' "
                                               "keeps nothing."),
    study: Optional[str] = typer.Option(None, "--study", help="Study name (default: from model, GPU, shape)."),
    objective: str = typer.Option("latency", "--objective", help="'latency' or 'latency,smem' (Pareto front)."),
    workers: int = typer.Option(1, "--workers", "-j", help="Worker processes on this machine."),
    out_file: Optional[str] = typer.Option(None, "--out", "-o", help="Write the best schedule (JSON) here."),
    report: Optional[str] = typer.Option(None, "--report", help="Write an HTML report with Optuna's figures."),
    fix: list[str] = typer.Option([], "--fix", help="Fix a schedule option for every candidate, key=value "
                                                    "(repeatable), e.g. smem_reserve_KiB=80; recorded in the study."),
    designs: Optional[str] = typer.Option(None, "--designs", help="Add megakernel designs to the space, "
                                                                  "comma-separated: sentinel, dynamic, dies, "
                                                                  "movement (or all)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Search megakernel schedules with Optuna; report the best against every baseline."""
    from mksim.search import search

    res = search(model, gpu, batch=batch, kv_len=kv_len, trials=trials, timeout=timeout, seed=seed,
                 storage=storage, study_name=study, objectives=objective, workers=workers, out=out_file,
                 report=report, progress=not as_json and sys.stderr.isatty(), fixed=_parse_opts(fix, "--fix"),
                 designs=designs)
    if as_json:
        return _emit_json(res.to_dict())
    from mksim.search._report import report_rows

    fixed = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in res.fixed.items())
    t = Table(title=f"{model} on {gpu}, batch {batch}, KV {kv_len}{', fixed ' + fixed if fixed else ''}: search "
                    f"({res.n_complete} complete, {res.n_pruned} pruned trials in study {res.study_name!r})")
    for col in ("schedule", "latency µs", "smem KiB/SM", "best's speed-up"):
        t.add_column(col, justify="left" if col == "schedule" else "right")
    for r in report_rows(res):
        t.add_row(r["schedule"], f"{r['latency_us']:.1f}", f"{r['smem_KiB']:g}", f"{r['speedup']:.3f}×")
    out.print(t)
    c = res.best["candidate"]
    out.print(f"best: mode {c['mode']}" + (f", policy {c['policy']} {c['policy_options'] or ''}" if c["policy"] else "")
              + f", options {c['options']}" + (f", grain {c['grain']}" if c["grain"] else "")
              + (f", small ops {c['small_grain']}x" if c["small_grain"] != 1.0 else "")
              + (f", KV splits {c['kv_split_mult']}x" if c["kv_split_mult"] != 1.0 else ""))
    if res.pareto:
        out.print("Pareto front (latency µs, smem KiB): " + ", ".join(f"({p['latency_us']:.1f}, {p['smem_KiB']:g})"
                                                                        for p in res.pareto))
    if out_file:
        out.print(f"best schedule written to {out_file} (mksim simulate --schedule {out_file})")
    if report:
        out.print(f"report written to {report}")


# -- calibration -------------------------------------------------------------------------
@app.command("calibrate")
def calibrate_cmd(
    out_file: Optional[str] = typer.Option(None, "--out", "-o",
                                           help="Overlay to write (default ./<gpu>-calibrated.toml); raw results "
                                                "and plots go beside it."),
    quick: bool = typer.Option(False, "--quick", help="Fewer sizes and repeats (about a minute)."),
    base: Optional[str] = typer.Option(None, "--base", help="Built-in model to extend (default: from the GPU's name)."),
    from_raw: Optional[list[str]] = typer.Option(None, "--from-raw",
                                                 help="Fit saved .raw.json results instead of measuring (repeat the "
                                                      "option to merge runs); needs no GPU."),
    results: Optional[str] = typer.Option(None, "--results",
                                          help="Folder for the fits summary and plots (default: beside --out)."),
    as_json: bool = typer.Option(False, "--json", help="Print the fitted parameters as JSON."),
) -> None:
    """Measure this GPU with microbenchmarks and write a calibrated hardware model."""
    from pathlib import Path

    import validation.calibrate as cal

    say = (lambda _msg: None) if as_json else (lambda msg: out.print(msg))
    if from_raw:
        if not out_file:
            raise MksimError("--from-raw needs --out FILE.toml for the overlay it writes")
        ps, spread = cal.finish([Path(p) for p in from_raw], Path(out_file), base=base,
                                results_dir=Path(results) if results else None, say=say)
    else:
        ps, spread = cal.calibrate(Path(out_file) if out_file else None, quick=quick, base=base, say=say)
    if as_json:
        return _emit_json({"params": {p.key: {"value": p.value, "spread": p.spread, "note": p.note} for p in ps},
                           "run_to_run": spread})
    t = Table(title="calibrated parameters")
    for col in ("key", "value", "spread", "run-to-run"):
        t.add_column(col, justify="left" if col == "key" else "right")
    for p in ps:
        t.add_row(p.key, f"{p.value:g}", f"{p.spread:.1%}", f"{spread[p.key]:.1%}" if p.key in spread else "-")
    out.print(t)


# -- validation on the GPU --------------------------------------------------------------------
validate_app = typer.Typer(no_args_is_help=True, help="Run schedules on this machine's GPU and hold them against "
                                                       "their predictions (one case, the suite, its report).")
app.add_typer(validate_app, name="validate")
_PRED_GPU = "h200-mk-kernels"


def _say(msg: str) -> None:
    out.print(msg, markup=False)
    sys.stdout.flush()


def _check_out(out_dir: str, resume: bool, force: bool) -> None:
    from pathlib import Path

    from validation.suite import MEASURED

    if (Path(out_dir) / MEASURED).is_file() and not (resume or force):
        raise MksimError(f"{Path(out_dir) / MEASURED} exists; --resume to go on with it or --force to start over")


def _case_line(r: dict[str, Any]) -> str:
    def f(v: Any, fmt: str, unit: str = "") -> str:
        return "-" if v is None else f"{format(v, fmt)}{unit}"

    return (f"{r['name']}: predicted {f(r['predicted_us'], '.1f', ' µs')}, measured {f(r['measured_us'], '.1f', ' µs')}"
            f" (p10-p90 {f(r['measured_spread_us'], '.1f', ' µs')}), error {f(r['error_pct'], '+.1f', ' %')}, "
            f"max rel err {f(r['max_rel_err'], '.1e')}"
            + (f", {r['achieved_GBps'] / 1e3:.2f} TB/s ({r['bandwidth_fraction']:.0%} of HBM read)"
               if r.get("achieved_GBps") else "") + (" [WRONG OUTPUT]" if r.get("correct") is False else ""))


def _dry_run(cases: list, gpu: str, as_json: bool) -> None:
    """Build and predict every case, on the CPU: what a GPU run would run."""
    import validation.suite as vs

    rows = []
    for c in cases:
        row: dict[str, Any] = {"name": c.name, "predicted_us": None, "error": None}
        try:
            sched = vs.build(c, gpu)
            o = sched.options
            row.update(predicted_us=vs.predicted_us(sched), smem_reserve_KiB=o.smem_reserve_KiB,
                       prefetch=f"{o.prefetch_depth}x{o.page_KiB:g} KiB", policy=sched.policy)
        except MksimError as exc:
            row["error"] = str(exc)
        rows.append(row)
    if as_json:
        return _emit_json(rows)
    t = Table(title=f"validation cases (dry run: predictions by {gpu}, nothing measured)")
    for col in ("case", "predicted µs", "reserve KiB", "pages", "policy"):
        t.add_column(col, justify="left" if col in ("case", "policy") else "right")
    for r in rows:
        if r["error"]:
            t.add_row(r["name"], "-", "-", "-", f"error: {r['error']}")
        else:
            t.add_row(r["name"], f"{r['predicted_us']:.1f}", f"{r['smem_reserve_KiB']:g}", r["prefetch"],
                      r["policy"] or "-")
    out.print(t)


@validate_app.callback(invoke_without_command=True)
def validate_cmd(
    ctx: typer.Context,
    schedule: Optional[str] = typer.Option(None, "--schedule", help="Run this schedule JSON file."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Built-in model (with --mode)."),
    mode: Optional[str] = typer.Option(None, "--mode", help="stream, graph, graph_pdl, persistent_barrier, megakernel."),
    batch: int = typer.Option(1, "--batch", "-b"),
    kv_len: int = typer.Option(1024, "--kv-len"),
    policy: Optional[str] = typer.Option(None, "--policy", help="Megakernel placement policy."),
    out_dir: Optional[str] = typer.Option(None, "--out", help="Write measured.json, summary.json, sources here."),
    reps: int = typer.Option(20, "--reps", help="Timed runs (median and p10-p90 reported)."),
    watchdog_s: float = typer.Option(60.0, "--watchdog-s", help="A kernel still running after this is an error."),
    gpu: str = typer.Option(_PRED_GPU, "--gpu", help="Hardware model the prediction comes from."),
    force: bool = typer.Option(False, "--force", help="Overwrite the measured.json in --out."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Build and predict only (no GPU)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run one schedule on this machine's GPU: its output checked against torch, its time against
    the prediction. Subcommands: suite, report, schedules."""
    try:
        from typer._click.core import ParameterSource
    except ImportError:  # pragma: no cover - older typer uses click itself
        from click.core import ParameterSource

    if ctx.invoked_subcommand is not None:
        given = [p.opts[0] for p in ctx.command.params
                 if ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE]
        if given:
            raise MksimError(f"{given[0]} goes after the subcommand: mksim validate {ctx.invoked_subcommand} "
                             f"{given[0]} ...")
        return
    from pathlib import Path

    import validation.suite as vs
    from mksim import models
    from mksim.errors import UnknownNameError
    from mksim.schedule import MODES, Schedule

    if schedule and (model or mode or policy):
        raise MksimError("give --schedule FILE, or --model NAME --mode MODE, not both")
    if schedule:
        s = Schedule.from_json(schedule)
        name = s.workload_spec["model"] if isinstance(s.workload_spec["model"], str) else "custom"
        case = vs.Case(name, s.workload.batch, s.mode, Path(schedule).stem, s.workload.kv_len, schedule_file=schedule)
    elif model and mode:
        if mode not in MODES:
            raise UnknownNameError("mode", mode, MODES)
        models.get(model)
        case = vs.Case(model, batch, mode, policy or "default", kv_len, policy=policy)
    else:
        raise MksimError("give --schedule FILE, or --model NAME and --mode MODE (or a subcommand: suite, report, "
                         "schedules)")
    vs.build(case, gpu)  # a schedule that cannot be built: one line, before any GPU work
    if dry_run:
        return _dry_run([case], gpu, as_json)
    if out_dir:
        _check_out(out_dir, False, force)
        vs.run_suite([case], out_dir, reps=reps, watchdog_s=watchdog_s, gpu=gpu)
        row = vs.write_summary(out_dir, gpu)["summary"]["cases"][0]
    else:
        rec = vs.run_case(case, vs._real_measure(), reps=reps, watchdog_s=watchdog_s, gpu=gpu)
        row = vs.summarize({"cases": [rec]}, gpu)["cases"][0]
    if row["error"]:
        raise MksimError(f"{case.name}: {row['error']}")
    if as_json:
        return _emit_json(row)
    _say(_case_line(row))


@validate_app.command("suite")
def validate_suite_cmd(
    out_dir: Optional[str] = typer.Option(None, "--out", help="Results folder (default validation/results/h200)."),
    only: list[str] = typer.Option([], "--only", help="Run the cases whose name contains this (repeatable)."),
    reps: int = typer.Option(20, "--reps", help="Timed runs per case."),
    watchdog_s: float = typer.Option(60.0, "--watchdog-s", help="A kernel still running after this is an error."),
    gpu: str = typer.Option(_PRED_GPU, "--gpu", help="Hardware model the predictions come from."),
    resume: bool = typer.Option(False, "--resume", help="Keep the cases an earlier run in --out measured."),
    force: bool = typer.Option(False, "--force", help="Start over, replacing measured.json in --out."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the cases with their predictions (no GPU)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run the standard suite in one process, then write summary.json, plots and a markdown table."""
    import validation.suite as vs

    cases = vs.select(vs.CASES, only)
    if dry_run:
        return _dry_run(cases, gpu, as_json)
    out_dir = out_dir or str(vs.RESULTS)
    _check_out(out_dir, resume, force)
    vs.run_suite(cases, out_dir, reps=reps, watchdog_s=watchdog_s, gpu=gpu, resume=resume,
                 say=(lambda _m: None) if as_json else _say)
    _report(out_dir, gpu, None, None, as_json)


def _report(measured_dir: str, gpu: str, out_dir: Optional[str], docs: Optional[str], as_json: bool) -> None:
    import validation.suite as vs

    res = vs.write_summary(measured_dir, gpu, out_dir)
    changed = vs.splice_docs(docs, vs.markdown_table(res["summary"])) if docs else False
    if as_json:
        return _emit_json(res["summary"])
    sys.stdout.write(vs.markdown_table(res["summary"]))
    _say("wrote " + ", ".join(str(p) for p in res["files"])
         + (f"; table put in {docs}" if changed else (f"; {docs} already current" if docs else "")))


@validate_app.command("report")
def validate_report_cmd(
    measured_dir: str = typer.Argument(..., help="Folder with the measured.json of a run."),
    gpu: str = typer.Option(_PRED_GPU, "--gpu", help="Hardware model the predictions come from."),
    out_dir: Optional[str] = typer.Option(None, "--out", help="Where summary.json, plots, table.md go (default: "
                                                              "the folder)."),
    docs: Optional[str] = typer.Option(None, "--docs", help="Also put the table in this page, between its markers."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Predict again (CPU only) and rebuild summary.json, plots and the markdown table of a run."""
    _report(measured_dir, gpu, out_dir, docs, as_json)


@validate_app.command("schedules")
def validate_schedules_cmd(
    only: list[str] = typer.Option([], "--only", help="Models and batches whose name (llama-3.2-1b/b1) contains "
                                                      "this (repeatable)."),
    trials: int = typer.Option(200, "--trials"),
    seed: int = typer.Option(0, "--seed"),
    storage: str = typer.Option("memory", "--storage", help="Optuna storage URL; 'memory' keeps nothing."),
    workers: int = typer.Option(1, "--workers", "-j"),
    out_dir: Optional[str] = typer.Option(None, "--out", help="Folder (default validation/schedules)."),
    gpu: str = typer.Option(_PRED_GPU, "--gpu"),
) -> None:
    """Search the suite's megakernel schedules with the kernel's options fixed, and store them."""
    from validation.suite_schedules import SCHEDULES, search_schedules

    search_schedules(only, trials=trials, seed=seed, storage=storage, workers=workers, out_dir=out_dir or SCHEDULES,
                     gpu=gpu, say=_say)


# -- entry point ---------------------------------------------------------------------
@app.command("explore")
def explore_cmd(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8050, "--port", help="Port to listen on."),
    debug: bool = typer.Option(False, "--debug", help="Dash debug mode (reloads on code changes)."),
) -> None:
    """Start the web explorer (Compare, Timeline, Search, Validation, Hardware) at http://HOST:PORT/."""
    try:
        import dash  # noqa: F401
        import plotly  # noqa: F401
    except ImportError:
        raise MksimError("the explorer needs Dash: python -m pip install -c constraints.txt -e '.[explorer]'") from None
    from explorer.app import create_app

    out.print(f"mksim explorer at http://{host}:{port}/ (Ctrl-C stops it)")
    create_app().run(host=host, port=port, debug=debug)


def main(argv: Optional[list[str]] = None) -> None:
    """Run the CLI; input errors become one line on stderr and exit status 2."""
    cmd = typer.main.get_command(app)
    try:
        rv = cmd.main(args=argv, prog_name="mksim", standalone_mode=False)
    except MksimError as exc:
        _fail(str(exc))
    except click_exc.NoArgsIsHelpError as exc:  # help printed by click
        sys.stdout.write((exc.ctx.get_help() if exc.ctx else "") + "\n")
        sys.exit(0)
    except click_exc.UsageError as exc:
        hint = f"; see '{exc.ctx.command_path} --help'" if exc.ctx else ""
        _fail(exc.format_message().replace("\n", " ") + hint)
    except click_exc.ClickException as exc:
        _fail(exc.format_message().replace("\n", " "))
    except BrokenPipeError:  # output piped into `head`: not an error
        sys.exit(0)
    except KeyboardInterrupt:
        _fail("interrupted")
    sys.exit(rv if isinstance(rv, int) else 0)


def _fail(msg: str) -> None:
    sys.stderr.write(f"error: {msg}\n")
    sys.exit(2)


if __name__ == "__main__":
    main()
