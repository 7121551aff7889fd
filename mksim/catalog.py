"""What mksim knows, as ``mksim hw list``, ``mksim hw show`` and ``mksim models`` print it: the GPU models
and the built-in models (:mod:`mksim.tables` has the tables of predictions). Data first: :func:`gpu_rows`
and :func:`gpu_numbers` are what ``--json`` prints; the ``*_table`` functions draw them as rich tables.

Apart from :mod:`mksim.tables` because these commands need neither numpy nor the simulator.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from hwmodels import GPUSpec
from mksim.console import make_table
from mksim.target import GPUS, gpu_spec

__all__ = ["gpu_numbers", "gpu_numbers_table", "gpu_rows", "gpu_table", "models_table", "source_lines"]


# -- hw --------------------------------------------------------------------------------------
def gpu_rows() -> list[dict[str, Any]]:
    """One summary row per known GPU model (``mksim hw list --json``)."""
    rows = []
    for name in GPUS:
        g = gpu_spec(name)
        rows.append({"name": name, "full_name": g.full_name, "architecture": g.architecture,
                     "sms": g.sm.count, "clock_MHz": g.sm.clock_boost_MHz,
                     "bf16_dense_TFLOPs": g.compute.tensor_bf16_dense_TFLOPs,
                     "dram_GBps": g.dram.bandwidth_spec_GBps, "dram_GB": g.dram.capacity_GB,
                     "l2_MiB": g.l2.size_MiB, "dies": g.interconnect.dies_count,
                     "extends": g.extends})
    return rows


def gpu_table(rows: list[dict[str, Any]]) -> Table:
    t = make_table("GPU models", ("name", "GPU", "arch", "SMs", "clock MHz", "bf16 TFLOP/s", "DRAM GB/s", "DRAM GB",
                                  "L2 MiB", "dies"), left=("name", "GPU", "arch"))
    for r in rows:
        t.add_row(r["name"], r["full_name"], r["architecture"], str(r["sms"]), f"{r['clock_MHz']:g}",
                  f"{r['bf16_dense_TFLOPs']:g}", f"{r['dram_GBps']:g}", f"{r['dram_GB']:g}",
                  f"{r['l2_MiB']:g}", str(r["dies"]))
    return t


def gpu_numbers(g: GPUSpec) -> dict[str, Any]:
    """Every number of a GPU model with its source, and the sources (``mksim hw show --json``)."""
    return {
        "name": g.name, "full_name": g.full_name, "vendor": g.vendor, "architecture": g.architecture,
        "extends": g.extends, "path": g.path,
        "numbers": {k: {"value": v, "source": g.provenance.get(k)} for k, v in g.numbers().items()},
        "sources": {s.id: {"kind": s.kind, "title": s.title, "url": s.url, "date": s.date,
                           "note": s.note} for s in g.sources.values()},
    }


def gpu_numbers_table(g: GPUSpec) -> Table:
    t = make_table(f"{g.full_name} ({g.name})", ("key", "value", "source"), left=("key", "value", "source"))
    for k, v in g.numbers().items():
        if v is None:
            t.add_row(k, "-", "not on this GPU")
            continue
        s = g.source_of(k)
        t.add_row(k, f"{v:g}", f"{s.kind}: {s.id}")
    return t


def source_lines(g: GPUSpec) -> list[str]:
    """One line (rich markup) per source of a GPU model."""
    return [f"[bold]{s.id}[/bold] ({s.kind}{', ' + s.date if s.date else ''}): {s.title}"
            f"{' <' + s.url + '>' if s.url else ''}" for s in g.sources.values()]


# -- models ----------------------------------------------------------------------------------
def models_table(rows: list[dict[str, Any]]) -> Table:
    t = make_table("Built-in models", ("name", "params", "layers", "hidden", "ffn", "heads", "kv heads", "head dim",
                                       "vocab", "tied"), left=("name",))
    for r in rows:
        t.add_row(r["name"], f"{r['params'] / 1e9:.2f} B", str(r["num_layers"]), str(r["hidden_size"]),
                  str(r["intermediate_size"]), str(r["num_heads"]), str(r["num_kv_heads"]),
                  str(r["head_dim"]), str(r["vocab_size"]), "yes" if r["tie_word_embeddings"] else "no")
    return t
