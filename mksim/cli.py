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


# -- entry point ---------------------------------------------------------------------
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
